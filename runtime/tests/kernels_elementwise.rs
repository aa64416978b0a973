//! RmsNorm, SkipRmsNorm, Rope and SwiGlu kernels against the reference evaluator's fused ops on
//! every path this CPU runs.
//!
//! Tolerances: norms within `(d/2 + 4)·ε·|y|` (f32 sum of squares against f64); the residual
//! sum, Rope and SwiGlu bit-exact (SwiGlu on every path: one pinned `exp`, `ir::pinned_gate`).

mod kernel_support;

use ir::{Attr, Domain};
use kernel_support::*;
use proptest::prelude::*;
use runtime::kernels::norm::{rms_norm, skip_rms_norm, skip_rms_norm_in_place};
use runtime::kernels::rope::rope_in_place;
use runtime::kernels::swiglu::{swiglu, swiglu_packed_rows};
use runtime::kernels::Isa;

fn available() -> Vec<Isa> {
    Isa::ALL.into_iter().filter(|i| i.is_available()).collect()
}

fn norm_tol(d: usize, want: &[f32]) -> Vec<f32> {
    want.iter().map(|&w| ((d as f32 / 2.0 + 4.0) * f32::EPSILON * w.abs()) + 1e-30).collect()
}

fn check_norms(rows: usize, d: usize, skip_rows: usize, with_bias: bool, seed: u64, isas: &[Isa]) {
    let mut rng = kernel_support::Rng::new(seed);
    let x = rng.f32s(rows * d, -3.0, 3.0);
    let skip = rng.f32s(skip_rows * d, -3.0, 3.0);
    let gamma = rng.f32s(d, -2.0, 2.0);
    let bias = rng.f32s(d, -0.5, 0.5);
    let eps = 1e-6f32;
    let at = attrs(&[("epsilon", Attr::Float(eps))]);
    let xt = f32t(&[rows, d], &x);
    let want = f32s(&reference(Domain::Npuc, "RmsNorm", &at, &[Some(&xt), Some(&f32t(&[d], &gamma))], 1)[0]);
    let tol = norm_tol(d, &want);
    // The reference takes x as [1, rows, d] and a skip that broadcasts over it.
    let x3 = f32t(&[rows / skip_rows, skip_rows, d], &x);
    let skip_t = if skip_rows == rows { f32t(&[1, rows, d], &skip) } else { f32t(&[skip_rows, d], &skip) };
    let bias_t = f32t(&[d], &bias);
    let gamma_t = f32t(&[d], &gamma);
    let mut inputs = vec![Some(&x3), Some(&skip_t), Some(&gamma_t)];
    if with_bias {
        inputs.push(Some(&bias_t));
    }
    let skip_ref = reference(Domain::Npuc, "SkipRmsNorm", &at, &inputs, 2);
    let (want_y, want_s) = (f32s(&skip_ref[0]), f32s(&skip_ref[1]));
    let skip_tol = norm_tol(d, &want_y);
    let b = with_bias.then_some(&bias[..]);
    for &isa in isas {
        let what = format!("rows {rows} d {d} skip rows {skip_rows} bias {with_bias} {isa}");
        let mut y = vec![f32::NAN; rows * d];
        rms_norm(isa, &x, &gamma, eps, &mut y);
        assert_within(&format!("RmsNorm {what}"), &y, &want, |i| tol[i]);
        let mut sum = vec![f32::NAN; rows * d];
        skip_rms_norm(isa, &x, &skip, &gamma, b, eps, &mut y, &mut sum);
        assert_within(&format!("SkipRmsNorm y {what}"), &y, &want_y, |i| skip_tol[i]);
        assert_bits(&format!("SkipRmsNorm sum {what}"), &sum, &want_s);
        let mut residual = x.clone();
        skip_rms_norm_in_place(isa, &mut residual, &skip, &gamma, b, eps, &mut y);
        assert_bits(&format!("SkipRmsNorm in place sum {what}"), &residual, &want_s);
        assert_within(&format!("SkipRmsNorm in place y {what}"), &y, &want_y, |i| skip_tol[i]);
    }
}

#[test]
fn norms_match_the_reference_on_every_path() {
    let isas = isas("norms");
    let mut seed = 900;
    for &(rows, d) in &[(1, 576), (3, 1024), (17, 33), (2, 1), (5, 100), (1, 15)] {
        for with_bias in [false, true] {
            seed += 1;
            check_norms(rows, d, rows, with_bias, seed, &isas);
        }
    }
    // A [S, hidden] skip under a [B, S, hidden] input.
    check_norms(6, 40, 3, true, 990, &isas);
}

#[allow(clippy::too_many_arguments)]
fn check_rope(b: usize, h: usize, s: usize, d: usize, interleaved: bool, seq_major: bool, seed: u64, isas: &[Isa]) {
    let mut rng = kernel_support::Rng::new(seed);
    let x = rng.f32s(b * h * s * d, -2.0, 2.0);
    let cos = rng.f32s(s * d, -1.0, 1.0);
    let sin = rng.f32s(s * d, -1.0, 1.0);
    let at = attrs(&[("interleaved", Attr::Int(interleaved as i64))]);
    // [B, H, S, D] with cos [S, D], or [B, S, H, D] with cos [S, 1, D].
    let (xshape, cshape, per_cos) =
        if seq_major { (vec![b, s, h, d], vec![s, 1, d], h) } else { (vec![b, h, s, d], vec![s, d], 1) };
    let want = f32s(
        &reference(
            Domain::Npuc,
            "Rope",
            &at,
            &[Some(&f32t(&xshape, &x)), Some(&f32t(&cshape, &cos)), Some(&f32t(&cshape, &sin))],
            1,
        )[0],
    );
    for &isa in isas {
        let mut got = x.clone();
        rope_in_place(isa, &mut got, d, &cos, &sin, per_cos, interleaved);
        assert_bits(&format!("Rope {xshape:?} interleaved {interleaved} {isa}"), &got, &want);
    }
}

#[test]
fn rope_is_bit_exact_on_every_path() {
    let isas = isas("rope");
    let mut seed = 1000;
    for &(b, h, s, d) in &[(1, 9, 1, 64), (1, 3, 5, 64), (2, 2, 3, 128), (1, 1, 2, 2), (1, 2, 3, 18), (1, 4, 7, 34)] {
        for interleaved in [false, true] {
            for seq_major in [false, true] {
                seed += 1;
                check_rope(b, h, s, d, interleaved, seq_major, seed, &isas);
            }
        }
    }
}

fn check_swiglu(len: usize, spread: f32, seed: u64, isas: &[Isa]) {
    let mut rng = kernel_support::Rng::new(seed);
    let mut g = rng.f32s(len, -spread, spread);
    if len > 4 {
        g[0] = 0.0;
        g[1] = -100.0;
        g[2] = 100.0;
        g[3] = -87.5;
    }
    let u = rng.f32s(len, -3.0, 3.0);
    let want = f32s(
        &reference(Domain::Npuc, "SwiGlu", &Default::default(), &[Some(&f32t(&[len], &g)), Some(&f32t(&[len], &u))], 1)
            [0],
    );
    for &isa in isas {
        let mut y = vec![f32::NAN; len];
        swiglu(isa, &g, &u, &mut y);
        assert_bits(&format!("SwiGlu len {len} {isa}"), &y, &want);
    }
}

#[test]
fn swiglu_matches_the_reference_on_every_path() {
    let isas = isas("swiglu");
    for (i, &len) in [1usize, 7, 8, 15, 16, 17, 100, 1536, 3072].iter().enumerate() {
        check_swiglu(len, 12.0, 1100 + i as u64, &isas);
        check_swiglu(len, 90.0, 1200 + i as u64, &isas);
    }
}

#[test]
fn swiglu_over_packed_gate_up_rows_splits_each_row() {
    let mut rng = kernel_support::Rng::new(77);
    let (rows, width) = (3, 20);
    let gu = rng.f32s(rows * 2 * width, -4.0, 4.0);
    let mut packed = vec![0f32; rows * width];
    swiglu_packed_rows(Isa::detect(), &gu, width, &mut packed);
    for r in 0..rows {
        let mut one = vec![0f32; width];
        let row = &gu[r * 2 * width..(r + 1) * 2 * width];
        swiglu(Isa::detect(), &row[..width], &row[width..], &mut one);
        assert_bits("packed rows", &packed[r * width..(r + 1) * width], &one);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_norm_shapes(rows in 1usize..12, d in 1usize..300, bias in any::<bool>(), seed in any::<u64>()) {
        check_norms(rows, d, rows, bias, seed, &available());
    }

    #[test]
    fn random_rope_shapes(
        b in 1usize..3,
        h in 1usize..5,
        s in 1usize..6,
        half in 1usize..70,
        interleaved in any::<bool>(),
        seq_major in any::<bool>(),
        seed in any::<u64>(),
    ) {
        check_rope(b, h, s, 2 * half, interleaved, seq_major, seed, &available());
    }

    #[test]
    fn random_swiglu_lengths(len in 1usize..2000, seed in any::<u64>()) {
        check_swiglu(len, 20.0, seed, &available());
    }
}

//! The RmsNorm core code (`qkernels::rms_norm`), executed from its text by the interpreter,
//! equals `ir::pinned_norm`'s definition — the order the host kernels follow on every
//! instruction set — bit for bit: rows spread over many binades, rows whose squares are
//! subnormal or overflow, a NaN, a row of zeros (with ε = 0 too: 0·∞), rows whose sum shows the
//! order of the lanes, and scales γ down to subnormals. The aligned inverse rms
//! (`qkernels::inverse_rms`) equals `InverseRms{squares="aligned"}`'s definition the same way.
//! MLIR 22 verifies the functions' text.

mod common;

use codegen_aie::qkernels::{inverse_rms, rms_norm, NormShape, NORM_LANES};
use codegen_aie::{interp, mlir};
use common::xorshift;
use ir::pinned_norm::{aligned_sum_squares, inverse_root, rms_norm_row, ALIGNED_MAX_D};

/// A value in ±[1, 2)·2^e, e uniform in `-spread..spread`, from the bits `x`.
fn spread(x: u64, spread: i32) -> f32 {
    let m = 1.0 + (x >> 40) as f32 / (1u64 << 24) as f32;
    let e = (x % (2 * spread as u64)) as i32 - spread;
    if x & (1 << 20) == 0 {
        m * 2f32.powi(e)
    } else {
        -m * 2f32.powi(e)
    }
}

/// Rows of `d`: few binades, many, tiny, huge, with a NaN, zeros, mean squares near ε, lane 0
/// only, and 2¹² in lane 0 with ones in lanes 1 and 17 (2²⁴ + 2 only when the ones meet first).
fn rows(d: usize, seed: u64) -> Vec<Vec<f32>> {
    let mut r = xorshift(seed);
    let mut row = |s: i32, scale: f32| -> Vec<f32> { (0..d).map(|_| spread(r.next().unwrap(), s) * scale).collect() };
    let mut rows = vec![row(4, 1.0), row(30, 1.0), row(4, 1e-22), row(4, 1e20), row(4, 1.0), vec![0.0; d]];
    // Mean squares near ε, where ε's place in the order shows.
    rows.extend((0..16).map(|i| row(2, 1e-3 * (1.0 + i as f32 / 8.0))));
    rows[4][d / 3] = f32::NAN;
    let lane0 = row(4, 1.0).iter().enumerate().map(|(j, &v)| if j % 32 == 0 { v } else { 0.0 }).collect();
    rows.push(lane0);
    let mut tie = vec![0f32; d];
    (tie[0], tie[1], tie[17]) = (4096.0, 1.0, 1.0);
    rows.push(tie);
    rows
}

/// The kernel on `rows` with scales `gamma`, through the interpreter.
fn run(rows: &[Vec<f32>], gamma: &[f32], epsilon: f32) -> Vec<f32> {
    let sh = NormShape { rows: rows.len(), d: gamma.len(), epsilon };
    let text = format!("\"builtin.module\"() ({{\n{}}}) : () -> ()\n", rms_norm(sh).unwrap().generic(2));
    let funcs = interp::module_functions(&text, true).unwrap();
    let bits = |v: &[f32]| -> Vec<i32> { v.iter().map(|x| x.to_bits() as i32).collect() };
    let mut mems = vec![bits(&rows.concat()), bits(gamma), vec![0; rows.len() * gamma.len()]];
    funcs[0].call(&mut mems).unwrap();
    mems.pop().unwrap().into_iter().map(|b| f32::from_bits(b as u32)).collect()
}

fn check(rows: &[Vec<f32>], gamma: &[f32], epsilon: f32) -> usize {
    let got = run(rows, gamma, epsilon);
    let mut nan = 0;
    for (i, (x, y)) in rows.iter().zip(got.chunks(gamma.len())).enumerate() {
        let mut want = vec![0f32; x.len()];
        rms_norm_row(x, gamma, epsilon, &mut want);
        for (j, (g, w)) in y.iter().zip(&want).enumerate() {
            let same = g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan());
            assert!(
                same,
                "row {i} element {j} (ε {epsilon}): the core gives {g:e} ({:#010x}), the definition {w:e}",
                g.to_bits()
            );
            nan += usize::from(w.is_nan());
        }
    }
    nan
}

#[test]
fn the_core_norm_equals_the_pinned_definition_bit_for_bit() {
    for (d, seed) in [(32, 1), (64, 2), (576, 3)] {
        let mut r = xorshift(seed + 10);
        let mut gamma: Vec<f32> = (0..d).map(|_| spread(r.next().unwrap(), 3)).collect();
        gamma[1] = 1e-40;
        gamma[2] = -0.0;
        let rows = rows(d, seed);
        let nan = check(&rows, &gamma, 1e-6);
        assert!(nan >= d, "a NaN in a row makes its outputs NaN ({nan})");
        // ε = 0: the zero row's root is 0 and r = ∞, so its outputs are 0·∞, NaN.
        assert!(check(&rows, &gamma, 0.0) >= 2 * d);
    }
}

#[test]
fn the_norm_function_verifies_as_mlir_and_refuses_a_partial_block() {
    let f = rms_norm(NormShape { rows: 2, d: 64, epsilon: 1e-5 }).unwrap();
    let text = format!("\"builtin.module\"() ({{\n{}}}) : () -> ()\n", f.generic(2));
    mlir::verify_generic(&text).unwrap();
    assert!(text.contains("\"vector.extract\""), "the lanes fold by extracting halves");
    let err = rms_norm(NormShape { rows: 1, d: NORM_LANES + 8, epsilon: 1e-5 }).unwrap_err();
    assert!(err.contains("1 rows of 40 values"), "{err}");
}

/// The aligned inverse rms core on `rows` (each of one length), through the interpreter.
fn run_inverse_rms(rows: &[Vec<f32>], epsilon: f32) -> Vec<f32> {
    let sh = NormShape { rows: rows.len(), d: rows[0].len(), epsilon };
    let text = format!("\"builtin.module\"() ({{\n{}}}) : () -> ()\n", inverse_rms(sh).unwrap().generic(2));
    let funcs = interp::module_functions(&text, true).unwrap();
    let bits = |v: &[f32]| -> Vec<i32> { v.iter().map(|x| x.to_bits() as i32).collect() };
    let mut mems = vec![bits(&rows.concat()), vec![0; rows.len()]];
    funcs[0].call(&mut mems).unwrap();
    mems.pop().unwrap().into_iter().map(|b| f32::from_bits(b as u32)).collect()
}

#[test]
fn the_core_aligned_inverse_rms_equals_the_definition_bit_for_bit() {
    for (d, seed) in [(32, 4), (576, 5)] {
        let mut rows = rows(d, seed);
        let mut inf = rows[0].clone();
        inf[d - 1] = f32::NEG_INFINITY;
        rows.push(inf);
        // Halves of the 11-bit grid, which round up; subnormals beside normals.
        rows.push((0..d).map(|j| if j % 3 == 0 { 1.0 + 2f32.powi(-11) } else { -0.75 }).collect());
        rows.push((0..d).map(|j| if j % 2 == 0 { 1e-39 } else { 3e-38 }).collect());
        for epsilon in [1e-6, 0.0] {
            let got = run_inverse_rms(&rows, epsilon);
            for (i, (x, g)) in rows.iter().zip(&got).enumerate() {
                let w = inverse_root(aligned_sum_squares(x), d, epsilon);
                let same = g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan());
                assert!(same, "row {i} of {d} (ε {epsilon}): the core gives {g:e}, the definition {w:e}");
            }
            assert!(got.iter().any(|g| g.is_nan()) && got.contains(&0.0), "NaN and ∞ rows: {got:?}");
        }
    }
}

#[test]
fn the_inverse_rms_function_verifies_as_mlir_and_refuses_what_it_cannot_sum() {
    let f = inverse_rms(NormShape { rows: 2, d: 64, epsilon: 1e-5 }).unwrap();
    let text = format!("\"builtin.module\"() ({{\n{}}}) : () -> ()\n", f.generic(2));
    mlir::verify_generic(&text).unwrap();
    assert!(inverse_rms(NormShape { rows: 1, d: 40, epsilon: 1e-5 }).is_err());
    let long = ALIGNED_MAX_D + NORM_LANES;
    let err = inverse_rms(NormShape { rows: 1, d: long, epsilon: 1e-5 }).unwrap_err();
    assert!(err.contains(&format!("1 rows of {long} values")), "{err}");
}

//! The host's RmsNorm kernels, on every instruction set this CPU has, compute
//! `ir::pinned_norm`'s definition bit for bit: the order an XDNA core's code follows too, so a
//! norm on the array equals the host's. Rows of many lengths (whole 32-lane blocks, tails, less
//! than a block), values over many binades, and rows whose squares are subnormal, overflow, or
//! hold a NaN. `npuc::InverseRms`, the xdna program's `1/rms` a row, is the factor those norms
//! scale by, in the evaluator and in the host kernel alike.

mod common;

use common::values::Rng;
use ir::pinned_norm::rms_norm_row;
use runtime::kernels::norm::{inverse_rms, rms_norm, skip_rms_norm, Squares};
use runtime::kernels::Isa;

fn same(got: &[f32], want: &[f32]) -> bool {
    got.iter().zip(want).all(|(g, w)| g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()))
}

/// Rows of `d` values: spread over a few binades, over many, tiny (subnormal squares), huge
/// (squares past f32's range), with a NaN, zeros, a mean square near ε; and rows whose sum shows the order: values
/// in lane 0 only (the sum is that lane's, so a fused multiply-add there shows, where over many
/// lanes the last folds round its ulp away), and 2¹² in lane 0 with ones in lanes 1 and 17
/// (2²⁴ + 2 when the ones meet first, 2²⁴ in most other orders).
fn rows(rng: &mut Rng, d: usize) -> Vec<Vec<f32>> {
    let mut rows: Vec<Vec<f32>> = [4, 30].iter().map(|&s| (0..d).map(|_| rng.spread(s)).collect()).collect();
    rows.push((0..d).map(|_| rng.spread(4) * 1e-22).collect());
    rows.push((0..d).map(|_| rng.spread(4) * 1e20).collect());
    let mut nan: Vec<f32> = (0..d).map(|_| rng.spread(4)).collect();
    nan[d / 2] = f32::NAN;
    rows.push(nan);
    rows.push(vec![0.0; d]);
    rows.push((0..d).map(|_| rng.spread(2) * 1e-3).collect());
    rows.push((0..d).map(|j| if j % 32 == 0 { rng.spread(4) } else { 0.0 }).collect());
    let mut tie = vec![0f32; d];
    for (j, v) in [(0, 4096.0), (1, 1.0), (17, 1.0)] {
        if j < d {
            tie[j] = v;
        }
    }
    rows.push(tie);
    rows
}

#[test]
fn the_host_norm_kernels_compute_the_pinned_definition_on_every_path() {
    let isas: Vec<Isa> = Isa::ALL.into_iter().filter(|i| i.is_available()).collect();
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut differs = 0;
    for d in [1usize, 7, 31, 32, 33, 64, 100, 576, 1024, 32 * 200] {
        let gamma: Vec<f32> = (0..d).map(|_| rng.spread(3)).collect();
        for (r, x) in rows(&mut rng, d).iter().enumerate() {
            let mut want = vec![0f32; d];
            rms_norm_row(x, &gamma, 1e-6, &mut want);
            let sequential = (x.iter().map(|v| v * v).sum::<f32>() / d as f32 + 1e-6).sqrt().recip();
            differs += usize::from(want.iter().zip(x.iter().zip(&gamma)).any(|(w, (v, g))| *w != v * sequential * g));
            for &isa in &isas {
                let mut y = vec![0f32; d];
                rms_norm(isa, x, &gamma, 1e-6, &mut y);
                assert!(same(&y, &want), "{isa}: rms_norm of row {r} of {d} differs from the pinned definition");
                // SkipRmsNorm normalises x + skip, here with x = 0 so the sum is the row.
                let (mut y, mut sum) = (vec![0f32; d], vec![0f32; d]);
                skip_rms_norm(isa, &vec![0.0; d], x, &gamma, None, 1e-6, &mut y, &mut sum);
                assert!(same(&y, &want), "{isa}: skip_rms_norm of row {r} of {d} differs from the pinned definition");
            }
        }
    }
    // The pinned order is not the sequential one: the check would not notice a kernel that
    // summed left to right if no row told them apart.
    assert!(differs > 5, "{differs} rows tell the pinned order from a sequential sum");
}

/// `npuc::InverseRms` as the evaluator defines it, on rows of `d`, with ε = 1e-6 and the sum of
/// squares `squares` ("f32" or "aligned").
fn evaluated_inverse_rms(x: &[f32], d: usize, squares: &str) -> Vec<f32> {
    let mut attrs = ir::Attrs::default();
    attrs.set("epsilon", ir::Attr::Float(1e-6));
    attrs.set("squares", ir::Attr::Str(squares.into()));
    let op = ir::OpRef { node: "r", domain: ir::Domain::Npuc, op: "InverseRms", opset: 1, attrs: &attrs };
    let t = ir::Tensor::from_f32(ir::DType::F32, vec![x.len() / d, d], x.to_vec());
    let r = ir::fused::eval(&op, &[Some(&t)], 1).unwrap().swap_remove(0);
    assert_eq!(r.shape, [x.len() / d, 1]);
    r.to_f32_vec()
}

#[test]
fn inverse_rms_is_the_factor_the_pinned_norm_scales_by() {
    let isas: Vec<Isa> = Isa::ALL.into_iter().filter(|i| i.is_available()).collect();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for d in [1usize, 31, 32, 33, 576, 32 * 80] {
        let rows = rows(&mut rng, d);
        let x: Vec<f32> = rows.concat();
        let want = evaluated_inverse_rms(&x, d, "f32");
        // With γ = 1, RmsNorm gives (x·r)·1 = x·r: r is the factor it scaled by.
        for (row, &r) in rows.iter().zip(&want) {
            let mut y = vec![0f32; d];
            rms_norm_row(row, &vec![1.0; d], 1e-6, &mut y);
            let scaled: Vec<f32> = row.iter().map(|v| v * r).collect();
            assert!(same(&y, &scaled), "the evaluator's 1/rms of a row of {d} is not RmsNorm's factor");
        }
        for &isa in &isas {
            let mut got = vec![0f32; rows.len()];
            inverse_rms(isa, &x, d, 1e-6, Squares::F32, &mut got);
            assert!(same(&got, &want), "{isa}: inverse_rms of rows of {d} differs from the evaluator's");
        }
    }
}

/// The xdna program's aligned squares: the host kernel computes the evaluator's definition bit
/// for bit, on rows over many binades, tiny and huge rows, NaN, ∞, zeros, and ties.
#[test]
fn aligned_inverse_rms_is_the_evaluators_on_every_path() {
    let isas: Vec<Isa> = Isa::ALL.into_iter().filter(|i| i.is_available()).collect();
    let mut rng = Rng(0xd1b5_4a32_d192_ed03);
    let mut differs = 0;
    for d in [1usize, 31, 32, 33, 576, 32 * 80, 511 * 32] {
        let mut rows = rows(&mut rng, d);
        let mut inf: Vec<f32> = (0..d).map(|_| rng.spread(4)).collect();
        inf[d - 1] = f32::NEG_INFINITY;
        rows.push(inf);
        // Halves of the 11-bit grid: 1 + 2⁻¹¹ rounds up, which truncation would not.
        rows.push((0..d).map(|j| if j % 3 == 0 { 1.0 + 2f32.powi(-11) } else { -0.75 }).collect());
        let x: Vec<f32> = rows.concat();
        let want = evaluated_inverse_rms(&x, d, "aligned");
        let f32_sums = evaluated_inverse_rms(&x, d, "f32");
        differs += want.iter().zip(&f32_sums).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        for &isa in &isas {
            let mut got = vec![0f32; rows.len()];
            inverse_rms(isa, &x, d, 1e-6, Squares::Aligned, &mut got);
            assert!(same(&got, &want), "{isa}: aligned inverse_rms of rows of {d} differs from the evaluator's");
        }
    }
    assert!(differs > 10, "only {differs} rows tell the aligned sum from the f32 one");
}

/// An `InverseRms` the evaluator cannot compute says why, naming the node.
#[test]
fn inverse_rms_refuses_unknown_sums_and_rows_too_long_for_the_aligned_one() {
    let eval = |squares: &str, d: usize| {
        let mut attrs = ir::Attrs::default();
        attrs.set("squares", ir::Attr::Str(squares.into()));
        let op = ir::OpRef { node: "norm/r", domain: ir::Domain::Npuc, op: "InverseRms", opset: 1, attrs: &attrs };
        let t = ir::Tensor::from_f32(ir::DType::F32, vec![1, d], vec![1.0; d]);
        ir::fused::eval(&op, &[Some(&t)], 1).map(|_| ()).map_err(|e| e.to_string())
    };
    let err = eval("f64", 64).unwrap_err();
    assert!(err.contains("norm/r") && err.contains("\"f64\""), "{err}");
    let long = ir::pinned_norm::ALIGNED_MAX_D + 32;
    let err = eval("aligned", long).unwrap_err();
    assert!(err.contains(&long.to_string()), "{err}");
    assert!(eval("aligned", ir::pinned_norm::ALIGNED_MAX_D).is_ok());
    assert!(eval("f32", long).is_ok(), "the f32 sum takes any row");
}

/// `QuantizeRows(x, γ)`, the codes of the exact products: the host kernel computes the
/// evaluator's codes and scales bit for bit, in two passes, on rows over many binades, tiny and
/// huge, with NaN, ∞ and zeros, rows no f32 power of two scales (their second pass empty), and γ
/// with a zero, a subnormal and negative values.
#[test]
fn product_rows_quantise_as_the_evaluator_does() {
    let mut rng = Rng(0x6a09_e667_f3bc_c909);
    for d in [1usize, 33, 576] {
        let mut gamma: Vec<f32> = (0..d).map(|_| rng.spread(3)).collect();
        gamma[0] = if d > 1 { 0.0 } else { gamma[0] };
        if d > 2 {
            (gamma[1], gamma[2]) = (1e-40, 200.0);
        }
        let mut rows = rows(&mut rng, d);
        // Unscalable rows: 3·10³⁸·200 is past 127·2¹²⁷, and ∞.
        let mut huge: Vec<f32> = (0..d).map(|_| rng.spread(8)).collect();
        huge[d.min(3) - 1] = 3e38;
        rows.push(huge);
        rows.push((0..d).map(|j| if j == d / 2 { f32::NEG_INFINITY } else { rng.spread(8) }).collect());
        let x: Vec<f32> = rows.concat();
        let mut attrs = ir::Attrs::default();
        attrs.set("passes", ir::Attr::Int(2));
        let op = ir::OpRef { node: "q", domain: ir::Domain::Npuc, op: "QuantizeRows", opset: 1, attrs: &attrs };
        let xt = ir::Tensor::from_f32(ir::DType::F32, vec![rows.len(), d], x.clone());
        let gt = ir::Tensor::from_f32(ir::DType::F32, vec![d], gamma.clone());
        let out = ir::fused::eval(&op, &[Some(&xt), Some(&gt)], 2).unwrap();
        let want_codes: Vec<u8> = out[0].as_i64().unwrap().iter().map(|&c| c as i8 as u8).collect();
        let want_scales = out[1].to_f32_vec();
        let (mut codes, mut scales) = (vec![0u8; 2 * x.len()], vec![0f32; 2 * rows.len()]);
        runtime::kernels::quantize::quantize_product_rows(&x, &gamma, true, &mut codes, &mut scales);
        assert_eq!(codes, want_codes, "codes of rows of {d}");
        assert!(same(&scales, &want_scales), "scales of rows of {d}: {scales:?} against {want_scales:?}");
        let n = rows.len();
        for r in (n - 2..n).filter(|&r| d > 2 || r == n - 1) {
            let second = &codes[x.len() + r * d..x.len() + (r + 1) * d];
            assert!(scales[r] == 1.0 && scales[n + r] == 1.0 && second.iter().all(|&c| c == 0), "row {r} of {d}");
        }
    }
}

/// Where the exact product and its f32 rounding part: 0.83333337·3 is 2.5 + 2⁻²³ (code 3),
/// whose f32 rounding is the tie 2.5 (code 2); 0.67317712·3 is 2 + 5/256 + 2⁻²³, whose
/// remainder 5/256 + 2⁻²³ is 2.5 + 2⁻¹⁶ steps of the second pass's 2⁻⁷ (code 3, not the
/// tie's 2); 100.5 sets the scales (1, and 2⁻⁷ for its remainder 0.5). Evaluator and kernel
/// give the exact codes; the f32 product's `QuantizeRows` gives the others.
#[test]
fn product_rows_round_the_exact_product_not_its_f32_rounding() {
    let (x, gamma) = ([100.5f32, 0.673_177_1, 0.833_333_4], [1f32, 3.0, 3.0]);
    let want_codes = [100u8, 2, 3, 64, 3, (-64i8) as u8];
    let (mut codes, mut scales) = ([0u8; 6], [0f32; 2]);
    runtime::kernels::quantize::quantize_product_rows(&x, &gamma, true, &mut codes, &mut scales);
    assert_eq!((codes, scales), (want_codes, [1.0, 2f32.powi(-7)]));
    let mut attrs = ir::Attrs::default();
    attrs.set("passes", ir::Attr::Int(2));
    let op = ir::OpRef { node: "q", domain: ir::Domain::Npuc, op: "QuantizeRows", opset: 1, attrs: &attrs };
    let xt = ir::Tensor::from_f32(ir::DType::F32, vec![1, 3], x.to_vec());
    let gt = ir::Tensor::from_f32(ir::DType::F32, vec![3], gamma.to_vec());
    let exact = ir::fused::eval(&op, &[Some(&xt), Some(&gt)], 2).unwrap();
    assert_eq!(exact[0].as_i64().unwrap(), [100, 2, 3, 64, 3, -64]);
    let products: Vec<f32> = x.iter().zip(&gamma).map(|(a, b)| a * b).collect();
    let pt = ir::Tensor::from_f32(ir::DType::F32, vec![1, 3], products);
    let rounded = ir::fused::eval(&op, &[Some(&pt)], 2).unwrap();
    assert_eq!(rounded[0].as_i64().unwrap(), [100, 2, 2, 64, 2, 64]);
}

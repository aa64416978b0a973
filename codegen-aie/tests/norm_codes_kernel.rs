//! `QuantizeRows(x, γ)` as core code (`qkernels::product_*`), executed from its text by the
//! interpreter K part by K part in the order a qgemv core calls it, equals `ir::norm_codes`'s
//! definition bit for bit, in one pass and in two: rows over few and many binades, tiny rows
//! (products below the smallest scale), rows no scale holds (a product past 127·2¹²⁷, ±∞),
//! a NaN, ∞·0, zeros, ties at both passes, and γ of bfloat16 values with zeros, negatives,
//! a subnormal and 200. MLIR 22 verifies the functions' text.

mod common;
#[path = "common/quantise.rs"]
mod quantise;

use codegen_aie::interp;
use codegen_aie::mlir;
use codegen_aie::qkernels::{self, product_functions, Shape};
use common::xorshift;
use ir::norm_codes::quantize_product_rows;
use quantise::quantise_parts;

/// `x` rounded down to a bfloat16 value (its low 16 bits cleared).
fn bf16(x: f32) -> f32 {
    f32::from_bits(x.to_bits() & 0xffff_0000)
}

/// A value in ±[1, 2)·2^e, e uniform in `-spread..spread`, from the bits `x`.
fn spread(x: u64, spread: i32) -> f32 {
    let m = 1.0 + (x >> 40) as f32 / (1u64 << 24) as f32;
    let e = (x % (2 * spread as u64)) as i32 - spread;
    let sign = if x & (1 << 20) == 0 { 1.0 } else { -1.0 };
    sign * m * 2f32.powi(e)
}

/// γ of `d` bfloat16 values: 1 in the first seven columns (where the tie rows sit) and
/// 1 + 2⁻⁷ in the eighth, then spread over a few binades, with a zero, a negative zero, a
/// subnormal and 200.
fn gamma(d: usize, seed: u64) -> Vec<f32> {
    let mut r = xorshift(seed);
    let mut g: Vec<f32> = (0..d).map(|j| if j < 8 { 1.0 } else { bf16(spread(r.next().unwrap(), 3)) }).collect();
    (g[7], g[8], g[9], g[10], g[11]) = (1.0 + 2f32.powi(-7), 0.0, -0.0, bf16(3e-39), 200.0);
    g
}

/// The rows: see the module's summary. Column 8's γ is 0 and column 11's 200.
fn rows(d: usize, seed: u64) -> Vec<Vec<f32>> {
    let mut r = xorshift(seed);
    let mut row = |s: i32, scale: f32| -> Vec<f32> { (0..d).map(|_| spread(r.next().unwrap(), s) * scale).collect() };
    let mut rows = vec![row(4, 1.0), row(30, 1.0), row(4, 1e-36), row(4, 1e-42), row(4, 1e30)];
    let mut unscalable = row(4, 1.0);
    unscalable[11] = 2e38;
    let mut nan = row(4, 1.0);
    nan[d / 2] = f32::NAN;
    let mut inf = row(20, 1.0);
    inf[d - 1] = f32::NEG_INFINITY;
    let mut inf_times_zero = row(4, 1.0);
    inf_times_zero[8] = f32::INFINITY;
    // Ties of the first pass at scale 1 (127 sets it): 2.5 → 2, 3.5 → 4, −2.5 → −2.
    let mut ties = vec![0.0; d];
    ties[..5].copy_from_slice(&[127.0, 2.5, 3.5, -2.5, 0.5]);
    // 127.5 is past 127 steps of 1: the scale is 2, and ½ ties to 0.
    let mut boundary = vec![0.0; d];
    boundary[..3].copy_from_slice(&[127.5, 1.0, 3.0]);
    rows.extend([unscalable, nan, inf, inf_times_zero, vec![0.0; d], ties, boundary, small_remainder(d).0]);
    rows.push(row(4, 1.0).iter().map(|&v| bf16(v) + bf16(v) * 2f32.powi(-9)).collect());
    rows
}

/// A row whose only remainder is a few units of its product (the first odd count that works):
/// 127·2⁻⁶ sets the scale 2⁻⁶, and in column 7 (γ = 129/128) a significand `m` with
/// `129·m = q·2²⁴ + units`. The second pass's scale is then finer than the product's unit
/// (2⁻³⁰): its code is the units shifted left.
fn small_remainder(d: usize) -> (Vec<f32>, u64) {
    let inverse = (1u64..1 << 24).find(|i| (129 * i) % (1 << 24) == 1).unwrap();
    let fits = |units: &u64| (1 << 23..=(127 << 24) / 129).contains(&((units * inverse) % (1 << 24)));
    let units = (3..64).step_by(2).find(fits).unwrap();
    let mut row = vec![0.0; d];
    (row[0], row[7]) = (127.0 * 2f32.powi(-6), ((units * inverse) % (1 << 24)) as f32 * 2f32.powi(-23));
    (row, units)
}

/// The core functions on `rows`, K part by K part: codes (pass by pass, row by row) and scales.
fn run(rows: &[Vec<f32>], gamma: &[f32], (k, passes): (usize, usize)) -> (Vec<i8>, Vec<f32>) {
    let (m, d) = (rows.len(), gamma.len());
    let sh =
        Shape { rows: m, k, n: 8, passes, kernel_rows: m, input: qkernels::Input::Norm, pairs: false, stacked: false };
    let text: String = product_functions(sh).iter().map(|f| f.generic(2)).collect();
    let funcs = interp::module_functions(&format!("\"builtin.module\"() ({{\n{text}}}) : () -> ()\n"), true).unwrap();
    // An X element: the rows' part, then γ's.
    let x_parts: Vec<Vec<i32>> = (0..d / k)
        .map(|q| {
            let part = rows.iter().map(Vec::as_slice).chain([gamma]).flat_map(|r| r[q * k..(q + 1) * k].to_vec());
            part.map(|x| x.to_bits() as i32).collect()
        })
        .collect();
    let names = [qkernels::PRODUCT_MAX, qkernels::PRODUCT_CODES, qkernels::PRODUCT_RESIDUAL];
    quantise_parts(&funcs, names, &x_parts, (m, k, passes, 6))
}

#[test]
fn the_core_codes_of_exact_products_equal_the_definition_bit_for_bit() {
    for (d, k, seed) in [(96, 32, 1), (64, 64, 2)] {
        let (rows, gamma) = (rows(d, seed), gamma(d, seed + 10));
        let x: Vec<f32> = rows.concat();
        for passes in [1, 2] {
            let (want_codes, want_scales) = quantize_product_rows(&x, &gamma, passes);
            let (codes, scales) = run(&rows, &gamma, (k, passes));
            for (i, (g, w)) in codes.chunks(d).zip(want_codes.chunks(d)).enumerate() {
                assert_eq!(g, w, "codes of pass {} row {} ({passes} passes, d {d})", i / rows.len(), i % rows.len());
            }
            let same = scales.iter().zip(&want_scales).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "scales ({passes} passes, d {d}): {scales:?} against {want_scales:?}");
        }
    }
}

#[test]
fn the_test_rows_reach_every_case_of_the_definition() {
    let (d, rows) = (96, rows(96, 1));
    let (codes, scales) = quantize_product_rows(&rows.concat(), &gamma(d, 11), 2);
    let m = rows.len();
    let second = |i: usize| &codes[(m + i) * d..(m + i + 1) * d];
    assert_eq!(scales[3], f32::MIN_POSITIVE, "products below every scale take the smallest");
    assert!(
        scales[2] > f32::MIN_POSITIVE && scales[m + 2] == f32::MIN_POSITIVE,
        "a tiny row's residual floors: {} {}",
        scales[2],
        scales[m + 2]
    );
    for unscalable in [5, 7] {
        assert!(scales[unscalable] == 1.0 && second(unscalable).iter().all(|&c| c == 0), "row {unscalable}");
    }
    assert_eq!(&codes[10 * d..10 * d + 5], [127, 2, 4, -2, 0], "ties to even at scale 1");
    assert_eq!((scales[11], &codes[11 * d..11 * d + 3]), (2.0, &[64i8, 0, 2][..]), "127.5 takes scale 2");
    assert_eq!(codes[8 * d + 8], 0, "∞·0 is NaN: code 0");
    let (units, s1) = (small_remainder(d).1, scales[m + 12]);
    assert!(s1 < 2f32.powi(-30), "the residual's scale {s1:e} is finer than the product's unit");
    assert_eq!(f64::from(second(12)[7]), units as f64 * 2f64.powi(-30) / f64::from(s1), "{units} units");
    assert!(second(0).iter().any(|&c| c != 0) && scales[m] < scales[0] / 64.0, "a second pass with codes");
}

#[test]
fn the_functions_verify_as_mlir() {
    let sh = Shape {
        rows: 2,
        k: 32,
        n: 8,
        passes: 2,
        kernel_rows: 4,
        input: qkernels::Input::Norm,
        pairs: false,
        stacked: false,
    };
    let text: String = product_functions(sh).iter().map(|f| f.generic(2)).collect();
    mlir::verify_generic(&format!("\"builtin.module\"() ({{\n{text}}}) : () -> ()\n")).unwrap();
}

//! `QuantizeSwiGlu(g, u)` as core code (`qkernels::gate_*`), executed from its text by the
//! interpreter K part by K part in the order a core calls it, equals `ir::integer_gate`'s
//! definition bit for bit, in one pass and in two: gates over few and many binades, around the
//! saturation at ±16, on the ties of the rounding to 11 bits, tiny and subnormal, rows past
//! every scale (a huge product, ±∞), NaN, ∞·0 (∞ times a zero up, and −∞, whose σ̂ is 0), and
//! signed zeros. MLIR 22 verifies the functions' text.

mod common;
#[path = "common/quantise.rs"]
mod quantise;

use codegen_aie::interp;
use codegen_aie::mlir;
use codegen_aie::qkernels::{self, gate_functions, Shape};
use common::xorshift;
use ir::integer_gate::quantize_gate_rows;
use quantise::quantise_parts;

/// A value in ±[1, 2)·2^e, e uniform in `-spread..spread`, from the bits `x`.
fn spread(x: u64, spread: i32) -> f32 {
    let m = 1.0 + (x >> 40) as f32 / (1u64 << 24) as f32;
    let e = (x % (2 * spread as u64)) as i32 - spread;
    let sign = if x & (1 << 20) == 0 { 1.0 } else { -1.0 };
    sign * m * 2f32.powi(e)
}

/// A row of gate values and the row of up values beside it.
type Pair = (Vec<f32>, Vec<f32>);

/// Rows of `d` (gate, up) pairs: see the module's summary.
fn rows(d: usize, seed: u64) -> Vec<Pair> {
    let mut r = xorshift(seed);
    let mut row = |s: i32, scale: f32| -> Vec<f32> { (0..d).map(|_| spread(r.next().unwrap(), s) * scale).collect() };
    let mut rows = vec![
        (row(3, 1.0), row(3, 1.0)),
        (row(20, 1.0), row(20, 1.0)),
        (row(2, 1e-38), row(2, 1e-3)),
        (row(2, 1e30), row(2, 1e30)),
    ];
    let edge: Vec<f32> = (0..d).map(|j| [16.0, -16.0, 15.99, -15.99, 16.004, -0.0, 0.0, 1e-45][j % 8]).collect();
    rows.push((edge, row(2, 1.0)));
    // Bits on the ties of the rounding: 0x1000 past an even quantum, 0x3000 past an odd one.
    let ties: Vec<f32> =
        (0..d).map(|j| f32::from_bits(0x3f80_0000 + [0x1000, 0x3000][j % 2] + (j as u32 & !1) * 0x2000)).collect();
    rows.push((ties.clone(), ties));
    let (mut g, mut u) = (row(3, 1.0), row(3, 1.0));
    (g[0], g[1], g[2], g[3], u[4], g[4]) = (f32::NAN, f32::INFINITY, f32::NEG_INFINITY, f32::INFINITY, f32::NAN, 1.0);
    (u[1], u[3]) = (2.0, 0.0);
    rows.push((g, u));
    let (g, mut u) = (row(3, 1.0), row(3, 1.0));
    u[d - 1] = f32::NEG_INFINITY;
    rows.push((g, u));
    rows.push((vec![0.0; d], row(3, 1.0)));
    rows
}

/// The core functions on `rows`, K part by K part: codes (pass by pass, row by row) and scales.
fn run(rows: &[Pair], (k, passes): (usize, usize)) -> (Vec<i8>, Vec<f32>) {
    let (m, d) = (rows.len(), rows[0].0.len());
    let sh =
        Shape { rows: m, k, n: 8, passes, kernel_rows: m, input: qkernels::Input::Gate, pairs: false, stacked: false };
    let text: String = gate_functions(sh).iter().map(|f| f.generic(2)).collect();
    let funcs = interp::module_functions(&format!("\"builtin.module\"() ({{\n{text}}}) : () -> ()\n"), true).unwrap();
    // A gu element (the gate rows' part, then the up rows') into the gate's values.
    let gu: Vec<Vec<i32>> = (0..d / k)
        .map(|q| {
            let plane = |pick: fn(&Pair) -> &Vec<f32>| {
                rows.iter().flat_map(move |r| pick(r)[q * k..(q + 1) * k].iter().map(|x| x.to_bits() as i32))
            };
            let mut args = vec![plane(|r| &r.0).chain(plane(|r| &r.1)).collect(), vec![0; 2 * m * k]];
            let values = funcs.iter().find(|f| f.name == qkernels::GATE_VALUES).unwrap();
            values.call(&mut args).unwrap_or_else(|e| panic!("@{}: {e}", values.name));
            args.remove(1)
        })
        .collect();
    let names = [qkernels::GATE_MAX, qkernels::GATE_CODES, qkernels::GATE_RESIDUAL];
    quantise_parts(&funcs, names, &gu, (m, k, passes, 4))
}

#[test]
fn the_core_gate_codes_equal_the_definition_bit_for_bit() {
    for (d, k, seed) in [(96, 32, 1), (64, 64, 2)] {
        let rows = rows(d, seed);
        let g: Vec<f32> = rows.iter().flat_map(|r| r.0.clone()).collect();
        let u: Vec<f32> = rows.iter().flat_map(|r| r.1.clone()).collect();
        for passes in [1, 2] {
            let (want_codes, want_scales) = quantize_gate_rows(&g, &u, d, passes);
            let (codes, scales) = run(&rows, (k, passes));
            for (i, (got, want)) in codes.chunks(d).zip(want_codes.chunks(d)).enumerate() {
                assert_eq!(
                    got,
                    want,
                    "codes of pass {} row {} ({passes} passes, d {d})",
                    i / rows.len(),
                    i % rows.len()
                );
            }
            let same = scales.iter().zip(&want_scales).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "scales ({passes} passes, d {d}): {scales:?} against {want_scales:?}");
        }
    }
}

#[test]
fn the_test_rows_reach_every_case_of_the_definition() {
    let (d, rows) = (96, rows(96, 1));
    let g: Vec<f32> = rows.iter().flat_map(|r| r.0.clone()).collect();
    let u: Vec<f32> = rows.iter().flat_map(|r| r.1.clone()).collect();
    let (codes, scales) = quantize_gate_rows(&g, &u, d, 2);
    let m = rows.len();
    let second = |i: usize| &codes[(m + i) * d..(m + i + 1) * d];
    assert_eq!(scales[2], f32::MIN_POSITIVE, "a tiny row takes the smallest scale");
    for unscalable in [3, 6, 7] {
        assert!(scales[unscalable] == 1.0 && second(unscalable).iter().all(|&c| c == 0), "row {unscalable}");
    }
    assert_eq!(&codes[6 * d..6 * d + 5], [0, 127, 0, 0, 0], "NaN, ∞·u, −∞ (σ̂ 0), ∞·0 and a NaN up: codes");
    assert_eq!(codes[7 * d + d - 1], -127, "g·σ̂·(−∞)");
    assert!(codes[8 * d..9 * d].iter().all(|&c| c == 0) && scales[8] == 1.0, "a row of zero gates");
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
        input: qkernels::Input::Gate,
        pairs: false,
        stacked: false,
    };
    let text: String = gate_functions(sh).iter().map(|f| f.generic(2)).collect();
    mlir::verify_generic(&format!("\"builtin.module\"() ({{\n{text}}}) : () -> ()\n")).unwrap();
}

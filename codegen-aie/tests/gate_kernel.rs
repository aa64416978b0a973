//! SwiGlu as core code (`qkernels::swiglu`), executed from its text by the interpreter, equals
//! `ir::pinned_gate`'s definition — the one every host path computes — bit for bit: gates over
//! many binades, where σ's `exp` underflows gradually and to 0, ties of `n`'s rounding, ±0,
//! ±∞ and NaN, and up values down to subnormals. MLIR 22 verifies the function's text.

mod common;

use codegen_aie::qkernels::{swiglu, GateShape};
use codegen_aie::{interp, mlir};
use common::xorshift;

/// A value in ±[1, 2)·2^e, e uniform in `-spread..spread`, from the bits `x`.
fn spread(x: u64, spread: i32) -> f32 {
    let m = 1.0 + (x >> 40) as f32 / (1u64 << 24) as f32;
    let e = (x % (2 * spread as u64)) as i32 - spread;
    let sign = if x & (1 << 20) == 0 { 1.0 } else { -1.0 };
    sign * m * 2f32.powi(e)
}

/// `rows` rows of `d` gates: spread over binades to ±128, the underflow's range, and the
/// specials, and values near the `exp`'s range-reduction steps.
fn gates(rows: usize, d: usize, seed: u64) -> Vec<f32> {
    let specials = [0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -88.0, -95.5, -103.9, -200.0, 88.8];
    let mut r = xorshift(seed);
    (0..rows * d)
        .map(|i| match i % 6 {
            0 => specials[(i / 6) % specials.len()],
            1 => -87.3 - 16.0 * (r.next().unwrap() >> 40) as f32 / (1u64 << 24) as f32,
            2 => (((i / 6) % 60) as f32 + 0.5) / std::f32::consts::LOG2_E,
            _ => spread(r.next().unwrap(), 7),
        })
        .collect()
}

/// Gates whose `−|g|·log₂e` is exactly `−(k + ½)` in f32: ties of `n`'s rounding, to even.
fn ties() -> Vec<f32> {
    let near = |k: u32| {
        let (target, x0) = (k as f32 + 0.5, (k as f32 + 0.5) / std::f32::consts::LOG2_E);
        (-8..=8)
            .map(move |d| f32::from_bits((x0.to_bits() as i32 + d) as u32))
            .find(move |x| x * std::f32::consts::LOG2_E == target)
    };
    (0..140).filter_map(near).collect()
}

fn run(g: &[f32], u: &[f32], sh: GateShape) -> Vec<f32> {
    let text = format!("\"builtin.module\"() ({{\n{}}}) : () -> ()\n", swiglu(sh).unwrap().generic(2));
    let funcs = interp::module_functions(&text, true).unwrap();
    let bits = |v: &[f32]| -> Vec<i32> { v.iter().map(|x| x.to_bits() as i32).collect() };
    let mut mems = vec![bits(g), bits(u), vec![0; g.len()]];
    funcs[0].call(&mut mems).unwrap();
    mems.pop().unwrap().into_iter().map(|b| f32::from_bits(b as u32)).collect()
}

#[test]
fn the_core_gate_equals_the_pinned_definition_bit_for_bit() {
    let sh = GateShape { rows: 3, d: 192 };
    let mut g = gates(sh.rows, sh.d, 5);
    let ties = ties();
    assert!(ties.len() >= 20, "{} ties", ties.len());
    for (j, t) in ties.iter().take(g.len() / 6).enumerate() {
        g[6 * j + 5] = if j % 2 == 0 { *t } else { -t };
    }
    let mut r = xorshift(6);
    let mut u: Vec<f32> = (0..g.len()).map(|_| spread(r.next().unwrap(), 4)).collect();
    u[7] = 1e-40;
    let got = run(&g, &u, sh);
    let (mut nan, mut tiny) = (0, 0);
    for (j, (&y, (&g, &u))) in got.iter().zip(g.iter().zip(&u)).enumerate() {
        let want = ir::pinned_gate::swiglu(g, u);
        let same = y.to_bits() == want.to_bits() || (y.is_nan() && want.is_nan());
        assert!(same, "element {j}: gate {g:e}, up {u:e}: the core gives {y:e}, the definition {want:e}");
        nan += usize::from(want.is_nan());
        tiny += usize::from(want != 0.0 && want.abs() < 1e-36);
    }
    assert!(nan > 0 && tiny > 0, "the rows reach NaN ({nan}) and σ's underflow ({tiny})");
}

#[test]
fn the_gate_function_verifies_as_mlir_and_refuses_a_partial_block() {
    let f = swiglu(GateShape { rows: 1, d: 16 }).unwrap();
    mlir::verify_generic(&format!("\"builtin.module\"() ({{\n{}}}) : () -> ()\n", f.generic(2))).unwrap();
    let err = swiglu(GateShape { rows: 2, d: 12 }).unwrap_err();
    assert!(err.contains("2 rows of 12 values"), "{err}");
}

//! Quantisation of f32 activations and back, exactly as the reference evaluator computes it:
//! ONNX QuantizeLinear and DequantizeLinear with one scale and zero point per tensor, and
//! `npuc::QuantizeRows` (int8 codes with one scale per row). Codes are bytes: u8 codes as they
//! are, i8 codes as their bits.

use super::Isa;

/// QuantizeLinear of one value: `saturate(round_half_even(x / scale) + zero_point)`, the
/// division in f32, as the reference evaluator does; the code's bits as a byte.
pub fn quantize(x: f32, scale: f32, zero_point: i32, signed: bool) -> u8 {
    let q = x / scale;
    let r = if q.is_nan() { 0.0 } else { q.round_ties_even() };
    let (lo, hi) = if signed { (-128.0, 127.0) } else { (0.0, 255.0) };
    let v = (f64::from(r) + f64::from(zero_point)).clamp(lo, hi) as i32;
    v as u8
}

/// [`quantize`] of every value of `x` into `codes` (as many as both hold).
pub fn quantize_linear(x: &[f32], scale: f32, zero_point: i32, signed: bool, codes: &mut [u8]) {
    for (d, &v) in codes.iter_mut().zip(x) {
        *d = quantize(v, scale, zero_point, signed);
    }
}

/// DequantizeLinear: `(code − zero_point) · scale` for every code into `y` (as many as both hold).
pub fn dequantize_linear(codes: &[u8], scale: f32, zero_point: i32, signed: bool, y: &mut [f32]) {
    for (d, &c) in y.iter_mut().zip(codes) {
        let q = if signed { i32::from(c as i8) } else { i32::from(c) };
        *d = q.wrapping_sub(zero_point) as f32 * scale;
    }
}

/// `npuc::QuantizeRows`: each row of `k` values of `x` into int8 codes (their bits in `codes`)
/// and one scale in `scales`, the power of two [`row_scale`] makes of max|row| (1 when that
/// maximum is 0 or infinite), as
/// `ir::fused::quantize_rows` computes them: in f32, ties to even, within ±127. Rows are taken as
/// long as `codes` and `scales` have room.
pub fn quantize_rows(x: &[f32], k: usize, codes: &mut [u8], scales: &mut [f32]) {
    quantize_rows_with(x, k, codes, scales, |_, v| v);
}

/// The second pass of a two-pass `npuc::QuantizeRows`: [`quantize_rows`] of the residual
/// x − codes·s of the first pass `(codes, scales)`, as `ir::fused::quantize_rows_residual`
/// computes it (in f32).
pub fn quantize_rows_residual(
    x: &[f32],
    k: usize,
    (first, first_scales): (&[u8], &[f32]),
    codes: &mut [u8],
    scales: &mut [f32],
) {
    let residual = |i: usize, v: f32| v - f32::from(first[i] as i8) * first_scales[i / k];
    quantize_rows_with(x, k, codes, scales, residual);
}

/// `npuc::QuantizeRows(x, γ)`: the rows of the exact products `x·γ` (in f64, where an f32
/// product is exact; `k = γ.len()`) into int8 codes and one scale a row, in one pass or two —
/// `ir::norm_codes::quantize_product_rows`: the scale the smallest power of two `s ≥ 2⁻¹²⁶` with
/// `127·s ≥ max|y|` (1 for 0, NaN or past 127·2¹²⁷), codes `round_half_even(y/s)` within
/// ±127, and the second pass of the exact remainder `y − c·s` (taken as 0 in a row past
/// 127·2¹²⁷, whose second pass is then scale 1, codes 0). `codes` and `scales` hold the
/// first pass's rows, then the second's. Panics unless `x` holds whole rows and the outputs
/// room for them.
pub fn quantize_product_rows(x: &[f32], gamma: &[f32], two_passes: bool, codes: &mut [u8], scales: &mut [f32]) {
    let k = gamma.len();
    exact_rows(x.len(), k, two_passes, codes, scales, |i, y| {
        for ((y, &v), &g) in y.iter_mut().zip(&x[i * k..(i + 1) * k]).zip(gamma) {
            *y = f64::from(v) * f64::from(g);
        }
    });
}

/// `npuc::QuantizeSwiGlu(g, u)`: rows of `k` values of SwiGlu in integers
/// ([`super::swiglu::integer_gate`], exact in f64, on the instruction set `isa`) into int8 codes and one scale a row, in one
/// pass or two, as [`quantize_product_rows`] quantises its exact products —
/// `ir::integer_gate::quantize_gate_rows`. Panics unless `g` and `u` hold the same whole rows
/// and the outputs room for them.
pub fn quantize_gate_rows(
    isa: Isa,
    (g, u): (&[f32], &[f32]),
    k: usize,
    two_passes: bool,
    codes: &mut [u8],
    scales: &mut [f32],
) {
    assert_eq!(g.len(), u.len(), "quantize_gate_rows: gate and up differ");
    exact_rows(g.len(), k, two_passes, codes, scales, |i, y| {
        super::swiglu::integer_gate_row(isa, &g[i * k..(i + 1) * k], &u[i * k..(i + 1) * k], y);
    });
}

/// `len / k` rows of exact values, row `i` written by `row(i, y)`, into codes and scales in
/// one pass or two (the second of the exact remainder `y − c·s`, 0 in an unscalable row);
/// `codes` and `scales` hold the first pass's rows, then the second's.
fn exact_rows(
    len: usize,
    k: usize,
    two_passes: bool,
    codes: &mut [u8],
    scales: &mut [f32],
    mut row: impl FnMut(usize, &mut [f64]),
) {
    let rows = len / k.max(1);
    assert!(k > 0 && len == rows * k, "exact rows: {len} values in rows of {k}");
    let passes = 1 + usize::from(two_passes);
    assert!(codes.len() >= passes * len && scales.len() >= passes * rows, "exact rows: no room");
    let mut y = vec![0f64; k];
    for i in 0..rows {
        row(i, &mut y);
        let (s, scalable) = product_pass(&y, &mut codes[i * k..(i + 1) * k]);
        scales[i] = s as f32;
        if two_passes {
            for (y, &c) in y.iter_mut().zip(&codes[i * k..(i + 1) * k]) {
                *y = if scalable { *y - f64::from(c as i8) * s } else { 0.0 };
            }
            let (r, _) = product_pass(&y, &mut codes[len + i * k..len + (i + 1) * k]);
            scales[rows + i] = r as f32;
        }
    }
}

/// The largest row maximum a power-of-two f32 scale holds, 127·2¹²⁷.
const SCALABLE_MAX: f64 = 127.0 * (1u128 << 127) as f64;

/// One row of exact values into codes; returns its scale and whether one held the row (its
/// maximum at most [`SCALABLE_MAX`]).
fn product_pass(y: &[f64], codes: &mut [u8]) -> (f64, bool) {
    let max = y.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let scalable = max <= SCALABLE_MAX;
    let s = if max > 0.0 && scalable {
        let floor = f64::from(f32::MIN_POSITIVE);
        let mut s = 2f64.powi((max / 127.0).log2().ceil() as i32).max(floor);
        while s > floor && 127.0 * (s / 2.0) >= max {
            s /= 2.0;
        }
        while 127.0 * s < max {
            s *= 2.0;
        }
        s
    } else {
        1.0
    };
    let inverse = 1.0 / s;
    for (c, v) in codes.iter_mut().zip(y) {
        *c = code_f64(v * inverse) as u8;
    }
    (s, scalable)
}

/// `round_half_even(x)` within ±127 as an int8 code, NaN 0 — `x.round_ties_even()` clamped, but
/// without the library call that rounding is on baseline x86-64: clamped to ±128 first, `x` is
/// rounded to an integer, ties to even, by adding and subtracting 1.5·2⁵² (exact for |x| < 2⁵¹).
/// A row's `y/s` is exact (`s` a power of two: `y·(1/s)`).
fn code_f64(x: f64) -> i8 {
    const ROUND: f64 = 6_755_399_441_055_744.0;
    ((x.clamp(-128.0, 128.0) + ROUND) - ROUND).clamp(-127.0, 127.0) as i8
}

/// [`code_f64`] for f32 (1.5·2²³, exact for |x| < 2²²).
fn code_f32(x: f32) -> i8 {
    const ROUND: f32 = 12_582_912.0;
    ((x.clamp(-128.0, 128.0) + ROUND) - ROUND).clamp(-127.0, 127.0) as i8
}

/// The row scale of a row's maximum: the smallest power of two at least `max / 127` (the
/// quotient in f32) and at least 2⁻¹²⁶, read off the quotient's bits; 1 when `max` is 0 or not
/// finite — `ir::fused::quantize_rows_scale`.
fn row_scale(max: f32) -> f32 {
    if !(max > 0.0 && max.is_finite()) {
        return 1.0;
    }
    let bits = (max / 127.0).to_bits();
    match (bits & 0x7f80_0000, bits & 0x007f_ffff) {
        (0, _) => f32::MIN_POSITIVE,
        (exponent, 0) => f32::from_bits(exponent),
        (exponent, _) => f32::from_bits(exponent + 0x0080_0000),
    }
}

/// [`quantize_rows`] of `value(i, x[i])`.
fn quantize_rows_with(x: &[f32], k: usize, codes: &mut [u8], scales: &mut [f32], value: impl Fn(usize, f32) -> f32) {
    let mut row = vec![0f32; k];
    for (r, (out, s)) in codes.chunks_mut(k).zip(scales.iter_mut()).enumerate().take(x.len() / k.max(1)) {
        for (j, (d, &v)) in row.iter_mut().zip(&x[r * k..(r + 1) * k]).enumerate() {
            *d = value(r * k + j, v);
        }
        let max = row.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        *s = row_scale(max);
        for (o, &v) in out.iter_mut().zip(&row) {
            *o = code_f32(v / *s) as u8;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn codes_round_as_round_ties_even_does() {
        let edges =
            [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1e300, -1e300, 2f64.powi(60), 127.49, -127.5, 0.0, -0.0];
        let halves = (-600..600).map(|k| f64::from(k) / 2.0 + f64::from(k % 3) * 1e-9);
        for x in edges.into_iter().chain(halves) {
            let want = |r: f64| if r.is_nan() { 0 } else { r.clamp(-127.0, 127.0) as i8 };
            assert_eq!(code_f64(x), want(x.round_ties_even()), "{x}");
            let y = x as f32;
            assert_eq!(code_f32(y), want(f64::from(y.round_ties_even())), "{y}");
        }
    }

    proptest! {
        /// The executor's two-pass row quantisation is the reference's, bit for bit: both passes'
        /// codes and scales.
        #[test]
        fn residual_rows_match_the_reference(x in proptest::collection::vec(-1.0e3f32..1.0e3, 1..64), k in 1usize..8) {
            let x = &x[..x.len() / k * k];
            let rows = x.len() / k;
            let (mut codes, mut scales) = (vec![0u8; x.len()], vec![0f32; rows]);
            quantize_rows(x, k, &mut codes, &mut scales);
            let (mut r_codes, mut r_scales) = (vec![0u8; x.len()], vec![0f32; rows]);
            quantize_rows_residual(x, k, (&codes, &scales), &mut r_codes, &mut r_scales);
            let (want_codes, want_scales) = ir::fused::quantize_rows(x, k);
            let (want_r_codes, want_r_scales) = ir::fused::quantize_rows_residual(x, k, &want_codes, &want_scales);
            let as_i8 = |c: &[u8]| c.iter().map(|&c| c as i8).collect::<Vec<_>>();
            prop_assert_eq!(as_i8(&codes), want_codes);
            prop_assert_eq!(scales, want_scales);
            prop_assert_eq!(as_i8(&r_codes), want_r_codes);
            prop_assert_eq!(r_scales, want_r_scales);
        }
    }
}

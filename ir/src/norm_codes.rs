//! `QuantizeRows(x, γ)`: a norm's rows quantised as the exact products `x·γ`, not their f32
//! roundings — the xdna program's form of a norm feeding the array (DESIGN.md, "XDNA: toward
//! one array program per layer"). An f32's 24-bit significand times another's is exact in f64,
//! and on an array core, where γ is a bfloat16 value (8 significant bits, as every norm weight
//! of SmolLM2 is), exact in 32 integer bits: the codes are then shifts and compares of that
//! product, where the f32 product is software floating point.
//!
//! ```text
//! y_j  = x_j·γ_j, exact
//! s    = the smallest f32 power of two with 127·s ≥ max|y| (exactly), at least 2⁻¹²⁶;
//!        1 when max|y| is 0, or when none holds it (max|y| > 127·2¹²⁷: the row is unscalable)
//! c_j  = round_half_even(y_j / s), within ±127 (NaN → 0)
//! r_j  = y_j − c_j·s, exact;   second pass: s′, c′ of r the same way
//!        (an unscalable row's r is taken as 0: s′ = 1, c′ = 0)
//! ```
//!
//! The bounds are the ones a core reaches with shifts: a scale is an f32 power of two, and a
//! remainder of a scalable row is exact in 32 bits.
//!
//! It differs from `QuantizeRows(Mul(x, γ))` only where the f32 product's rounding (2⁻²⁴
//! relative) or the f32 quotient `max/127` in [`crate::fused::quantize_rows_scale`] crosses a
//! boundary: a code, or a scale at an exact `127·2^k`.

/// The largest row maximum a power-of-two f32 scale holds: 127·2¹²⁷.
pub const SCALABLE_MAX: f64 = 127.0 * (1u128 << 127) as f64;

/// The first pass's row scale for a row whose largest |value| is `max` (exact): the smallest
/// power of two `s ≥ 2⁻¹²⁶` with `127·s ≥ max`; 1 for 0, NaN or a maximum past
/// [`SCALABLE_MAX`].
pub fn exact_row_scale(max: f64) -> f64 {
    if !(max > 0.0 && max <= SCALABLE_MAX) {
        return 1.0;
    }
    let floor = f64::from(f32::MIN_POSITIVE);
    let mut s = 2f64.powi((max / 127.0).log2().ceil() as i32).max(floor);
    // The logarithm is rounded: settle on the exact comparisons (127·s is exact).
    while s > floor && 127.0 * (s / 2.0) >= max {
        s /= 2.0;
    }
    while 127.0 * s < max {
        s *= 2.0;
    }
    s
}

/// A row's largest |value|, NaN ignored.
fn row_max(row: &[f64]) -> f64 {
    row.iter().fold(0.0f64, |m, v| m.max(v.abs()))
}

/// One pass over rows of `d` exact values: codes and one scale a row.
fn pass(y: &[f64], d: usize) -> (Vec<i8>, Vec<f64>) {
    let mut codes = Vec::with_capacity(y.len());
    let mut scales = Vec::with_capacity(y.len() / d.max(1));
    for row in y.chunks(d) {
        let s = exact_row_scale(row_max(row));
        scales.push(s);
        codes.extend(row.iter().map(|v| (v / s).round_ties_even().clamp(-127.0, 127.0) as i8));
    }
    (codes, scales)
}

/// `QuantizeRows(x, γ)` on rows of `d = γ.len()` values, in `passes` (1 or 2): the codes of
/// every pass (the second's rows after the first's) and their row scales, as f32.
pub fn quantize_product_rows(x: &[f32], gamma: &[f32], passes: usize) -> (Vec<i8>, Vec<f32>) {
    let d = gamma.len();
    let y: Vec<f64> =
        x.chunks(d).flat_map(|row| row.iter().zip(gamma).map(|(&v, &g)| f64::from(v) * f64::from(g))).collect();
    quantize_exact_rows(&y, d, passes)
}

/// Rows of `d` exact values `y` quantised as the module defines, in `passes` (1 or 2): the
/// codes of every pass (the second's rows after the first's) and their row scales, as f32.
pub fn quantize_exact_rows(y: &[f64], d: usize, passes: usize) -> (Vec<i8>, Vec<f32>) {
    let (mut codes, scales) = pass(y, d);
    let mut all_scales = scales.clone();
    if passes > 1 {
        let r: Vec<f64> = y
            .chunks(d)
            .zip(codes.chunks(d))
            .zip(&scales)
            .flat_map(|((row, c), &s)| {
                let scalable = row_max(row) <= SCALABLE_MAX;
                row.iter().zip(c).map(move |(v, &c)| if scalable { v - f64::from(c) * s } else { 0.0 })
            })
            .collect();
        let (rc, rs) = pass(&r, d);
        codes.extend(rc);
        all_scales.extend(rs);
    }
    (codes, all_scales.into_iter().map(|s| s as f32).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scale_is_the_smallest_power_of_two_that_holds_the_maximum() {
        assert_eq!(exact_row_scale(127.0), 1.0, "127·1 holds 127 exactly");
        assert_eq!(exact_row_scale(127.0 + 1e-9), 2.0);
        assert_eq!(exact_row_scale(63.5), 0.5);
        assert_eq!(exact_row_scale(0.0), 1.0);
        assert_eq!(exact_row_scale(f64::NAN), 1.0);
        assert_eq!(exact_row_scale(SCALABLE_MAX), 2f64.powi(127), "127·2¹²⁷ is held by 2¹²⁷");
        assert_eq!(exact_row_scale(SCALABLE_MAX * (1.0 + 1e-15)), 1.0, "no f32 power of two holds more");
        assert_eq!(exact_row_scale(f64::INFINITY), 1.0);
        assert_eq!(exact_row_scale(1e-45), f64::from(f32::MIN_POSITIVE));
    }

    #[test]
    fn products_are_quantised_exactly_in_two_passes() {
        // 3·(1 + 2⁻²³)·(1 + 2⁻⁷): an f32 product would round the last bits away.
        let x = [3.0 * (1.0 + 2f32.powi(-23)), -1.0, 0.0, 0.25];
        let gamma = [1.0 + 2f32.powi(-7), 2.0, 5.0, 1.0];
        let (codes, scales) = quantize_product_rows(&x, &gamma, 2);
        assert_eq!(scales[0], 2f32.powi(-5), "max|y| ≈ 3.02: 127·2⁻⁵ = 3.97 holds it, 127·2⁻⁶ does not");
        let y0 = 3.0 * (1.0 + 2f64.powi(-23)) * (1.0 + 2f64.powi(-7));
        assert_eq!(codes[..4], [(y0 * 32.0).round() as i8, -64, 0, 8]);
        let r0 = y0 - f64::from(codes[0]) / 32.0;
        let s1 = f64::from(scales[1]);
        assert_eq!(f64::from(codes[4]), (r0 / s1).round_ties_even());
        assert!(127.0 * s1 >= r0.abs() && 127.0 * s1 / 2.0 < r0.abs());
    }

    #[test]
    fn an_unscalable_row_keeps_its_first_pass_only() {
        // 2¹²⁷·255 > 127·2¹²⁷: scale 1, codes clamped; the second pass is empty.
        let (x, gamma) = ([2f32.powi(127), 200.4, -0.3], [255.0, 1.0, 1.0]);
        let (codes, scales) = quantize_product_rows(&x, &gamma, 2);
        assert_eq!(codes, [127, 127, 0, 0, 0, 0]);
        assert_eq!(scales, [1.0, 1.0]);
        let (codes, scales) = quantize_product_rows(&[f32::INFINITY, 3.0], &[1.0, 1.0], 2);
        assert_eq!((codes, scales), (vec![127, 3, 0, 0], vec![1.0, 1.0]));
    }
}

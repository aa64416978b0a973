//! RmsNorm in f32 in one pinned order: the definition the host kernels follow on every
//! instruction set and an array core's code follows step for step, so that a norm computed on
//! the array equals the host's bit for bit (a program's exactness contract; see DESIGN.md, "XDNA:
//! toward one array program per layer").
//!
//! ```text
//! l[0..32] = +0;  for j in 0..d: l[j mod 32] = l[j mod 32] + x_j·x_j  (each product and sum rounded)
//! for n in 16, 8, 4, 2, 1: l[k] = l[k] + l[k + n] for k < n           (the lanes folded by halves)
//! ss = l[0]
//! r = 1 / √(ss/d + ε)
//! y_j = (x_j·r)·γ_j
//! ```
//!
//! Thirty-two lanes are four vectors of eight for an AIE2 core (eight f32 bit patterns to an
//! integer vector) and for AVX2, two for AVX-512: independent accumulators, so the host's sums
//! are not one chain of dependent additions; the folding by halves is how vector lanes reduce.
//! A row padded with zeros has the same sum (+0 added to a lane leaves it), so a vector loop
//! may read a tail with zeros. The products and sums are separate IEEE operations, never
//! fused, and every operation rounds to nearest even.

use crate::graph::{Graph, ValueDef, ValueId};
use crate::DType;

/// The sum of squares' lanes.
pub const LANES: usize = 32;

/// Whether `v` is a constant or weight of f32 values that are all bfloat16 values (their low 16
/// bits zero): 8 significant bits, so a core multiplies an f32's significand by one in 32 bits —
/// what a norm's γ must be for an array core to compute `QuantizeRows(x, γ)`.
pub fn bfloat16_values(g: &Graph, v: ValueId) -> bool {
    let bytes = match &g.value(v).def {
        ValueDef::Weight(w) if g.weights.get(*w).dtype == DType::F32 => g.weights.get(*w).bytes.clone(),
        ValueDef::Const(t) if t.dtype == DType::F32 => t.to_f32_vec().iter().flat_map(|x| x.to_le_bytes()).collect(),
        _ => return false,
    };
    bytes.chunks_exact(4).all(|b| b[0] == 0 && b[1] == 0)
}

/// The sum of the squares of `row`, in the order of the module's definition.
pub fn sum_squares(row: &[f32]) -> f32 {
    let mut lanes = [0f32; LANES];
    for (j, &x) in row.iter().enumerate() {
        lanes[j % LANES] += x * x;
    }
    fold_lanes(lanes)
}

/// The lanes folded by halves: `l[k] + l[k + n]` for `k < n`, `n` from 16 down to 1.
pub fn fold_lanes(mut l: [f32; LANES]) -> f32 {
    let mut n = LANES / 2;
    while n > 0 {
        for k in 0..n {
            l[k] += l[k + n];
        }
        n /= 2;
    }
    l[0]
}

/// `r = 1/√(ss/d + ε)` for a row of `d` values whose squares sum to `ss`.
pub fn inverse_root(ss: f32, d: usize, epsilon: f32) -> f32 {
    1.0 / (ss / d as f32 + epsilon).sqrt()
}

/// Significant bits a value keeps in [`aligned_sum_squares`], on the row's largest exponent.
pub const ALIGNED_BITS: u32 = 11;

/// The longest row [`aligned_sum_squares`] takes: 511 values a lane, so a lane's sum of
/// squares (each at most 2²²) stays below 2³¹.
pub const ALIGNED_MAX_D: usize = 511 * LANES;

/// The sum of squares of `row` in integer terms, for an array core (the xdna program's
/// `InverseRms{squares="aligned"}`): a few integer operations a value where the f32 squares of
/// [`sum_squares`] are software floating point there.
///
/// ```text
/// E     = the largest exponent field of the row (at least 1, a subnormal's exponent)
/// a_j   = x_j's significand (hidden bit included) / 2^(E − e_j + 13), rounded half up:
///         |x_j| / 2^(E − 137) to 11 bits on the largest value's binade (a_j ≤ 2¹¹)
/// l[k]  = Σ a_j² over j ≡ k (mod 32), exact in 32 bits; L[k] = l[k] rounded to f32
/// ss    = fold_lanes(L) · 2^(2E − 274), the exponent added to the bits: +0 when the result
///         would be subnormal, +∞ when it would overflow
/// ```
///
/// A row holding NaN gives NaN and one holding ∞ (and no NaN) +∞, as the f32 sum would. The
/// rounding moves a square by at most about 2⁻¹⁰ of itself, and a value below 2⁻¹¹ of the
/// largest one's binade counts as 0 (its square under 2⁻²² of the largest's); on rows of many
/// values the roundings largely cancel (a uniform row of 2,048: about 10⁻⁵ from the exact sum).
/// Panics on rows longer than [`ALIGNED_MAX_D`].
pub fn aligned_sum_squares(row: &[f32]) -> f32 {
    assert!(row.len() <= ALIGNED_MAX_D, "aligned_sum_squares: a row of {} values", row.len());
    let top = row.iter().map(|x| x.to_bits() & 0x7fff_ffff).max().unwrap_or(0);
    if top > 0x7f80_0000 {
        return f32::NAN;
    }
    if top == 0x7f80_0000 {
        return f32::INFINITY;
    }
    let e_max = (top >> 23).max(1);
    let mut lanes = [0u32; LANES];
    for (j, x) in row.iter().enumerate() {
        let b = x.to_bits();
        let e = (b >> 23) & 0xff;
        let m = (b & 0x007f_ffff) | (e.min(1) << 23);
        let shift = (e_max - e.max(1) + 24 - ALIGNED_BITS).min(31);
        let a = (m + (1 << (shift - 1))) >> shift;
        lanes[j % LANES] += a * a;
    }
    scale_by_power_of_two(fold_lanes(lanes.map(|l| l as f32)), 2 * e_max as i32 - 274)
}

/// `t · 2^k` for a finite `t ≥ 0`, by adding `k` to the exponent field of a normal `t`: +0 when
/// `t` is 0 or the result would be subnormal, +∞ when it would overflow.
fn scale_by_power_of_two(t: f32, k: i32) -> f32 {
    let b = t.to_bits();
    let e = (b >> 23) as i32;
    if b == 0 || e + k <= 0 {
        return 0.0;
    }
    if e + k >= 255 {
        return f32::INFINITY;
    }
    f32::from_bits((b & 0x007f_ffff) | (((e + k) as u32) << 23))
}

/// One row's RmsNorm: `y_j = (x_j·r)·γ_j`. Panics unless `x`, `gamma` and `y` have one length.
pub fn rms_norm_row(x: &[f32], gamma: &[f32], epsilon: f32, y: &mut [f32]) {
    assert!(
        x.len() == gamma.len() && y.len() == x.len(),
        "rms_norm_row: x {}, γ {}, y {}",
        x.len(),
        gamma.len(),
        y.len()
    );
    let r = inverse_root(sum_squares(x), x.len(), epsilon);
    for ((o, &v), &g) in y.iter_mut().zip(x).zip(gamma) {
        *o = (v * r) * g;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_aligned_sum_of_squares_is_exact_on_its_grid_and_close_elsewhere() {
        // Values of at most 11 significant bits on the row's binade are exact.
        assert_eq!(aligned_sum_squares(&[1.0, -2.0, 0.5, 3.0]), 14.25);
        assert_eq!(aligned_sum_squares(&[0.0; 64]), 0.0);
        assert_eq!(aligned_sum_squares(&[3.0e-39, 1.0e-39]), 0.0, "a subnormal sum flushes to 0");
        assert_eq!(aligned_sum_squares(&[1.0e30, 0.0]), f32::INFINITY);
        assert!(aligned_sum_squares(&[1.0, f32::NAN, f32::INFINITY]).is_nan());
        assert_eq!(aligned_sum_squares(&[1.0, f32::NEG_INFINITY]), f32::INFINITY);
        // 1 + 2⁻¹¹ rounds to 1 + 2⁻¹⁰ (half up on the 11-bit grid): (1 + 2⁻¹⁰)².
        let want = (1.0 + 2f64.powi(-10)).powi(2) as f32;
        assert_eq!(aligned_sum_squares(&[1.0 + 2f32.powi(-11)]), want);
        // Below 2⁻¹¹ of the largest binade a value counts as 0.
        assert_eq!(aligned_sum_squares(&[1.0, 2f32.powi(-13)]), 1.0);
        let mut x = 0x2545_f491u32;
        let row: Vec<f32> = (0..2048)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x as f32 / u32::MAX as f32 - 0.5) * 7.0
            })
            .collect();
        let exact: f64 = row.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        let rel = (f64::from(aligned_sum_squares(&row)) - exact).abs() / exact;
        assert!(rel < 2e-5, "relative error {rel}");
    }

    #[test]
    fn the_lanes_sum_in_the_defined_order() {
        // 2²⁴ + 1 + 1 depends on the order: left to right each 1 is lost to rounding (a tie,
        // to even), while the folding adds the ones in lanes 1 and 17 to each other first.
        let mut row = [0f32; 40];
        row[0] = 4096.0;
        row[1] = 1.0;
        row[17] = 1.0;
        // l[1] = 1 + 1 at the first halving, 2²⁴ + 2 exactly at the last.
        assert_eq!(sum_squares(&row), 16_777_218.0);
        let sequential: f32 = row.iter().map(|x| x * x).sum();
        assert_eq!(sequential, 16_777_216.0, "the order matters for this row");
        // Element 32 joins lane 0 after element 0, where the 1 is lost again.
        row[32] = 1.0;
        assert_eq!(sum_squares(&row), 16_777_218.0);
    }

    #[test]
    fn a_row_normalises_to_unit_mean_square() {
        let x: Vec<f32> = (0..40).map(|j| (j as f32 - 19.5) * 0.37).collect();
        let gamma = vec![1.0; 40];
        let mut y = vec![0.0; 40];
        rms_norm_row(&x, &gamma, 0.0, &mut y);
        let ms: f64 = y.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / 40.0;
        assert!((ms - 1.0).abs() < 1e-6, "mean square {ms}");
    }
}

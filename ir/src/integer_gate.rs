//! SwiGlu in integers, quantised as the down projection reads it: `QuantizeSwiGlu(g, u)`, the
//! xdna program's form of a gate feeding the array (DESIGN.md, "XDNA: toward one array program
//! per layer"). The f32 gate costs an array core some 440 cycles a value in software floating
//! point; the gate's inputs and output need far fewer bits than f32 carries (rounding `g`, `u`
//! and the product to float16 leaves the KL over eight prompts where it was), so here every
//! step is an integer one a core computes with 32-bit multiplies, shifts and compares:
//!
//! ```text
//! ĝ, û   = g, u rounded to 11 significant bits, ties to even, in f32's exponent range: the
//!          f32 bits b → (b + 0xfff + (b >> 13 & 1)) with the low 13 bits cleared (overflow →
//!          ±∞; NaN stays NaN). So |ĝ| = M·2^(E−137), M the 11-bit significand (the implicit
//!          bit for E ≥ 1), E the biased exponent (1 for subnormals).
//! σ̂(ĝ)  = S/1024, S an integer in 0..=1024:
//!          |ĝ| ≥ 16: S = 1024 for ĝ > 0, 0 for ĝ < 0;  otherwise, all in i32, never negative:
//!          z = (M·L) >> min(137 − E, 31)         (floor; L = round(log₂e·2¹⁶): z = |ĝ|·log₂e in Q16)
//!          n = z >> 16,  v = 2¹⁶ − (z & 0xffff)  (|ĝ|·log₂e = n + 1 − v/2¹⁶)
//!          p = C₀ + (v·(C₁ + (v·(C₂ + (v·C₃ >> 16)) >> 16)) >> 16)   (2^(v/2¹⁶) in Q15)
//!          e = p >> (n + 1)                      (e^−|ĝ| in Q15)
//!          d = 2¹⁵ + e                           (1 + e in Q15)
//!          y = A − (d·B >> 15);  y = y·(2¹⁶ − (d·y >> 15)) >> 15, twice   (1/d: a linear guess, two Newton steps)
//!          S⁺ = (y + 16) >> 5;   S = S⁺ for a ĝ with its sign bit clear, 1024 − S⁺ otherwise
//! h      = ĝ·σ̂·û, exact: M_g·S·M_u < 2³² (11, 11 and 11 bits)
//! codes, scales = the exact rows of h quantised as `QuantizeRows(x, γ)`'s products are
//!          ([`crate::norm_codes`]): a NaN h (a NaN input, ∞·0) codes 0, an infinite one makes
//!          its row unscalable
//! ```
//!
//! σ̂ is within 0.55 of a unit of its last place (2⁻¹⁰) of σ(ĝ) over every ĝ (`tests`); every
//! product above stays below 2³¹, so a core needs no arithmetic shift.

use crate::norm_codes::quantize_exact_rows;

/// log₂e in Q16.
pub const L: i32 = 94_548;
/// 2^v ≈ C₀ + C₁v + C₂v² + C₃v³ on (0, 1], in Q15 (a near-minimax cubic, 1.1·10⁻⁴ at worst;
/// every coefficient positive, so every step is an unsigned one).
pub const C: [i32; 4] = [32_765, 22_819, 7_357, 2_591];
/// The linear guess of 1/d on [1, 2]: 24/17 − (8/17)·d, in Q15 (within 1/17).
pub const A: i32 = 46_261;
/// 8/17 in Q15.
pub const B: i32 = 15_420;
/// S's unit, σ̂ = S/ONE.
pub const ONE: i32 = 1024;

// The widest intermediates stay below 2³¹ — M·L, v·(C₁ + C₂ + C₃), d·B — and M_g·S·M_u below
// 2³²; the Newton steps' products are checked ([`mul`]) and `tests` run every ĝ through them.
const _: () = assert!(2047 * (L as i64) < 1 << 31);
const _: () = assert!((1 << 16) * ((C[1] + C[2] + C[3]) as i64) < 1 << 31);
const _: () = assert!((1 << 16) * (B as i64) < 1 << 31);
const _: () = assert!(2047 * (ONE as u64) * 2047 < 1 << 32);

/// `a·b`, which the definition keeps below 2³¹ for every ĝ.
fn mul(a: i32, b: i32) -> i32 {
    a.checked_mul(b).expect("σ̂'s products stay below 2³¹")
}

/// `x` rounded to 11 significant bits, ties to even, keeping f32's exponent range (± ∞ past it).
pub fn round11(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let b = x.to_bits();
    f32::from_bits((b + 0xfff + ((b >> 13) & 1)) & !0x1fff)
}

/// S of σ̂(ĝ) = S/1024 for a `ĝ` [`round11`] gives, not NaN.
pub fn sigma_code(g: f32) -> i32 {
    let negative = g.is_sign_negative();
    if g.abs() >= 16.0 {
        return if negative { 0 } else { ONE };
    }
    let b = g.to_bits();
    let biased = ((b >> 23) & 0xff) as i32;
    let m = ((b >> 13) & 0x3ff) as i32 | if biased > 0 { 0x400 } else { 0 };
    let shift = (137 - biased.max(1)).min(31);
    let z = mul(m, L) >> shift;
    let (n, v) = (z >> 16, (1 << 16) - (z & 0xffff));
    let p = C[0] + (mul(v, C[1] + (mul(v, C[2] + (mul(v, C[3]) >> 16)) >> 16)) >> 16);
    let e = p >> (n + 1);
    let d = (1 << 15) + e;
    let mut y = A - (mul(d, B) >> 15);
    for _ in 0..2 {
        y = mul(y, (1 << 16) - (mul(d, y) >> 15)) >> 15;
    }
    let s = (y + 16) >> 5;
    if negative {
        ONE - s
    } else {
        s
    }
}

/// h = ĝ·σ̂(ĝ)·û, exact in f64 (NaN for a NaN input or ∞·0).
pub fn value(g: f32, u: f32) -> f64 {
    let (g, u) = (round11(g), round11(u));
    if g.is_nan() || u.is_nan() {
        return f64::NAN;
    }
    f64::from(g) * f64::from(u) * (f64::from(sigma_code(g)) / f64::from(ONE))
}

/// `QuantizeSwiGlu(g, u)` on rows of `d` values, in `passes` (1 or 2): the codes of every pass
/// (the second's rows after the first's) and their row scales, as f32.
pub fn quantize_gate_rows(g: &[f32], u: &[f32], d: usize, passes: usize) -> (Vec<i8>, Vec<f32>) {
    let h: Vec<f64> = g.iter().zip(u).map(|(&g, &u)| value(g, u)).collect();
    quantize_exact_rows(&h, d, passes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every ĝ below 16 in magnitude with an exponent above 2⁻⁴⁰, of both signs.
    fn every_small_gate() -> impl Iterator<Item = f32> {
        (87u32..=130)
            .flat_map(|e| (0u32..1024).map(move |m| f32::from_bits((e << 23) | (m << 13))))
            .flat_map(|g| [g, -g])
    }

    #[test]
    fn sigma_is_within_a_unit_of_its_last_place() {
        let mut worst = 0f64;
        for g in every_small_gate() {
            let want = 1.0 / (1.0 + (-f64::from(g)).exp());
            worst = worst.max((f64::from(sigma_code(g)) / 1024.0 - want).abs() * 1024.0);
        }
        assert!(worst < 0.55, "worst {worst} units of 2⁻¹⁰");
    }

    #[test]
    fn every_sigma_code_is_within_its_range() {
        for g in every_small_gate() {
            let s = sigma_code(g);
            assert!((0..=ONE).contains(&s), "{g}: S = {s}");
        }
    }

    #[test]
    fn rounding_keeps_eleven_bits_ties_to_even() {
        assert_eq!(round11(1.0 + 2f32.powi(-11)), 1.0, "a tie rounds to the even 1");
        assert_eq!(round11(1.0 + 3.0 * 2f32.powi(-11)), 1.0 + 2f32.powi(-9), "a tie rounds to the even 1 + 2⁻⁹");
        assert_eq!(round11(1.0 + 2f32.powi(-11) + 2f32.powi(-20)), 1.0 + 2f32.powi(-10));
        assert_eq!(round11(-2047.5), -2048.0);
        assert_eq!(round11(f32::MAX), f32::INFINITY, "past f32's range");
        assert_eq!(round11(f32::from_bits(1)), 0.0, "a subnormal's quantum is 2⁻¹³⁶");
        assert_eq!(round11(f32::from_bits(0x1000)), 0.0, "a tie above the even quantum 0 rounds down");
        assert_eq!(round11(f32::from_bits(0x3000)), f32::from_bits(0x4000), "a tie above an odd quantum rounds up");
        assert!(round11(f32::NAN).is_nan());
    }

    #[test]
    fn sigma_saturates_and_is_symmetric() {
        assert_eq!((sigma_code(16.0), sigma_code(-16.0), sigma_code(f32::INFINITY)), (1024, 0, 1024));
        assert_eq!((sigma_code(0.0), sigma_code(-0.0)), (512, 512));
        for g in [0.125f32, 1.0, 3.5, 15.9375] {
            assert_eq!(sigma_code(g) + sigma_code(-g), 1024, "{g}");
        }
    }

    #[test]
    fn the_value_is_silu_times_up_to_ten_bits() {
        for (g, u) in [(-20.0f32, 3.0f32), (-3.5, -1.0), (-0.25, 2.0), (0.7, 0.5), (4.0, -8.0), (30.0, 1.0)] {
            let want = f64::from(g) / (1.0 + (-f64::from(g)).exp()) * f64::from(u);
            let bound = (f64::from(g) * f64::from(u)).abs() * (2f64.powi(-11) + 3.0 * 2f64.powi(-11));
            assert!((value(g, u) - want).abs() <= bound, "{g}·{u}: {} against {want}", value(g, u));
        }
        assert!(value(f32::NAN, 1.0).is_nan());
        assert!(value(f32::INFINITY, 0.0).is_nan(), "∞·0");
        assert!(value(f32::NEG_INFINITY, 2.0).is_nan(), "σ̂(−∞) = 0, ∞·0: codes 0, as silu's limit 0 would");
        assert_eq!(value(f32::INFINITY, -2.0), f64::NEG_INFINITY);
    }
}

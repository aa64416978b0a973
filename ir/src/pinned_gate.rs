//! SwiGlu in f32 in one pinned order: `exp`, the sigmoid and the gate's products as the host
//! kernels compute them on every instruction set and an array core's code would step for step
//! (the exactness contract of DESIGN.md, "XDNA: toward one array program per layer"). Every
//! operation is a separate IEEE one rounded to nearest even — no fused multiply-add, which an
//! array core does not have and which would make a scalar path differ from a vector one.
//!
//! ```text
//! exp(x):  NaN → NaN;  x ≥ 88.72283 → +∞;  x ← max(x, −104)
//!          n = round_half_even(x·log₂e)
//!          r = (x − n·ln2_hi) − n·ln2_lo            (n·ln2_hi exact: ln2_hi has 9 bits)
//!          p = P₀;  p = p·r + Pᵢ for i = 1..5         (Horner, each product and sum rounded)
//!          y = (p·(r·r) + r) + 1
//!          e = (y·2^n₁)·2^n₂,  n₁ = clamp(n, −125, 127), n₂ = n − n₁
//!          (y ≥ 0.7, so y·2^n₁ is normal and exact: a subnormal result rounds once, as
//!          y·2^n would)
//! σ(g):    e = exp(−|g|), d = 1 + e;  g ≥ 0: 1/d,  else e/d   (e never overflows)
//! y     =  (g·σ(g))·u
//! ```
//!
//! About one ulp from e^x for normal results (`tests` bound it at 2); e^x underflows gradually
//! below e^−87.3 and is 0 below e^−103.3.

/// log₂e.
pub const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2's leading 9 bits: `n·LN2_HI` is exact for every `n` the range reduction takes.
pub const LN2_HI: f32 = 0.693_359_4;
/// ln 2 − [`LN2_HI`].
pub const LN2_LO: f32 = -2.121_944_4e-4;
/// e^r − 1 − r ≈ r²·p(r) on |r| ≤ ln2/2: p's coefficients, highest degree first.
pub const P: [f32; 6] = [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 0.5];
/// The least argument whose exp is +∞.
pub const OVERFLOW: f32 = 88.722_83;
/// Arguments below are taken as this one (their exp rounds to 0 alike).
pub const LOWEST: f32 = -104.0;

/// 2^k for an integral `k` in [−126, 127], through the exponent field.
fn pow2(k: f32) -> f32 {
    f32::from_bits(((k as i32 + 127) as u32) << 23)
}

/// e^x by the module's definition.
pub fn exp(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    if x >= OVERFLOW {
        return f32::INFINITY;
    }
    let x = x.max(LOWEST);
    let n = (x * LOG2E).round_ties_even();
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let p = P[1..].iter().fold(P[0], |p, &c| p * r + c);
    let y = (p * (r * r) + r) + 1.0;
    let n1 = n.clamp(-125.0, 127.0);
    (y * pow2(n1)) * pow2(n - n1)
}

/// σ(g) by the module's definition.
pub fn sigmoid(g: f32) -> f32 {
    let e = exp(-g.abs());
    let d = 1.0 + e;
    if g >= 0.0 {
        1.0 / d
    } else {
        e / d
    }
}

/// SwiGlu's `(g·σ(g))·u`.
pub fn swiglu(g: f32, u: f32) -> f32 {
    (g * sigmoid(g)) * u
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Units in the last place between `got` and the f64 value `want` rounded to f32.
    fn ulps(got: f32, want: f64) -> u32 {
        (got.to_bits() as i64 - (want as f32).to_bits() as i64).unsigned_abs() as u32
    }

    #[test]
    fn exp_is_within_two_ulps_over_its_range() {
        let mut worst = 0;
        for i in 0..200_000 {
            let x = -103.0 + 191.7 * i as f32 / 200_000.0;
            let want = f64::from(x).exp();
            if want > f64::from(f32::MIN_POSITIVE) && want < f64::from(f32::MAX) {
                worst = worst.max(ulps(exp(x), want));
            }
        }
        assert!(worst <= 2, "worst {worst} ulps");
    }

    #[test]
    fn exp_edges() {
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(OVERFLOW), f32::INFINITY);
        assert!(exp(88.72).is_finite());
        assert_eq!(exp(-104.0), 0.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert!(exp(f32::NAN).is_nan());
        let tiny = exp(-100.0);
        assert!(tiny > 0.0 && tiny.is_subnormal(), "{tiny:e}");
    }

    #[test]
    fn the_gate_is_silu_times_up() {
        for g in [-20.0f32, -3.5, -0.25, 0.0, 0.7, 4.0, 30.0] {
            let want = f64::from(g) / (1.0 + (-f64::from(g)).exp()) * 1.5;
            let got = swiglu(g, 1.5);
            assert!((f64::from(got) - want).abs() <= 4e-7 * want.abs().max(1e-30), "{g}: {got} against {want}");
        }
        assert!(swiglu(f32::NAN, 1.0).is_nan());
        assert_eq!(swiglu(f32::INFINITY, 1.0), f32::INFINITY);
        assert_eq!(swiglu(-0.0, 1.0).to_bits(), (-0.0f32).to_bits());
    }
}

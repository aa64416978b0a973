//! Gated MLP products. GeluGate: `y = GeluTanh(gate)·up` with GELU's tanh form
//! `0.5·g·(1 + tanh(√(2/π)·(g + 0.044715·g³)))` in f32 (scalar: Gemma-family models only).
//!
//! SwiGlu: `y = Silu(gate)·up = (gate·σ(gate))·up`, with `e = exp(−|g|)` and `σ(g) = 1/(1 + e)`
//! for g ≥ 0, `e/(1 + e)` otherwise (so the exponential never overflows): `ir::pinned_gate`'s
//! definition, `exp` included, which every path computes to the bit (scalar, AVX2, AVX-512;
//! `tests/pinned_gate.rs`), as an array core's code would.

use super::Isa;

/// The activation of a gated MLP product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateActivation {
    /// SiLU: SwiGlu.
    Silu,
    /// GELU's tanh form: GeluGate.
    GeluTanh,
}

/// `y[i] = GeluTanh(gate[i])·up[i]`. Panics on mismatched lengths.
pub fn gelu_gate(gate: &[f32], up: &[f32], y: &mut [f32]) {
    assert!(
        gate.len() == up.len() && y.len() == gate.len(),
        "gelu_gate: gate {}, up {}, y {}",
        gate.len(),
        up.len(),
        y.len()
    );
    const C: f32 = 0.797_884_6;
    for ((o, &g), &u) in y.iter_mut().zip(gate).zip(up) {
        *o = 0.5 * g * (1.0 + (C * (g + 0.044715 * g * g * g)).tanh()) * u;
    }
}

/// `y[i] = Silu(gate[i])·up[i]`. Panics on mismatched lengths.
pub fn swiglu(isa: Isa, gate: &[f32], up: &[f32], y: &mut [f32]) {
    let isa = isa.check();
    assert!(
        gate.len() == up.len() && y.len() == gate.len(),
        "swiglu: gate {}, up {}, y {}",
        gate.len(),
        up.len(),
        y.len()
    );
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the path is available (checked above); lengths are equal.
        Isa::Avx512 | Isa::Avx512Vnni => unsafe { x86::swiglu_512(gate, up, y) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx2 => unsafe { x86::swiglu_256(gate, up, y) },
        _ => swiglu_scalar(gate, up, y),
    }
}

/// SwiGlu over rows laid out `[gate (width) | up (width)]`, as a fused gate/up projection
/// writes them; `y` is `rows × width`.
pub fn swiglu_packed_rows(isa: Isa, gate_up: &[f32], width: usize, y: &mut [f32]) {
    assert!(
        width > 0 && gate_up.len().is_multiple_of(2 * width) && y.len() * 2 == gate_up.len(),
        "swiglu: rows of 2×{width} into {}",
        y.len()
    );
    for (row, out) in gate_up.chunks_exact(2 * width).zip(y.chunks_exact_mut(width)) {
        swiglu(isa, &row[..width], &row[width..], out);
    }
}

/// `ir::pinned_gate::exp`: e^x as every path computes it (see the module's summary).
pub fn exp(x: f32) -> f32 {
    use super::simd::{EXP_LOWEST, EXP_OVERFLOW, EXP_P, LN2_HI, LN2_LO, LOG2E};
    if x.is_nan() {
        return x;
    }
    if x >= EXP_OVERFLOW {
        return f32::INFINITY;
    }
    let x = x.max(EXP_LOWEST);
    let n = (x * LOG2E).round_ties_even();
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let p = EXP_P[1..].iter().fold(EXP_P[0], |p, &c| p * r + c);
    let y = (p * (r * r) + r) + 1.0;
    let n1 = n.clamp(-125.0, 127.0);
    let pow2 = |k: f32| f32::from_bits(((k as i32 + 127) as u32) << 23);
    (y * pow2(n1)) * pow2(n - n1)
}

fn sigmoid(g: f32) -> f32 {
    let e = exp(-g.abs());
    let d = 1.0 + e;
    if g >= 0.0 {
        1.0 / d
    } else {
        e / d
    }
}

fn swiglu_scalar(gate: &[f32], up: &[f32], y: &mut [f32]) {
    for ((o, &g), &u) in y.iter_mut().zip(gate).zip(up) {
        *o = (g * sigmoid(g)) * u;
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use crate::kernels::simd::{exp_256, exp_512};
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
    pub(super) unsafe fn integer_gate_512(gate: &[f32], up: &[f32], y: &mut [f64]) {
        super::integer_gate_lanes(gate, up, y)
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn integer_gate_256(gate: &[f32], up: &[f32], y: &mut [f64]) {
        super::integer_gate_lanes(gate, up, y)
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
    pub(super) unsafe fn swiglu_512(gate: &[f32], up: &[f32], y: &mut [f32]) {
        let one = _mm512_set1_ps(1.0);
        let abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fff_ffff));
        let mut i = 0;
        while i < gate.len() {
            let left = gate.len() - i;
            let m = if left >= 16 { 0xffff } else { ((1u32 << left) - 1) as __mmask16 };
            let g = _mm512_maskz_loadu_ps(m, gate.as_ptr().add(i));
            let e = exp_512(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_and_ps(g, abs_mask)));
            let denom = _mm512_add_ps(one, e);
            let nonneg = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(g, _mm512_setzero_ps());
            let sig = _mm512_mask_blend_ps(nonneg, _mm512_div_ps(e, denom), _mm512_div_ps(one, denom));
            let v = _mm512_mul_ps(_mm512_mul_ps(g, sig), _mm512_maskz_loadu_ps(m, up.as_ptr().add(i)));
            _mm512_mask_storeu_ps(y.as_mut_ptr().add(i), m, v);
            i += 16;
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn swiglu_256(gate: &[f32], up: &[f32], y: &mut [f32]) {
        let one = _mm256_set1_ps(1.0);
        let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
        let mut i = 0;
        while i + 8 <= gate.len() {
            let g = _mm256_loadu_ps(gate.as_ptr().add(i));
            let e = exp_256(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_and_ps(g, abs_mask)));
            let denom = _mm256_add_ps(one, e);
            let nonneg = _mm256_cmp_ps::<_CMP_GE_OQ>(g, _mm256_setzero_ps());
            let sig = _mm256_blendv_ps(_mm256_div_ps(e, denom), _mm256_div_ps(one, denom), nonneg);
            let v = _mm256_mul_ps(_mm256_mul_ps(g, sig), _mm256_loadu_ps(up.as_ptr().add(i)));
            _mm256_storeu_ps(y.as_mut_ptr().add(i), v);
            i += 8;
        }
        super::swiglu_scalar(&gate[i..], &up[i..], &mut y[i..]);
    }
}
/// [`integer_gate`] of every pair of `gate` and `up` into `y`, on the instruction set `isa`:
/// its branch-free steps, which the AVX2 and AVX-512 paths let the compiler take eight and
/// sixteen values at a time. Panics on mismatched lengths.
pub fn integer_gate_row(isa: Isa, gate: &[f32], up: &[f32], y: &mut [f64]) {
    let isa = isa.check();
    assert!(
        gate.len() == up.len() && y.len() == gate.len(),
        "integer_gate_row: gate {}, up {}, y {}",
        gate.len(),
        up.len(),
        y.len()
    );
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the path is available (checked above); lengths are equal.
        Isa::Avx512 | Isa::Avx512Vnni => unsafe { x86::integer_gate_512(gate, up, y) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx2 => unsafe { x86::integer_gate_256(gate, up, y) },
        _ => integer_gate_lanes(gate, up, y),
    }
}

/// [`integer_gate`] of each pair.
#[inline(always)]
fn integer_gate_lanes(gate: &[f32], up: &[f32], y: &mut [f64]) {
    for ((y, &g), &u) in y.iter_mut().zip(gate).zip(up) {
        *y = integer_gate(g, u);
    }
}

/// log₂e in Q16, the cubic's coefficients and the guess's constants of `ir::integer_gate`.
const SIGMA_L: i32 = 94_548;
const SIGMA_C: [i32; 4] = [32_765, 22_819, 7_357, 2_591];
const SIGMA_A: i32 = 46_261;
const SIGMA_B: i32 = 15_420;

/// SwiGlu in integers, `ir::integer_gate`'s definition: `ĝ·σ̂(ĝ)·û` exact in f64 (NaN for a
/// NaN input or ∞·0), ĝ and û the inputs rounded to 11 significant bits; σ̂ = S/1024, 1024 or 0
/// past |ĝ| ≥ 16, otherwise e^−|ĝ| in Q15 by `|ĝ|·log₂e` in Q16, a cubic for 2^(1 − frac) and a
/// shift, then 1/(1 + e) by a linear guess and two Newton steps, cut to 10 bits (1024 − that
/// for a negative ĝ). What `npuc::QuantizeSwiGlu` quantises. Every step is computed and then
/// chosen, as a core does, so a row's loop vectorises: the shift clamped to 7..=31 keeps a
/// saturated (or NaN) ĝ's steps in range, and below 16 it is the definition's; a NaN input
/// stays NaN through the rounding and so makes the product NaN.
#[inline(always)]
pub fn integer_gate(g: f32, u: f32) -> f64 {
    let (g, u) = (round11(g), round11(u));
    let b = g.to_bits();
    let biased = ((b >> 23) & 0xff) as i32;
    let m = ((b >> 13) & 0x3ff) as i32 | (i32::from(biased > 0) << 10);
    let z = (m * SIGMA_L) >> (137 - biased).clamp(7, 31);
    let (n, v) = (z >> 16, (1 << 16) - (z & 0xffff));
    let c = SIGMA_C;
    let e = (c[0] + ((v * (c[1] + ((v * (c[2] + ((v * c[3]) >> 16))) >> 16))) >> 16)) >> (n + 1);
    let d = (1 << 15) + e;
    let mut y = SIGMA_A - ((d * SIGMA_B) >> 15);
    for _ in 0..2 {
        y = (y * ((1 << 16) - ((d * y) >> 15))) >> 15;
    }
    let s = (y + 16) >> 5;
    let negative = (b >> 31) != 0;
    let s = if negative { 1024 - s } else { s };
    let limit = if negative { 0 } else { 1024 };
    let s = if g.abs() >= 16.0 { limit } else { s };
    f64::from(g) * f64::from(u) * (f64::from(s) / 1024.0)
}

/// `x` rounded to 11 significant bits, ties to even, in f32's exponent range (±∞ past it); NaN
/// stays NaN.
#[inline(always)]
fn round11(x: f32) -> f32 {
    let b = x.to_bits();
    let r = f32::from_bits(b.wrapping_add(0xfff + ((b >> 13) & 1)) & !0x1fff);
    if x.is_nan() {
        x
    } else {
        r
    }
}

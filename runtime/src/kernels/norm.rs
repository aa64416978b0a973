//! RmsNorm and SkipRmsNorm over the last axis:
//! `y = x / √(mean(x²) + ε) · γ`; SkipRmsNorm first forms the residual sum
//! `s = x + skip (+ bias)` (in f32, in that order, as onnxruntime does — bit-identical to the
//! reference), writes it out, and normalises it.
//!
//! Every instruction set computes the same bits, in one pinned order that an XDNA core's code
//! follows too (`ir::pinned_norm` states it): the squares accumulate in f32 into 32 lanes,
//! element j into lane j mod 32, each product and sum rounded (not fused); the lanes fold by
//! halves (lane k plus lane k + 16, then k + 8, ... k + 1); then `r = 1/√(ss/d + ε)` and
//! `y = (x·r)·γ`. The difference from the reference (which sums in f64) is a few ulp plus the f32
//! rounding of the sum of squares (relative ≤ d·ε, ~1e-7 in practice).

use super::Isa;

/// `y = RmsNorm(x)·γ` for every row of `x` (rows of `gamma.len()`). Panics on mismatched lengths.
pub fn rms_norm(isa: Isa, x: &[f32], gamma: &[f32], eps: f32, y: &mut [f32]) {
    let isa = isa.check();
    let d = gamma.len();
    assert!(
        d > 0 && x.len().is_multiple_of(d) && y.len() == x.len(),
        "rms_norm: x {} / y {} values for rows of {d}",
        x.len(),
        y.len()
    );
    for (xr, yr) in x.chunks_exact(d).zip(y.chunks_exact_mut(d)) {
        let ss = sum_squares(isa, xr);
        let r = 1.0 / (ss / d as f32 + eps).sqrt();
        scale_rows(isa, xr, r, gamma, yr);
    }
}

/// `npuc::InverseRms`: `r = 1/√(ss/d + ε)` for every row of `d` values of `x`, one value of `r`
/// a row — with [`Squares::F32`], the factor [`rms_norm`] scales the row by, bit for bit. Panics
/// on mismatched lengths, and on aligned rows longer than [`ALIGNED_MAX_D`].
pub fn inverse_rms(isa: Isa, x: &[f32], d: usize, eps: f32, squares: Squares, r: &mut [f32]) {
    let isa = isa.check();
    assert!(d > 0 && x.len() == r.len() * d, "inverse_rms: x {} values, r {} for rows of {d}", x.len(), r.len());
    for (xr, r) in x.chunks_exact(d).zip(r) {
        let ss = match squares {
            Squares::F32 => sum_squares(isa, xr),
            Squares::Aligned => aligned_sum_squares(xr),
        };
        *r = 1.0 / (ss / d as f32 + eps).sqrt();
    }
}

/// How `npuc::InverseRms` sums a row's squares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Squares {
    /// In f32, in the pinned order: [`rms_norm`]'s own sum.
    F32,
    /// In integers on the row's largest exponent (`squares = "aligned"`): see [`aligned_sum_squares`].
    Aligned,
}

/// Significant bits a value keeps in [`aligned_sum_squares`].
const ALIGNED_BITS: u32 = 11;

/// The longest row [`aligned_sum_squares`] takes (511 values a lane: a lane's sum stays below 2³¹).
pub const ALIGNED_MAX_D: usize = 511 * LANES;

/// The xdna program's sum of squares in integer terms (`ir::pinned_norm::aligned_sum_squares`
/// defines it): each value's significand on the row's largest exponent `E`, rounded half up to
/// [`ALIGNED_BITS`] bits, squared into 32 integer lanes; the lanes rounded to f32 and folded by
/// halves; then `· 2^(2E − 274)` on the exponent field (+0 below the normal range, +∞ above).
/// NaN in the row gives NaN, ∞ gives +∞.
fn aligned_sum_squares(row: &[f32]) -> f32 {
    assert!(row.len() <= ALIGNED_MAX_D, "aligned squares: a row of {} values", row.len());
    let top = row.iter().map(|x| x.to_bits() & 0x7fff_ffff).max().unwrap_or(0);
    if top >= 0x7f80_0000 {
        return if top == 0x7f80_0000 { f32::INFINITY } else { f32::NAN };
    }
    let e_max = (top >> 23).max(1);
    let mut lanes = [0u32; LANES];
    for block in row.chunks(LANES) {
        for (l, x) in lanes.iter_mut().zip(block) {
            let b = x.to_bits();
            let e = (b >> 23) & 0xff;
            let m = (b & 0x007f_ffff) | (e.min(1) << 23);
            let shift = (e_max - e.max(1) + 24 - ALIGNED_BITS).min(31);
            let a = (m + (1 << (shift - 1))) >> shift;
            *l += a * a;
        }
    }
    let t = fold_lanes(lanes.map(|l| l as f32));
    let (bits, k) = (t.to_bits(), 2 * e_max as i32 - 274);
    let e = (bits >> 23) as i32;
    if bits == 0 || e + k <= 0 {
        0.0
    } else if e + k >= 255 {
        f32::INFINITY
    } else {
        f32::from_bits((bits & 0x007f_ffff) | (((e + k) as u32) << 23))
    }
}

/// SkipRmsNorm: `sum = x + skip (+ bias)`, `y = RmsNorm(sum)·γ`. `skip` holds whole rows and
/// repeats over `x` when shorter (a `[S, hidden]` skip under a `[B, S, hidden]` input).
#[allow(clippy::too_many_arguments)]
pub fn skip_rms_norm(
    isa: Isa,
    x: &[f32],
    skip: &[f32],
    gamma: &[f32],
    bias: Option<&[f32]>,
    eps: f32,
    y: &mut [f32],
    sum: &mut [f32],
) {
    assert_eq!(sum.len(), x.len(), "skip_rms_norm: sum holds {} values, x {}", sum.len(), x.len());
    sum.copy_from_slice(x);
    skip_rms_norm_in_place(isa, sum, skip, gamma, bias, eps, y);
}

/// SkipRmsNorm that adds into the residual stream: `residual += skip (+ bias)`, then
/// `y = RmsNorm(residual)·γ`. Addition commutes exactly in IEEE arithmetic, so this equals
/// [`skip_rms_norm`] with `x = residual`.
pub fn skip_rms_norm_in_place(
    isa: Isa,
    residual: &mut [f32],
    skip: &[f32],
    gamma: &[f32],
    bias: Option<&[f32]>,
    eps: f32,
    y: &mut [f32],
) {
    let isa = isa.check();
    let d = gamma.len();
    assert!(
        d > 0
            && residual.len().is_multiple_of(d)
            && y.len() == residual.len()
            && !skip.is_empty()
            && skip.len().is_multiple_of(d)
            && residual.len().is_multiple_of(skip.len()),
        "skip_rms_norm: residual {}, skip {}, y {} values for rows of {d}",
        residual.len(),
        skip.len(),
        y.len()
    );
    if let Some(b) = bias {
        assert_eq!(b.len(), d, "skip_rms_norm: bias holds {} values, not {d}", b.len());
    }
    let skip_rows = skip.len() / d;
    for (i, (sr, yr)) in residual.chunks_exact_mut(d).zip(y.chunks_exact_mut(d)).enumerate() {
        let kr = &skip[(i % skip_rows) * d..][..d];
        for (s, &k) in sr.iter_mut().zip(kr) {
            *s += k;
        }
        if let Some(b) = bias {
            for (s, &bv) in sr.iter_mut().zip(b) {
                *s += bv;
            }
        }
        let ss = sum_squares(isa, sr);
        let r = 1.0 / (ss / d as f32 + eps).sqrt();
        scale_rows(isa, sr, r, gamma, yr);
    }
}

/// The row's lanes of squares: element j's square added to lane j mod [`LANES`].
const LANES: usize = 32;

/// The sum of squares in the pinned order (see the module's documentation): [`LANES`]
/// accumulators, then folded by halves. The vector paths run the whole 32-value blocks, four
/// AVX2 or two AVX-512 registers of lanes, a product and a sum each (never fused); the tail and
/// the folding are the same scalar code on every path.
fn sum_squares(isa: Isa, x: &[f32]) -> f32 {
    let mut lanes = [0f32; LANES];
    let blocks = x.len() / LANES * LANES;
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the caller checked the path is available.
        Isa::Avx512 | Isa::Avx512Vnni => unsafe { x86::square_lanes_512(&x[..blocks], &mut lanes) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx2 => unsafe { x86::square_lanes_256(&x[..blocks], &mut lanes) },
        _ => {
            for block in x[..blocks].chunks_exact(LANES) {
                for (l, &v) in lanes.iter_mut().zip(block) {
                    *l += v * v;
                }
            }
        }
    }
    for (l, &v) in lanes.iter_mut().zip(&x[blocks..]) {
        *l += v * v;
    }
    fold_lanes(lanes)
}

/// `l[k] + l[k + n]` for `k < n`, `n` from 16 down to 1.
fn fold_lanes(mut l: [f32; LANES]) -> f32 {
    let mut n = LANES / 2;
    while n > 0 {
        for k in 0..n {
            l[k] += l[k + n];
        }
        n /= 2;
    }
    l[0]
}

/// `y = (x·r)·γ`.
fn scale_rows(isa: Isa, x: &[f32], r: f32, gamma: &[f32], y: &mut [f32]) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the caller checked the path is available.
        Isa::Avx512 | Isa::Avx512Vnni => unsafe { x86::scale_512(x, r, gamma, y) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx2 => unsafe { x86::scale_256(x, r, gamma, y) },
        _ => {
            for ((o, &v), &g) in y.iter_mut().zip(x).zip(gamma) {
                *o = (v * r) * g;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// `lanes[k] += x[j]²` for every `j ≡ k` mod 32, over whole blocks of 32: two registers
    /// of 16 lanes.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
    pub(super) unsafe fn square_lanes_512(x: &[f32], lanes: &mut [f32; 32]) {
        let mut acc = [_mm512_loadu_ps(lanes.as_ptr()), _mm512_loadu_ps(lanes.as_ptr().add(16))];
        for block in x.chunks_exact(32) {
            for (j, a) in acc.iter_mut().enumerate() {
                let v = _mm512_loadu_ps(block.as_ptr().add(16 * j));
                *a = _mm512_add_ps(*a, _mm512_mul_ps(v, v));
            }
        }
        _mm512_storeu_ps(lanes.as_mut_ptr(), acc[0]);
        _mm512_storeu_ps(lanes.as_mut_ptr().add(16), acc[1]);
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
    pub(super) unsafe fn scale_512(x: &[f32], r: f32, gamma: &[f32], y: &mut [f32]) {
        let rv = _mm512_set1_ps(r);
        let mut i = 0;
        while i < x.len() {
            let m = if x.len() - i >= 16 { 0xffff } else { ((1u32 << (x.len() - i)) - 1) as __mmask16 };
            let v = _mm512_mul_ps(
                _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x.as_ptr().add(i)), rv),
                _mm512_maskz_loadu_ps(m, gamma.as_ptr().add(i)),
            );
            _mm512_mask_storeu_ps(y.as_mut_ptr().add(i), m, v);
            i += 16;
        }
    }

    /// `lanes[k] += x[j]²` for every `j ≡ k` mod 32, over whole blocks of 32: four registers
    /// of 8 lanes.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn square_lanes_256(x: &[f32], lanes: &mut [f32; 32]) {
        let mut acc = [0, 8, 16, 24].map(|at| _mm256_loadu_ps(lanes.as_ptr().add(at)));
        for block in x.chunks_exact(32) {
            for (j, a) in acc.iter_mut().enumerate() {
                let v = _mm256_loadu_ps(block.as_ptr().add(8 * j));
                *a = _mm256_add_ps(*a, _mm256_mul_ps(v, v));
            }
        }
        for (j, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(lanes.as_mut_ptr().add(8 * j), *a);
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn scale_256(x: &[f32], r: f32, gamma: &[f32], y: &mut [f32]) {
        let rv = _mm256_set1_ps(r);
        let mut i = 0;
        while i + 8 <= x.len() {
            let v = _mm256_mul_ps(
                _mm256_mul_ps(_mm256_loadu_ps(x.as_ptr().add(i)), rv),
                _mm256_loadu_ps(gamma.as_ptr().add(i)),
            );
            _mm256_storeu_ps(y.as_mut_ptr().add(i), v);
            i += 8;
        }
        for j in i..x.len() {
            y[j] = (x[j] * r) * gamma[j];
        }
    }
}

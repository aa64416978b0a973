//! Small SIMD helpers shared by the float kernels: horizontal sums and a vector `exp`.

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::*;

// e^x = 2^n · e^r with n = round(x·log₂e), r = x − n·ln2 (ln2 split in two so n·ln2_hi is exact),
// e^r by a degree-7 polynomial: the pinned definition `ir::pinned_gate::exp`, whose scalar twin is
// `super::swiglu::exp`, every product and sum rounded on its own — no fused multiply-add — so
// scalar, AVX2, AVX-512 and an array core agree to the bit. About one ulp for normal results,
// gradual underflow below e^−87.3 (to 0 under e^−104), +∞ from 88.72 on, NaN kept. The constants
// are shared by every path.
pub(crate) const LOG2E: f32 = std::f32::consts::LOG2_E;
pub(crate) const LN2_HI: f32 = 0.693_359_4;
pub(crate) const LN2_LO: f32 = -2.121_944_4e-4;
pub(crate) const EXP_P: [f32; 6] = [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 0.5];
pub(crate) const EXP_LOWEST: f32 = -104.0;
pub(crate) const EXP_OVERFLOW: f32 = 88.722_83;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{EXP_LOWEST as LOWEST, EXP_OVERFLOW as OVERFLOW, EXP_P as P, LN2_HI, LN2_LO, LOG2E};
    use std::arch::x86_64::*;

    /// Sum of the eight lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn hsum_256(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps::<0b01>(s, s));
        _mm_cvtss_f32(s)
    }

    /// 2^k for integral k in [−126, 127], through the exponent field.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn pow2_256(k: __m256) -> __m256 {
        _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127))))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn exp_256(x: __m256) -> __m256 {
        // `max_ps`/`min_ps` return their second operand when either is NaN: NaN goes through.
        let xc = _mm256_min_ps(_mm256_set1_ps(OVERFLOW), _mm256_max_ps(_mm256_set1_ps(LOWEST), x));
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
            xc,
            _mm256_set1_ps(LOG2E),
        ));
        let r = _mm256_sub_ps(xc, _mm256_mul_ps(n, _mm256_set1_ps(LN2_HI)));
        let r = _mm256_sub_ps(r, _mm256_mul_ps(n, _mm256_set1_ps(LN2_LO)));
        let mut p = _mm256_set1_ps(P[0]);
        for &c in &P[1..] {
            p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(c));
        }
        let y = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(p, _mm256_mul_ps(r, r)), r), _mm256_set1_ps(1.0));
        // n ∈ [−150, 128]: scale by 2^n1 (n1 ≥ −125, so y·2^n1 stays normal and exact, y ≥ 0.7)
        // then 2^n2 (n2 ∈ [−25, 1]), so that subnormal results round once, in the last product.
        let n1 = _mm256_min_ps(_mm256_max_ps(n, _mm256_set1_ps(-125.0)), _mm256_set1_ps(127.0));
        let n2 = _mm256_sub_ps(n, n1);
        let e = _mm256_mul_ps(_mm256_mul_ps(y, pow2_256(n1)), pow2_256(n2));
        _mm256_blendv_ps(e, _mm256_set1_ps(f32::INFINITY), _mm256_cmp_ps::<_CMP_GE_OQ>(x, _mm256_set1_ps(OVERFLOW)))
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
    pub(crate) unsafe fn exp_512(x: __m512) -> __m512 {
        let xc = _mm512_min_ps(_mm512_set1_ps(OVERFLOW), _mm512_max_ps(_mm512_set1_ps(LOWEST), x));
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(
            xc,
            _mm512_set1_ps(LOG2E),
        ));
        let r = _mm512_sub_ps(xc, _mm512_mul_ps(n, _mm512_set1_ps(LN2_HI)));
        let r = _mm512_sub_ps(r, _mm512_mul_ps(n, _mm512_set1_ps(LN2_LO)));
        let mut p = _mm512_set1_ps(P[0]);
        for &c in &P[1..] {
            p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(c));
        }
        let y = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(p, _mm512_mul_ps(r, r)), r), _mm512_set1_ps(1.0));
        // scalef computes y · 2^n rounded once, with gradual underflow and overflow to ∞: the
        // definition's (y·2^n1)·2^n2, whose first product is exact.
        let e = _mm512_scalef_ps(y, n);
        let over = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, _mm512_set1_ps(OVERFLOW));
        _mm512_mask_mov_ps(e, over, _mm512_set1_ps(f32::INFINITY))
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::kernels::Isa;
    use std::arch::x86_64::*;

    /// The largest relative error of the vector `exp` against f64 `exp` over normal results, about
    /// one f32 ulp (measured: 8.2e-8 on both paths).
    /// Attention takes it of `s − max ≤ 0`, SwiGLU of `−|g|`: the tests sweep [−87.3, 0].
    const MAX_RELATIVE_ERROR: f64 = 1.2e-7;
    /// e^−87.33 is the smallest normal f32; below, results are subnormal and the error is absolute.
    const SMALLEST_NORMAL_INPUT: f32 = -87.33;

    /// `exp` of each value on each available vector path.
    fn vector_exps(x: &[f32]) -> Vec<(Isa, Vec<f32>)> {
        let mut out = Vec::new();
        if Isa::Avx2.is_available() {
            let y = x.chunks(8).flat_map(|c| {
                let mut lanes = [0f32; 8];
                lanes[..c.len()].copy_from_slice(c);
                // SAFETY: AVX2 and FMA are available (checked above).
                unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), exp_256(_mm256_loadu_ps(lanes.as_ptr()))) };
                lanes.into_iter().take(c.len()).collect::<Vec<_>>()
            });
            out.push((Isa::Avx2, y.collect()));
        }
        if Isa::Avx512.is_available() {
            let y = x.chunks(16).flat_map(|c| {
                let mut lanes = [0f32; 16];
                lanes[..c.len()].copy_from_slice(c);
                // SAFETY: AVX-512 F/BW/VL, AVX2 and FMA are available (checked above).
                unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), exp_512(_mm512_loadu_ps(lanes.as_ptr()))) };
                lanes.into_iter().take(c.len()).collect::<Vec<_>>()
            });
            out.push((Isa::Avx512, y.collect()));
        }
        out
    }

    #[test]
    fn vector_exp_is_within_its_stated_error_of_f64_exp_on_attention_scores() {
        let steps = 1 << 20;
        let x: Vec<f32> = (0..=steps).map(|i| SMALLEST_NORMAL_INPUT * i as f32 / steps as f32).collect();
        for (isa, y) in vector_exps(&x) {
            let worst = x
                .iter()
                .zip(&y)
                .map(|(&x, &y)| ((y as f64 - (x as f64).exp()) / (x as f64).exp()).abs())
                .fold(0f64, f64::max);
            eprintln!("{isa}: exp within {worst:.3e} relative on [{SMALLEST_NORMAL_INPUT}, 0]");
            assert!(worst <= MAX_RELATIVE_ERROR, "{isa}: exp off by {worst:e} relative");
        }
    }

    #[test]
    fn vector_exp_of_zero_is_one_and_of_very_negative_scores_zero() {
        let x = [0.0, -0.0, -104.0, -150.0, -1e4, -3.4e38, f32::NEG_INFINITY];
        for (isa, y) in vector_exps(&x) {
            assert_eq!(y[..2], [1.0, 1.0], "{isa}");
            assert!(y[2..].iter().all(|&y| y == 0.0), "{isa}: {y:?}");
        }
    }

    #[test]
    fn vector_exp_underflows_gradually_below_the_normal_range() {
        let x: Vec<f32> = (0..=4096).map(|i| SMALLEST_NORMAL_INPUT - 16.0 * i as f32 / 4096.0).collect();
        for (isa, y) in vector_exps(&x) {
            for (&x, &y) in x.iter().zip(&y) {
                let want = (x as f64).exp();
                // Within one subnormal step, and beyond rounding of the normal range.
                let step = f32::from_bits(1) as f64;
                assert!(
                    (y as f64 - want).abs() <= step + want * MAX_RELATIVE_ERROR,
                    "{isa}: exp({x}) = {y:e}, not {want:e}"
                );
            }
        }
    }
}

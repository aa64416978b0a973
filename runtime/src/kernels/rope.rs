//! Rotary position embedding over the last axis, in place, with full-width cos/sin (as
//! `npuc::Rope` defines it):
//!
//! - rotate-half: `y = x·cos + [−x₂, x₁]·sin` (x₁, x₂ the two halves of the row);
//! - interleaved: pairs (2i, 2i+1), `y₂ᵢ = x₂ᵢ·cos₂ᵢ − x₂ᵢ₊₁·sin₂ᵢ`, `y₂ᵢ₊₁ = x₂ᵢ₊₁·cos₂ᵢ₊₁ + x₂ᵢ·sin₂ᵢ₊₁`.
//!
//! Each output is two rounded products and one rounded sum, exactly as the reference computes
//! it (no fused multiply-add), so every path is bit-identical to the reference.
//!
//! Rows of `x` pick their cos/sin row as `(row / rows_per_cos_row) % cos_rows`: a `[B, H, S, D]`
//! tensor with `[S, D]` tables uses `rows_per_cos_row = 1`; `[B, S, H, D]` uses H.

use super::Isa;

/// Rotates every row of `x` (rows of `d`) in place. Panics on mismatched lengths or odd `d`.
pub fn rope_in_place(
    isa: Isa,
    x: &mut [f32],
    d: usize,
    cos: &[f32],
    sin: &[f32],
    rows_per_cos_row: usize,
    interleaved: bool,
) {
    let isa = isa.check();
    assert!(
        d > 0 && d.is_multiple_of(2) && x.len().is_multiple_of(d),
        "rope: {} values are not rows of an even width {d}",
        x.len()
    );
    assert!(
        !cos.is_empty() && cos.len() == sin.len() && cos.len().is_multiple_of(d) && rows_per_cos_row > 0,
        "rope: cos {} / sin {} values for rows of {d}",
        cos.len(),
        sin.len()
    );
    let cos_rows = cos.len() / d;
    for (i, row) in x.chunks_exact_mut(d).enumerate() {
        let t = (i / rows_per_cos_row) % cos_rows;
        let (c, s) = (&cos[t * d..(t + 1) * d], &sin[t * d..(t + 1) * d]);
        match isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the path is available (checked above); the slices have d elements each.
            Isa::Avx512 | Isa::Avx512Vnni => unsafe { x86::row_512(row, c, s, interleaved) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            Isa::Avx2 => unsafe { x86::row_256(row, c, s, interleaved) },
            _ => row_scalar(row, c, s, interleaved),
        }
    }
}

fn row_scalar(x: &mut [f32], c: &[f32], s: &[f32], interleaved: bool) {
    let d = x.len();
    if interleaved {
        for j in (0..d).step_by(2) {
            let (a, b) = (x[j], x[j + 1]);
            x[j] = a * c[j] - b * s[j];
            x[j + 1] = b * c[j + 1] + a * s[j + 1];
        }
    } else {
        let h = d / 2;
        for j in 0..h {
            let (a, b) = (x[j], x[j + h]);
            x[j] = a * c[j] - b * s[j];
            x[j + h] = b * c[j + h] + a * s[j + h];
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
    pub(super) unsafe fn row_512(x: &mut [f32], c: &[f32], s: &[f32], interleaved: bool) {
        let d = x.len();
        let (xp, cp, sp) = (x.as_mut_ptr(), c.as_ptr(), s.as_ptr());
        let mask = |left: usize| if left >= 16 { 0xffff } else { ((1u32 << left) - 1) as __mmask16 };
        if interleaved {
            // Negate the even lanes of the swapped-pair product.
            let even_sign = _mm512_castsi512_ps(_mm512_set1_epi64(0x8000_0000));
            let mut j = 0;
            while j < d {
                let m = mask(d - j);
                let v = _mm512_maskz_loadu_ps(m, xp.add(j));
                let swapped = _mm512_permute_ps::<0b1011_0001>(v);
                let t = _mm512_xor_ps(_mm512_mul_ps(swapped, _mm512_maskz_loadu_ps(m, sp.add(j))), even_sign);
                let y = _mm512_add_ps(_mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, cp.add(j))), t);
                _mm512_mask_storeu_ps(xp.add(j), m, y);
                j += 16;
            }
        } else {
            let h = d / 2;
            let mut j = 0;
            while j < h {
                let m = mask(h - j);
                let a = _mm512_maskz_loadu_ps(m, xp.add(j));
                let b = _mm512_maskz_loadu_ps(m, xp.add(h + j));
                let lo = _mm512_sub_ps(
                    _mm512_mul_ps(a, _mm512_maskz_loadu_ps(m, cp.add(j))),
                    _mm512_mul_ps(b, _mm512_maskz_loadu_ps(m, sp.add(j))),
                );
                let hi = _mm512_add_ps(
                    _mm512_mul_ps(b, _mm512_maskz_loadu_ps(m, cp.add(h + j))),
                    _mm512_mul_ps(a, _mm512_maskz_loadu_ps(m, sp.add(h + j))),
                );
                _mm512_mask_storeu_ps(xp.add(j), m, lo);
                _mm512_mask_storeu_ps(xp.add(h + j), m, hi);
                j += 16;
            }
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn row_256(x: &mut [f32], c: &[f32], s: &[f32], interleaved: bool) {
        let d = x.len();
        let (xp, cp, sp) = (x.as_mut_ptr(), c.as_ptr(), s.as_ptr());
        if interleaved {
            let even_sign = _mm256_castsi256_ps(_mm256_set1_epi64x(0x8000_0000));
            let mut j = 0;
            while j + 8 <= d {
                let v = _mm256_loadu_ps(xp.add(j));
                let swapped = _mm256_permute_ps::<0b1011_0001>(v);
                let t = _mm256_xor_ps(_mm256_mul_ps(swapped, _mm256_loadu_ps(sp.add(j))), even_sign);
                let y = _mm256_add_ps(_mm256_mul_ps(v, _mm256_loadu_ps(cp.add(j))), t);
                _mm256_storeu_ps(xp.add(j), y);
                j += 8;
            }
            super::row_scalar(&mut x[j..], &c[j..], &s[j..], true);
        } else {
            let h = d / 2;
            let mut j = 0;
            while j + 8 <= h {
                let a = _mm256_loadu_ps(xp.add(j));
                let b = _mm256_loadu_ps(xp.add(h + j));
                let lo = _mm256_sub_ps(
                    _mm256_mul_ps(a, _mm256_loadu_ps(cp.add(j))),
                    _mm256_mul_ps(b, _mm256_loadu_ps(sp.add(j))),
                );
                let hi = _mm256_add_ps(
                    _mm256_mul_ps(b, _mm256_loadu_ps(cp.add(h + j))),
                    _mm256_mul_ps(a, _mm256_loadu_ps(sp.add(h + j))),
                );
                _mm256_storeu_ps(xp.add(j), lo);
                _mm256_storeu_ps(xp.add(h + j), hi);
                j += 8;
            }
            for jj in j..h {
                let (a, b) = (x[jj], x[jj + h]);
                x[jj] = a * c[jj] - b * s[jj];
                x[jj + h] = b * c[jj + h] + a * s[jj + h];
            }
        }
    }
}

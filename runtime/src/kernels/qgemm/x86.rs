//! The x86 QGemm kernels: P[r][c] = Σₖ a_u[r, k]·w_s[k, c] for one 16-column panel.

// Kernels index several per-row register arrays with one row index; explicit indices keep
// them in registers after unrolling.
#![allow(clippy::needless_range_loop)]

use super::{QGemmWeights, Rows, Tile, GROUP_BYTES};
use crate::kernels::Isa;
use std::arch::x86_64::*;

/// # Safety
/// The CPU must have `isa`'s features; rows `r0..r0 + r` and panel `p` must be in range.
pub(super) unsafe fn panel(isa: Isa, w: &QGemmWeights, p: usize, rows: &Rows, r0: usize, r: usize, tile: &mut Tile) {
    macro_rules! by_rows {
        ($f:ident, $($n:literal)*) => {
            match r {
                $($n => $f::<$n>(w, p, rows, r0, tile),)*
                _ => unreachable!("row chunk of {r}"),
            }
        };
    }
    match isa {
        Isa::Avx512Vnni => by_rows!(vnni, 1 2 3 4 5 6 7 8),
        Isa::Avx512 => by_rows!(bw, 1 2 3 4 5 6 7 8),
        _ => by_rows!(avx2, 1 2),
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
unsafe fn vnni<const R: usize>(w: &QGemmWeights, p: usize, rows: &Rows, r0: usize, tile: &mut Tile) {
    let groups = w.groups();
    let codes = w.codes.as_ptr().add(p * groups * GROUP_BYTES);
    let mut acc0 = [_mm512_setzero_si512(); R];
    let mut acc1 = [_mm512_setzero_si512(); R];
    let a = rows.unsigned.as_ptr();
    let mut g = 0;
    while g + 2 <= groups {
        let v0 = _mm512_loadu_si512(codes.add(g * GROUP_BYTES) as *const __m512i);
        let v1 = _mm512_loadu_si512(codes.add((g + 1) * GROUP_BYTES) as *const __m512i);
        for r in 0..R {
            let ap = a.add((r0 + r) * rows.stride + 4 * g) as *const i32;
            acc0[r] = _mm512_dpbusd_epi32(acc0[r], _mm512_set1_epi32(ap.read_unaligned()), v0);
            acc1[r] = _mm512_dpbusd_epi32(acc1[r], _mm512_set1_epi32(ap.add(1).read_unaligned()), v1);
        }
        g += 2;
    }
    if g < groups {
        let v0 = _mm512_loadu_si512(codes.add(g * GROUP_BYTES) as *const __m512i);
        for r in 0..R {
            let ap = a.add((r0 + r) * rows.stride + 4 * g) as *const i32;
            acc0[r] = _mm512_dpbusd_epi32(acc0[r], _mm512_set1_epi32(ap.read_unaligned()), v0);
        }
    }
    for r in 0..R {
        _mm512_storeu_si512(tile[r].as_mut_ptr() as *mut __m512i, _mm512_add_epi32(acc0[r], acc1[r]));
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn bw<const R: usize>(w: &QGemmWeights, p: usize, rows: &Rows, r0: usize, tile: &mut Tile) {
    let groups = w.groups();
    let codes = w.codes.as_ptr().add(p * groups * GROUP_BYTES);
    // Lanes (2c, 2c+1) of each accumulator hold the two pair sums of column c.
    let mut lo = [_mm512_setzero_si512(); R];
    let mut hi = [_mm512_setzero_si512(); R];
    let a = rows.wide.as_ptr();
    for g in 0..groups {
        let v = codes.add(g * GROUP_BYTES);
        let w_lo = _mm512_cvtepi8_epi16(_mm256_loadu_si256(v as *const __m256i));
        let w_hi = _mm512_cvtepi8_epi16(_mm256_loadu_si256(v.add(32) as *const __m256i));
        for r in 0..R {
            let a4 = _mm512_set1_epi64((a.add((r0 + r) * rows.stride + 4 * g) as *const i64).read_unaligned());
            lo[r] = _mm512_add_epi32(lo[r], _mm512_madd_epi16(w_lo, a4));
            hi[r] = _mm512_add_epi32(hi[r], _mm512_madd_epi16(w_hi, a4));
        }
    }
    let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    for r in 0..R {
        let sum = _mm512_add_epi32(
            _mm512_permutex2var_epi32(lo[r], even, hi[r]),
            _mm512_permutex2var_epi32(lo[r], odd, hi[r]),
        );
        _mm512_storeu_si512(tile[r].as_mut_ptr() as *mut __m512i, sum);
    }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn avx2<const R: usize>(w: &QGemmWeights, p: usize, rows: &Rows, r0: usize, tile: &mut Tile) {
    let groups = w.groups();
    let codes = w.codes.as_ptr().add(p * groups * GROUP_BYTES);
    // acc[r][q]: columns 4q..4q+4, two pair sums each.
    let mut acc = [[_mm256_setzero_si256(); 4]; R];
    let a = rows.wide.as_ptr();
    for g in 0..groups {
        let v = codes.add(g * GROUP_BYTES);
        let wq = [
            _mm256_cvtepi8_epi16(_mm_loadu_si128(v as *const __m128i)),
            _mm256_cvtepi8_epi16(_mm_loadu_si128(v.add(16) as *const __m128i)),
            _mm256_cvtepi8_epi16(_mm_loadu_si128(v.add(32) as *const __m128i)),
            _mm256_cvtepi8_epi16(_mm_loadu_si128(v.add(48) as *const __m128i)),
        ];
        for r in 0..R {
            let a4 = _mm256_set1_epi64x((a.add((r0 + r) * rows.stride + 4 * g) as *const i64).read_unaligned());
            for q in 0..4 {
                acc[r][q] = _mm256_add_epi32(acc[r][q], _mm256_madd_epi16(wq[q], a4));
            }
        }
    }
    for r in 0..R {
        // hadd gives [c0 c1 c4 c5 | c2 c3 c6 c7]; the permute restores column order.
        let first = _mm256_permute4x64_epi64::<0xd8>(_mm256_hadd_epi32(acc[r][0], acc[r][1]));
        let second = _mm256_permute4x64_epi64::<0xd8>(_mm256_hadd_epi32(acc[r][2], acc[r][3]));
        _mm256_storeu_si256(tile[r].as_mut_ptr() as *mut __m256i, first);
        _mm256_storeu_si256(tile[r].as_mut_ptr().add(8) as *mut __m256i, second);
    }
}

//! The x86 WGemm kernels. AVX-512 kernels compute a whole 16-column panel per vector; AVX2
//! kernels compute it as two halves of 8 columns (the second half's bytes are the upper 32 of
//! each 64-byte group, already in L1 after the first).
//!
//! Integer paths, for 4-bit codes q ∈ [0, 15] and int8 activations a ∈ [−127, 127]:
//! - VNNI: `vpdpbusd` takes the codes as its unsigned operand and the activations as the signed
//!   one, exactly (no saturation).
//! - AVX2 / AVX-512BW: `vpmaddubsw` (u8 × s8 → pairs summed into i16) cannot saturate
//!   (2·15·127 = 3810, and four such sums 15240 < 32767), then `vpmaddwd` by ones widens to i32.
//!
//! For 8-bit codes q ∈ [0, 255], `vpmaddubsw` would saturate (2·255·127 > 32767), so the
//! non-VNNI paths flip the codes to x = q − 128 ∈ [−128, 127] and multiply |x| (≤ 128 as u8) by
//! a with x's sign (≤ 2·128·127 = 32512), then add 128·Σa back in integers: the same dot.
//!
//! Exact (f32) paths keep four accumulators per row in every kernel, the products of k ≡ j
//! (mod 4) in accumulator j, summed as (a₀ + a₁) + (a₂ + a₃) at each block's end: a row's bits do
//! not depend on how many rows share its chunk (4 per AVX-512 call, 2 per AVX2 call, what the
//! registers hold), so a block of rows gives each row what a call on that row alone gives.

// Kernels index several per-row register arrays with one row index; explicit indices keep
// them in registers after unrolling.
#![allow(clippy::needless_range_loop)]

use super::{Rows, Tile, WGemmWeights, WGemmZeroPoints, GROUP_BYTES, PANEL};
use crate::kernels::Isa;
use std::arch::x86_64::*;

/// Raw views of the activation rows; bounds were checked by `wgemm`.
#[derive(Clone, Copy)]
struct F32Rows {
    a: *const f32,
    stride: usize,
    sums: *const f32,
}

#[derive(Clone, Copy)]
struct I8Rows {
    codes: *const i8,
    stride: usize,
    scales: *const f32,
    sums: *const i32,
}

/// Dispatches on the path, the precision, the bit width and the row count.
///
/// # Safety
/// The CPU must have `isa`'s features; rows `r0..r0 + r` and panel `p` must be in range.
pub(super) unsafe fn panel(isa: Isa, w: &WGemmWeights, p: usize, rows: &Rows, r0: usize, r: usize, tile: &mut Tile) {
    macro_rules! by_rows {
        ($f:ident, $x:expr, $($n:literal)*) => {
            match r {
                $($n => $f::<$n>(w, p, $x, r0, tile),)*
                _ => unreachable!("row chunk of {r}"),
            }
        };
    }
    match (*rows, isa, w.bits) {
        (Rows::Exact { a, stride, sums }, Isa::Avx2, bits) => {
            let x = F32Rows { a: a.as_ptr(), stride, sums: sums.as_ptr() };
            if bits == 4 {
                by_rows!(exact_q4_avx2, x, 1 2)
            } else {
                by_rows!(exact_q8_avx2, x, 1 2)
            }
        }
        (Rows::Exact { a, stride, sums }, _, bits) => {
            let x = F32Rows { a: a.as_ptr(), stride, sums: sums.as_ptr() };
            if bits == 4 {
                by_rows!(exact_q4_512, x, 1 2 3 4)
            } else {
                by_rows!(exact_q8_512, x, 1 2 3 4)
            }
        }
        (Rows::Int8 { codes, stride, scales, sums }, isa, bits) => {
            let x = I8Rows { codes: codes.as_ptr(), stride, scales: scales.as_ptr(), sums: sums.as_ptr() };
            match (isa, bits) {
                (Isa::Avx2, 4) => by_rows!(int8_q4_avx2, x, 1 2 3 4),
                (Isa::Avx2, _) => by_rows!(int8_q8_avx2, x, 1 2 3 4),
                (Isa::Avx512, 4) => by_rows!(int8_q4_bw, x, 1 2 3 4 5 6 7 8),
                (Isa::Avx512, _) => by_rows!(int8_q8_bw, x, 1 2 3 4 5 6 7 8),
                (_, 4) => by_rows!(int8_q4_vnni, x, 1 2 3 4 5 6 7 8),
                (_, _) => by_rows!(int8_q8_vnni, x, 1 2 3 4 5 6 7 8),
            }
        }
    }
}

// ---------------------------------------------------------------------------------- AVX-512

/// The 16 zero points of (panel p, block b) as f32.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn zeros_512(w: &WGemmWeights, param: usize) -> __m512 {
    match w.zero_points {
        WGemmZeroPoints::Default => _mm512_set1_ps((1u32 << (w.bits - 1)) as f32),
        WGemmZeroPoints::U8(z) => {
            _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(z.as_ptr().add(param) as *const __m128i)))
        }
        WGemmZeroPoints::F32(z) => _mm512_loadu_ps(z.as_ptr().add(param)),
    }
}

/// `y += s·s_a·(dot − z·Σa_q)` for R rows of one block: the epilogue every int8 path shares.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn int8_epilogue_512<const R: usize>(
    w: &WGemmWeights,
    param: usize,
    x: I8Rows,
    r0: usize,
    b: usize,
    dots: &[__m512i; R],
    yacc: &mut [__m512; R],
) {
    let blocks = w.blocks();
    let s = _mm512_loadu_ps(w.scales.as_ptr().add(param));
    let z = zeros_512(w, param);
    for r in 0..R {
        let i = (r0 + r) * blocks + b;
        let d = _mm512_fnmadd_ps(z, _mm512_set1_ps(*x.sums.add(i) as f32), _mm512_cvtepi32_ps(dots[r]));
        let sc = _mm512_mul_ps(s, _mm512_set1_ps(*x.scales.add(i)));
        yacc[r] = _mm512_fmadd_ps(d, sc, yacc[r]);
    }
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn store_512<const R: usize>(yacc: &[__m512; R], tile: &mut Tile) {
    for r in 0..R {
        _mm512_storeu_ps(tile[r].as_mut_ptr(), yacc[r]);
    }
}

/// Four bytes of the activation row as one broadcast i32.
#[inline(always)]
unsafe fn bcast4(p: *const i8) -> i32 {
    (p as *const i32).read_unaligned()
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn exact_q4_512<const R: usize>(w: &WGemmWeights, p: usize, x: F32Rows, r0: usize, tile: &mut Tile) {
    let (blocks, bs) = (w.blocks(), w.block_size);
    let nib = _mm512_set1_epi8(0x0f);
    let byte = _mm512_set1_epi32(0xff);
    let mut codes = w.codes.as_ptr().add(p * blocks * w.block_bytes());
    let mut yacc = [_mm512_setzero_ps(); R];
    for b in 0..blocks {
        let mut acc = [[_mm512_setzero_ps(); 4]; R];
        for g in 0..bs / 8 {
            let v = _mm512_loadu_si512(codes as *const __m512i);
            codes = codes.add(GROUP_BYTES);
            let k0 = b * bs + g * 8;
            let planes = [_mm512_and_si512(v, nib), _mm512_and_si512(_mm512_srli_epi16::<4>(v), nib)];
            for (h, &pl) in planes.iter().enumerate() {
                let lanes = [
                    _mm512_and_si512(pl, byte),
                    _mm512_and_si512(_mm512_srli_epi32::<8>(pl), byte),
                    _mm512_and_si512(_mm512_srli_epi32::<16>(pl), byte),
                    _mm512_srli_epi32::<24>(pl),
                ];
                for (j, &l) in lanes.iter().enumerate() {
                    let wf = _mm512_cvtepi32_ps(l);
                    for r in 0..R {
                        let av = _mm512_set1_ps(*x.a.add((r0 + r) * x.stride + k0 + 4 * h + j));
                        acc[r][j] = _mm512_fmadd_ps(wf, av, acc[r][j]);
                    }
                }
            }
        }
        exact_epilogue_512(w, (p * blocks + b) * PANEL, x, r0, b, &acc, &mut yacc);
    }
    store_512(&yacc, tile);
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn exact_q8_512<const R: usize>(w: &WGemmWeights, p: usize, x: F32Rows, r0: usize, tile: &mut Tile) {
    let (blocks, bs) = (w.blocks(), w.block_size);
    let byte = _mm512_set1_epi32(0xff);
    let mut codes = w.codes.as_ptr().add(p * blocks * w.block_bytes());
    let mut yacc = [_mm512_setzero_ps(); R];
    for b in 0..blocks {
        let mut acc = [[_mm512_setzero_ps(); 4]; R];
        for g in 0..bs / 4 {
            let v = _mm512_loadu_si512(codes as *const __m512i);
            codes = codes.add(GROUP_BYTES);
            let k0 = b * bs + g * 4;
            let lanes = [
                _mm512_and_si512(v, byte),
                _mm512_and_si512(_mm512_srli_epi32::<8>(v), byte),
                _mm512_and_si512(_mm512_srli_epi32::<16>(v), byte),
                _mm512_srli_epi32::<24>(v),
            ];
            for (j, &l) in lanes.iter().enumerate() {
                let wf = _mm512_cvtepi32_ps(l);
                for r in 0..R {
                    let av = _mm512_set1_ps(*x.a.add((r0 + r) * x.stride + k0 + j));
                    acc[r][j] = _mm512_fmadd_ps(wf, av, acc[r][j]);
                }
            }
        }
        exact_epilogue_512(w, (p * blocks + b) * PANEL, x, r0, b, &acc, &mut yacc);
    }
    store_512(&yacc, tile);
}

/// `y += s·(Σ q·a − z·Σa)` for R rows of one block.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn exact_epilogue_512<const R: usize>(
    w: &WGemmWeights,
    param: usize,
    x: F32Rows,
    r0: usize,
    b: usize,
    acc: &[[__m512; 4]; R],
    yacc: &mut [__m512; R],
) {
    let s = _mm512_loadu_ps(w.scales.as_ptr().add(param));
    let z = zeros_512(w, param);
    for r in 0..R {
        let a = &acc[r];
        let sum = _mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3]));
        let asum = _mm512_set1_ps(*x.sums.add((r0 + r) * w.blocks() + b));
        yacc[r] = _mm512_fmadd_ps(_mm512_fnmadd_ps(z, asum, sum), s, yacc[r]);
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
unsafe fn int8_q4_vnni<const R: usize>(w: &WGemmWeights, p: usize, x: I8Rows, r0: usize, tile: &mut Tile) {
    let (blocks, bs) = (w.blocks(), w.block_size);
    let nib = _mm512_set1_epi8(0x0f);
    let mut codes = w.codes.as_ptr().add(p * blocks * w.block_bytes());
    let mut yacc = [_mm512_setzero_ps(); R];
    for b in 0..blocks {
        let mut lo_acc = [_mm512_setzero_si512(); R];
        let mut hi_acc = [_mm512_setzero_si512(); R];
        for g in 0..bs / 8 {
            let v = _mm512_loadu_si512(codes as *const __m512i);
            codes = codes.add(GROUP_BYTES);
            let lo = _mm512_and_si512(v, nib);
            let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), nib);
            for r in 0..R {
                let ap = x.codes.add((r0 + r) * x.stride + b * bs + g * 8);
                lo_acc[r] = _mm512_dpbusd_epi32(lo_acc[r], lo, _mm512_set1_epi32(bcast4(ap)));
                hi_acc[r] = _mm512_dpbusd_epi32(hi_acc[r], hi, _mm512_set1_epi32(bcast4(ap.add(4))));
            }
        }
        let mut dots = [_mm512_setzero_si512(); R];
        for r in 0..R {
            dots[r] = _mm512_add_epi32(lo_acc[r], hi_acc[r]);
        }
        int8_epilogue_512(w, (p * blocks + b) * PANEL, x, r0, b, &dots, &mut yacc);
    }
    store_512(&yacc, tile);
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
unsafe fn int8_q8_vnni<const R: usize>(w: &WGemmWeights, p: usize, x: I8Rows, r0: usize, tile: &mut Tile) {
    let (blocks, bs) = (w.blocks(), w.block_size);
    let mut codes = w.codes.as_ptr().add(p * blocks * w.block_bytes());
    let mut yacc = [_mm512_setzero_ps(); R];
    for b in 0..blocks {
        let mut acc0 = [_mm512_setzero_si512(); R];
        let mut acc1 = [_mm512_setzero_si512(); R];
        for g in (0..bs / 4).step_by(2) {
            let v0 = _mm512_loadu_si512(codes as *const __m512i);
            let v1 = _mm512_loadu_si512(codes.add(GROUP_BYTES) as *const __m512i);
            codes = codes.add(2 * GROUP_BYTES);
            for r in 0..R {
                let ap = x.codes.add((r0 + r) * x.stride + b * bs + g * 4);
                acc0[r] = _mm512_dpbusd_epi32(acc0[r], v0, _mm512_set1_epi32(bcast4(ap)));
                acc1[r] = _mm512_dpbusd_epi32(acc1[r], v1, _mm512_set1_epi32(bcast4(ap.add(4))));
            }
        }
        let mut dots = [_mm512_setzero_si512(); R];
        for r in 0..R {
            dots[r] = _mm512_add_epi32(acc0[r], acc1[r]);
        }
        int8_epilogue_512(w, (p * blocks + b) * PANEL, x, r0, b, &dots, &mut yacc);
    }
    store_512(&yacc, tile);
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn int8_q4_bw<const R: usize>(w: &WGemmWeights, p: usize, x: I8Rows, r0: usize, tile: &mut Tile) {
    let (blocks, bs) = (w.blocks(), w.block_size);
    let nib = _mm512_set1_epi8(0x0f);
    let ones = _mm512_set1_epi16(1);
    let mut codes = w.codes.as_ptr().add(p * blocks * w.block_bytes());
    let mut yacc = [_mm512_setzero_ps(); R];
    for b in 0..blocks {
        let mut acc = [_mm512_setzero_si512(); R];
        // Two groups (16 k) per step: four i16 pair sums of at most 3810 each stay below 2¹⁵.
        for g in (0..bs / 8).step_by(2) {
            let v0 = _mm512_loadu_si512(codes as *const __m512i);
            let v1 = _mm512_loadu_si512(codes.add(GROUP_BYTES) as *const __m512i);
            codes = codes.add(2 * GROUP_BYTES);
            let lo0 = _mm512_and_si512(v0, nib);
            let hi0 = _mm512_and_si512(_mm512_srli_epi16::<4>(v0), nib);
            let lo1 = _mm512_and_si512(v1, nib);
            let hi1 = _mm512_and_si512(_mm512_srli_epi16::<4>(v1), nib);
            for r in 0..R {
                let ap = x.codes.add((r0 + r) * x.stride + b * bs + g * 8);
                let p0 = _mm512_add_epi16(
                    _mm512_maddubs_epi16(lo0, _mm512_set1_epi32(bcast4(ap))),
                    _mm512_maddubs_epi16(hi0, _mm512_set1_epi32(bcast4(ap.add(4)))),
                );
                let p1 = _mm512_add_epi16(
                    _mm512_maddubs_epi16(lo1, _mm512_set1_epi32(bcast4(ap.add(8)))),
                    _mm512_maddubs_epi16(hi1, _mm512_set1_epi32(bcast4(ap.add(12)))),
                );
                acc[r] = _mm512_add_epi32(acc[r], _mm512_madd_epi16(_mm512_add_epi16(p0, p1), ones));
            }
        }
        int8_epilogue_512(w, (p * blocks + b) * PANEL, x, r0, b, &acc, &mut yacc);
    }
    store_512(&yacc, tile);
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn int8_q8_bw<const R: usize>(w: &WGemmWeights, p: usize, x: I8Rows, r0: usize, tile: &mut Tile) {
    let (blocks, bs) = (w.blocks(), w.block_size);
    let flip = _mm512_set1_epi8(-128);
    let ones = _mm512_set1_epi16(1);
    let zero = _mm512_setzero_si512();
    let mut codes = w.codes.as_ptr().add(p * blocks * w.block_bytes());
    let mut yacc = [_mm512_setzero_ps(); R];
    for b in 0..blocks {
        let mut acc = [_mm512_setzero_si512(); R];
        for g in 0..bs / 4 {
            let v = _mm512_loadu_si512(codes as *const __m512i);
            codes = codes.add(GROUP_BYTES);
            let xs = _mm512_xor_si512(v, flip);
            let mag = _mm512_abs_epi8(xs);
            let neg = _mm512_movepi8_mask(xs);
            for r in 0..R {
                let av = _mm512_set1_epi32(bcast4(x.codes.add((r0 + r) * x.stride + b * bs + g * 4)));
                let signed = _mm512_mask_sub_epi8(av, neg, zero, av);
                acc[r] = _mm512_add_epi32(acc[r], _mm512_madd_epi16(_mm512_maddubs_epi16(mag, signed), ones));
            }
        }
        let mut dots = [_mm512_setzero_si512(); R];
        for r in 0..R {
            let sum = *x.sums.add((r0 + r) * blocks + b);
            dots[r] = _mm512_add_epi32(acc[r], _mm512_set1_epi32(128 * sum));
        }
        int8_epilogue_512(w, (p * blocks + b) * PANEL, x, r0, b, &dots, &mut yacc);
    }
    store_512(&yacc, tile);
}

// ---------------------------------------------------------------------------------- AVX2

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn zeros_256(w: &WGemmWeights, param: usize) -> __m256 {
    match w.zero_points {
        WGemmZeroPoints::Default => _mm256_set1_ps((1u32 << (w.bits - 1)) as f32),
        WGemmZeroPoints::U8(z) => {
            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(z.as_ptr().add(param) as *const __m128i)))
        }
        WGemmZeroPoints::F32(z) => _mm256_loadu_ps(z.as_ptr().add(param)),
    }
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn int8_epilogue_256<const R: usize>(
    w: &WGemmWeights,
    param: usize,
    x: I8Rows,
    r0: usize,
    b: usize,
    dots: &[__m256i; R],
    yacc: &mut [__m256; R],
) {
    let blocks = w.blocks();
    let s = _mm256_loadu_ps(w.scales.as_ptr().add(param));
    let z = zeros_256(w, param);
    for r in 0..R {
        let i = (r0 + r) * blocks + b;
        let d = _mm256_fnmadd_ps(z, _mm256_set1_ps(*x.sums.add(i) as f32), _mm256_cvtepi32_ps(dots[r]));
        let sc = _mm256_mul_ps(s, _mm256_set1_ps(*x.scales.add(i)));
        yacc[r] = _mm256_fmadd_ps(d, sc, yacc[r]);
    }
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn store_half<const R: usize>(yacc: &[__m256; R], half: usize, tile: &mut Tile) {
    for r in 0..R {
        _mm256_storeu_ps(tile[r].as_mut_ptr().add(8 * half), yacc[r]);
    }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn exact_q4_avx2<const R: usize>(w: &WGemmWeights, p: usize, x: F32Rows, r0: usize, tile: &mut Tile) {
    let (blocks, bs) = (w.blocks(), w.block_size);
    let nib = _mm256_set1_epi8(0x0f);
    let byte = _mm256_set1_epi32(0xff);
    for half in 0..2 {
        let mut codes = w.codes.as_ptr().add(p * blocks * w.block_bytes() + 32 * half);
        let mut yacc = [_mm256_setzero_ps(); R];
        for b in 0..blocks {
            let mut acc = [[_mm256_setzero_ps(); 4]; R];
            for g in 0..bs / 8 {
                let v = _mm256_loadu_si256(codes as *const __m256i);
                codes = codes.add(GROUP_BYTES);
                let k0 = b * bs + g * 8;
                let planes = [_mm256_and_si256(v, nib), _mm256_and_si256(_mm256_srli_epi16::<4>(v), nib)];
                for (h, &pl) in planes.iter().enumerate() {
                    let lanes = [
                        _mm256_and_si256(pl, byte),
                        _mm256_and_si256(_mm256_srli_epi32::<8>(pl), byte),
                        _mm256_and_si256(_mm256_srli_epi32::<16>(pl), byte),
                        _mm256_srli_epi32::<24>(pl),
                    ];
                    for (j, &l) in lanes.iter().enumerate() {
                        let wf = _mm256_cvtepi32_ps(l);
                        for r in 0..R {
                            let av = _mm256_set1_ps(*x.a.add((r0 + r) * x.stride + k0 + 4 * h + j));
                            acc[r][j] = _mm256_fmadd_ps(wf, av, acc[r][j]);
                        }
                    }
                }
            }
            exact_epilogue_256(w, (p * blocks + b) * PANEL + 8 * half, x, r0, b, &acc, &mut yacc);
        }
        store_half(&yacc, half, tile);
    }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn exact_q8_avx2<const R: usize>(w: &WGemmWeights, p: usize, x: F32Rows, r0: usize, tile: &mut Tile) {
    let (blocks, bs) = (w.blocks(), w.block_size);
    let byte = _mm256_set1_epi32(0xff);
    for half in 0..2 {
        let mut codes = w.codes.as_ptr().add(p * blocks * w.block_bytes() + 32 * half);
        let mut yacc = [_mm256_setzero_ps(); R];
        for b in 0..blocks {
            let mut acc = [[_mm256_setzero_ps(); 4]; R];
            for g in 0..bs / 4 {
                let v = _mm256_loadu_si256(codes as *const __m256i);
                codes = codes.add(GROUP_BYTES);
                let k0 = b * bs + g * 4;
                let lanes = [
                    _mm256_and_si256(v, byte),
                    _mm256_and_si256(_mm256_srli_epi32::<8>(v), byte),
                    _mm256_and_si256(_mm256_srli_epi32::<16>(v), byte),
                    _mm256_srli_epi32::<24>(v),
                ];
                for (j, &l) in lanes.iter().enumerate() {
                    let wf = _mm256_cvtepi32_ps(l);
                    for r in 0..R {
                        let av = _mm256_set1_ps(*x.a.add((r0 + r) * x.stride + k0 + j));
                        acc[r][j] = _mm256_fmadd_ps(wf, av, acc[r][j]);
                    }
                }
            }
            exact_epilogue_256(w, (p * blocks + b) * PANEL + 8 * half, x, r0, b, &acc, &mut yacc);
        }
        store_half(&yacc, half, tile);
    }
}

#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn exact_epilogue_256<const R: usize>(
    w: &WGemmWeights,
    param: usize,
    x: F32Rows,
    r0: usize,
    b: usize,
    acc: &[[__m256; 4]; R],
    yacc: &mut [__m256; R],
) {
    let s = _mm256_loadu_ps(w.scales.as_ptr().add(param));
    let z = zeros_256(w, param);
    for r in 0..R {
        let a = &acc[r];
        let sum = _mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3]));
        let asum = _mm256_set1_ps(*x.sums.add((r0 + r) * w.blocks() + b));
        yacc[r] = _mm256_fmadd_ps(_mm256_fnmadd_ps(z, asum, sum), s, yacc[r]);
    }
}

/// Both 8-column halves of the panel in one pass over its codes, so that each broadcast of four
/// activation codes serves the 16 columns of a 64-byte group (the kernel is bound by its
/// instructions on AVX2, not by memory).
#[target_feature(enable = "avx2,fma")]
unsafe fn int8_q4_avx2<const R: usize>(w: &WGemmWeights, p: usize, x: I8Rows, r0: usize, tile: &mut Tile) {
    let (blocks, bs) = (w.blocks(), w.block_size);
    let nib = _mm256_set1_epi8(0x0f);
    let ones = _mm256_set1_epi16(1);
    let mut codes = w.codes.as_ptr().add(p * blocks * w.block_bytes());
    let mut yacc = [[_mm256_setzero_ps(); R]; 2];
    for b in 0..blocks {
        let mut acc = [[_mm256_setzero_si256(); R]; 2];
        for g in (0..bs / 8).step_by(2) {
            // Group g then g + 1; in each, bytes 0..32 are columns 0..8 and 32..64 columns 8..16.
            let v = [0, 32, GROUP_BYTES, GROUP_BYTES + 32].map(|o| _mm256_loadu_si256(codes.add(o) as *const __m256i));
            codes = codes.add(2 * GROUP_BYTES);
            let lo = v.map(|v| _mm256_and_si256(v, nib));
            let hi = v.map(|v| _mm256_and_si256(_mm256_srli_epi16::<4>(v), nib));
            for r in 0..R {
                let ap = x.codes.add((r0 + r) * x.stride + b * bs + g * 8);
                let a = [0, 4, 8, 12].map(|o| _mm256_set1_epi32(bcast4(ap.add(o))));
                for half in 0..2 {
                    let p0 =
                        _mm256_add_epi16(_mm256_maddubs_epi16(lo[half], a[0]), _mm256_maddubs_epi16(hi[half], a[1]));
                    let p1 = _mm256_add_epi16(
                        _mm256_maddubs_epi16(lo[2 + half], a[2]),
                        _mm256_maddubs_epi16(hi[2 + half], a[3]),
                    );
                    acc[half][r] = _mm256_add_epi32(acc[half][r], _mm256_madd_epi16(_mm256_add_epi16(p0, p1), ones));
                }
            }
        }
        for half in 0..2 {
            int8_epilogue_256(w, (p * blocks + b) * PANEL + 8 * half, x, r0, b, &acc[half], &mut yacc[half]);
        }
    }
    for half in 0..2 {
        store_half(&yacc[half], half, tile);
    }
}

/// As [`int8_q4_avx2`]: both halves in one pass, one broadcast per four activation codes.
#[target_feature(enable = "avx2,fma")]
unsafe fn int8_q8_avx2<const R: usize>(w: &WGemmWeights, p: usize, x: I8Rows, r0: usize, tile: &mut Tile) {
    let (blocks, bs) = (w.blocks(), w.block_size);
    let flip = _mm256_set1_epi8(-128);
    let ones = _mm256_set1_epi16(1);
    let mut codes = w.codes.as_ptr().add(p * blocks * w.block_bytes());
    let mut yacc = [[_mm256_setzero_ps(); R]; 2];
    for b in 0..blocks {
        let mut acc = [[_mm256_setzero_si256(); R]; 2];
        for g in 0..bs / 4 {
            let xs = [0, 32].map(|o| _mm256_xor_si256(_mm256_loadu_si256(codes.add(o) as *const __m256i), flip));
            codes = codes.add(GROUP_BYTES);
            let mag = xs.map(|v| _mm256_abs_epi8(v));
            for r in 0..R {
                let av = _mm256_set1_epi32(bcast4(x.codes.add((r0 + r) * x.stride + b * bs + g * 4)));
                for half in 0..2 {
                    let signed = _mm256_sign_epi8(av, xs[half]);
                    acc[half][r] = _mm256_add_epi32(
                        acc[half][r],
                        _mm256_madd_epi16(_mm256_maddubs_epi16(mag[half], signed), ones),
                    );
                }
            }
        }
        for half in 0..2 {
            let mut dots = [_mm256_setzero_si256(); R];
            for r in 0..R {
                let sum = *x.sums.add((r0 + r) * blocks + b);
                dots[r] = _mm256_add_epi32(acc[half][r], _mm256_set1_epi32(128 * sum));
            }
            int8_epilogue_256(w, (p * blocks + b) * PANEL + 8 * half, x, r0, b, &dots, &mut yacc[half]);
        }
    }
    for half in 0..2 {
        store_half(&yacc[half], half, tile);
    }
}

//! f32 GEMM / GEMV for float models: `y[m, n] = Σₖ a[m, k]·W(k, n) (+ bias[n])`, with W stored
//! either as `[K, N]` row-major (ONNX MatMul's B) or transposed as `[N, K]` (a tied lm_head that
//! reads the embedding table `[vocab, hidden]`). No packing: both layouts are read in place.
//!
//! - `[K, N]`: each task owns a range of columns; for a tile of 64 columns (32 with AVX2) and a
//!   chunk of rows, every k broadcasts `a[r, k]` against the tile's slice of row k of W. The last
//!   partial tile uses masked loads and stores.
//! - `[N, K]`: every output is a dot product of two contiguous rows; four columns and a chunk of
//!   rows run together, with masked loads for the K tail.
//!
//! Accumulation is in f32 (the reference accumulates in f64): the difference is bounded by
//! `K·ε·Σₖ |a·w|` and is far smaller in practice.

use super::pool::ThreadPool;
use super::{split_range, Isa, SyncPtr};

/// How W is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightLayout {
    /// `[K, N]` row-major.
    KN,
    /// `[N, K]` row-major (W transposed).
    NK,
}

/// Columns per task unit.
const UNIT: usize = 64;

/// `y = a·W (+ bias)`; `a` is `m × k`, `y` is `m × n`. Panics when a length does not fit.
#[allow(clippy::too_many_arguments)]
pub fn gemm_f32(
    isa: Isa,
    pool: &ThreadPool,
    a: &[f32],
    m: usize,
    k: usize,
    w: &[f32],
    n: usize,
    layout: WeightLayout,
    bias: Option<&[f32]>,
    y: &mut [f32],
) {
    let isa = isa.check();
    assert_eq!(a.len(), m * k, "gemm_f32: a holds {} values, not {m}×{k}", a.len());
    assert_eq!(w.len(), k * n, "gemm_f32: w holds {} values, not {k}×{n}", w.len());
    assert_eq!(y.len(), m * n, "gemm_f32: y holds {} values, not {m}×{n}", y.len());
    if let Some(b) = bias {
        assert_eq!(b.len(), n, "gemm_f32: bias holds {} values, not {n}", b.len());
    }
    if m == 0 || n == 0 {
        return;
    }
    let units = n.div_ceil(UNIT);
    let tasks = if pool.threads() == 1 { 1 } else { units.min(pool.threads() * 4) };
    let out = SyncPtr(y.as_mut_ptr());
    pool.run(tasks, &|t| {
        let r = split_range(units, tasks, t);
        let cols = (r.start * UNIT)..(r.end * UNIT).min(n);
        let job = Job { a, m, k, w, n, bias, y: out.get(), cols };
        match isa {
            Isa::Scalar => job.scalar(layout),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the CPU has the path's features (checked above); the tasks' column ranges
            // are disjoint, so their writes to y are too.
            _ => unsafe { x86::run(isa, &job, layout) },
            #[cfg(not(target_arch = "x86_64"))]
            _ => job.scalar(layout),
        }
    });
}

/// One task's share: all rows, columns `cols`.
pub(crate) struct Job<'a> {
    a: &'a [f32],
    m: usize,
    k: usize,
    w: &'a [f32],
    n: usize,
    bias: Option<&'a [f32]>,
    y: *mut f32,
    cols: std::ops::Range<usize>,
}

impl Job<'_> {
    fn scalar(&self, layout: WeightLayout) {
        let (k, n) = (self.k, self.n);
        for r in 0..self.m {
            let a = &self.a[r * k..(r + 1) * k];
            for c in self.cols.clone() {
                let mut acc = 0.0f32;
                match layout {
                    WeightLayout::KN => {
                        for (kk, &x) in a.iter().enumerate() {
                            acc += x * self.w[kk * n + c];
                        }
                    }
                    WeightLayout::NK => {
                        for (&x, &wv) in a.iter().zip(&self.w[c * k..(c + 1) * k]) {
                            acc += x * wv;
                        }
                    }
                }
                // SAFETY: c is in this task's columns and r < m.
                unsafe { *self.y.add(r * n + c) = acc + self.bias.map_or(0.0, |b| b[c]) };
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
// Kernels index several per-row register arrays with one row index.
#[allow(clippy::needless_range_loop)]
mod x86 {
    use super::{Job, WeightLayout};
    use crate::kernels::Isa;
    use std::arch::x86_64::*;

    /// # Safety
    /// The CPU must have `isa`'s features; `job` must describe valid buffers.
    pub(super) unsafe fn run(isa: Isa, job: &Job, layout: WeightLayout) {
        match (isa, layout) {
            (Isa::Avx2, WeightLayout::KN) => kn_avx2(job),
            (Isa::Avx2, WeightLayout::NK) => nk_avx2(job),
            (_, WeightLayout::KN) => kn_512(job),
            (_, WeightLayout::NK) => nk_512(job),
        }
    }

    fn mask16(left: usize) -> __mmask16 {
        if left >= 16 {
            0xffff
        } else {
            ((1u32 << left) - 1) as __mmask16
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
    unsafe fn kn_512(job: &Job) {
        let mut c0 = job.cols.start;
        while c0 < job.cols.end {
            let width = (job.cols.end - c0).min(64);
            let masks = [0, 1, 2, 3].map(|i| mask16(width.saturating_sub(16 * i)));
            let mut r0 = 0;
            while r0 < job.m {
                match job.m - r0 {
                    1 => kn_tile_512::<1>(job, r0, c0, &masks),
                    2 => kn_tile_512::<2>(job, r0, c0, &masks),
                    3 => kn_tile_512::<3>(job, r0, c0, &masks),
                    _ => kn_tile_512::<4>(job, r0, c0, &masks),
                }
                r0 += (job.m - r0).min(4);
            }
            c0 += width;
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
    unsafe fn kn_tile_512<const R: usize>(job: &Job, r0: usize, c0: usize, masks: &[__mmask16; 4]) {
        let (k, n) = (job.k, job.n);
        let mut acc = [[_mm512_setzero_ps(); 4]; R];
        let mut wp = job.w.as_ptr().add(c0);
        for kk in 0..k {
            let wv = [0, 1, 2, 3].map(|i| _mm512_maskz_loadu_ps(masks[i], wp.add(16 * i)));
            for r in 0..R {
                let av = _mm512_set1_ps(*job.a.get_unchecked((r0 + r) * k + kk));
                for i in 0..4 {
                    acc[r][i] = _mm512_fmadd_ps(wv[i], av, acc[r][i]);
                }
            }
            wp = wp.add(n);
        }
        for r in 0..R {
            for i in 0..4 {
                let mut v = acc[r][i];
                if let Some(b) = job.bias {
                    v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(masks[i], b.as_ptr().add(c0 + 16 * i)));
                }
                _mm512_mask_storeu_ps(job.y.add((r0 + r) * n + c0 + 16 * i), masks[i], v);
            }
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
    unsafe fn nk_512(job: &Job) {
        let mut c0 = job.cols.start;
        while c0 < job.cols.end {
            let width = (job.cols.end - c0).min(4);
            let mut r0 = 0;
            while r0 < job.m {
                match job.m - r0 {
                    1 => nk_tile_512::<1>(job, r0, c0, width),
                    2 => nk_tile_512::<2>(job, r0, c0, width),
                    3 => nk_tile_512::<3>(job, r0, c0, width),
                    _ => nk_tile_512::<4>(job, r0, c0, width),
                }
                r0 += (job.m - r0).min(4);
            }
            c0 += width;
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
    unsafe fn nk_tile_512<const R: usize>(job: &Job, r0: usize, c0: usize, width: usize) {
        let k = job.k;
        // Columns past the tile's width repeat its last column; their results are dropped.
        let wrow = [0, 1, 2, 3].map(|i| job.w.as_ptr().add((c0 + i.min(width - 1)) * k));
        let mut acc = [[_mm512_setzero_ps(); 4]; R];
        let mut kk = 0;
        while kk < k {
            let mask = mask16(k - kk);
            let wv = wrow.map(|p| _mm512_maskz_loadu_ps(mask, p.add(kk)));
            for r in 0..R {
                let av = _mm512_maskz_loadu_ps(mask, job.a.as_ptr().add((r0 + r) * k + kk));
                for i in 0..4 {
                    acc[r][i] = _mm512_fmadd_ps(wv[i], av, acc[r][i]);
                }
            }
            kk += 16;
        }
        for r in 0..R {
            for (i, &v) in acc[r].iter().enumerate().take(width) {
                let b = job.bias.map_or(0.0, |b| b[c0 + i]);
                *job.y.add((r0 + r) * job.n + c0 + i) = _mm512_reduce_add_ps(v) + b;
            }
        }
    }

    /// Lane mask for `left` remaining floats of an 8-float vector.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn mask8(left: usize) -> __m256i {
        let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        _mm256_cmpgt_epi32(_mm256_set1_epi32(left.min(8) as i32), lanes)
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn kn_avx2(job: &Job) {
        let mut c0 = job.cols.start;
        while c0 < job.cols.end {
            let width = (job.cols.end - c0).min(32);
            let masks = [
                mask8(width),
                mask8(width.saturating_sub(8)),
                mask8(width.saturating_sub(16)),
                mask8(width.saturating_sub(24)),
            ];
            let mut r0 = 0;
            while r0 < job.m {
                if job.m - r0 == 1 {
                    kn_tile_avx2::<1>(job, r0, c0, &masks);
                } else {
                    kn_tile_avx2::<2>(job, r0, c0, &masks);
                }
                r0 += (job.m - r0).min(2);
            }
            c0 += width;
        }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn kn_tile_avx2<const R: usize>(job: &Job, r0: usize, c0: usize, masks: &[__m256i; 4]) {
        let (k, n) = (job.k, job.n);
        let mut acc = [[_mm256_setzero_ps(); 4]; R];
        let mut wp = job.w.as_ptr().add(c0);
        for kk in 0..k {
            let wv = [0, 1, 2, 3].map(|i| _mm256_maskload_ps(wp.add(8 * i), masks[i]));
            for r in 0..R {
                let av = _mm256_set1_ps(*job.a.get_unchecked((r0 + r) * k + kk));
                for i in 0..4 {
                    acc[r][i] = _mm256_fmadd_ps(wv[i], av, acc[r][i]);
                }
            }
            wp = wp.add(n);
        }
        for r in 0..R {
            for i in 0..4 {
                let mut v = acc[r][i];
                if let Some(b) = job.bias {
                    v = _mm256_add_ps(v, _mm256_maskload_ps(b.as_ptr().add(c0 + 8 * i), masks[i]));
                }
                _mm256_maskstore_ps(job.y.add((r0 + r) * n + c0 + 8 * i), masks[i], v);
            }
        }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn nk_avx2(job: &Job) {
        let mut c0 = job.cols.start;
        while c0 < job.cols.end {
            let width = (job.cols.end - c0).min(4);
            let mut r0 = 0;
            while r0 < job.m {
                if job.m - r0 == 1 {
                    nk_tile_avx2::<1>(job, r0, c0, width);
                } else {
                    nk_tile_avx2::<2>(job, r0, c0, width);
                }
                r0 += (job.m - r0).min(2);
            }
            c0 += width;
        }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn nk_tile_avx2<const R: usize>(job: &Job, r0: usize, c0: usize, width: usize) {
        let k = job.k;
        let wrow = [0, 1, 2, 3].map(|i| job.w.as_ptr().add((c0 + i.min(width - 1)) * k));
        let mut acc = [[_mm256_setzero_ps(); 4]; R];
        let mut kk = 0;
        while kk < k {
            let mask = mask8(k - kk);
            let wv = wrow.map(|p| _mm256_maskload_ps(p.add(kk), mask));
            for r in 0..R {
                let av = _mm256_maskload_ps(job.a.as_ptr().add((r0 + r) * k + kk), mask);
                for i in 0..4 {
                    acc[r][i] = _mm256_fmadd_ps(wv[i], av, acc[r][i]);
                }
            }
            kk += 8;
        }
        for r in 0..R {
            for (i, &v) in acc[r].iter().enumerate().take(width) {
                let b = job.bias.map_or(0.0, |b| b[c0 + i]);
                *job.y.add((r0 + r) * job.n + c0 + i) = crate::kernels::simd::hsum_256(v) + b;
            }
        }
    }
}

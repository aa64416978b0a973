//! f32 GEMM / GEMV for float models: `y[m, n] = Σₖ a[m, k]·W(k, n) (+ bias[n])`, with W stored
//! either as `[K, N]` row-major (ONNX MatMul's B) or transposed as `[N, K]` (a tied lm_head that
//! reads the embedding table `[vocab, hidden]`), or packed into panels of [`F32_PANEL`] columns
//! ([`pack_f32_panels`], what `npuc compile` stores for a float MatMul's weight).
//!
//! - `[K, N]`: each task owns a range of columns; for a tile of 64 columns (32 with AVX2) and a
//!   chunk of rows, every k broadcasts `a[r, k]` against the tile's slice of row k of W. The last
//!   partial tile uses masked loads and stores.
//! - `[N, K]`: every output is a dot product of two contiguous rows; four columns and a chunk of
//!   rows run together, with masked loads for the K tail (AVX2 with one row: one column at a
//!   time, so W is read as one stream).
//! - panels: panel p holds columns `32p..32p + 32` of W for every k, row after row
//!   (`panels[(p·K + k)·32 + j] = W[k, 32p + j]`, zero past N), so a tile walking all of K reads
//!   one contiguous stream — what decoding, bound by reading W, wants (`[K, N]` in place reads W
//!   in pieces of 128 bytes, one per row). The arithmetic is the `[K, N]` kernel's, so the results
//!   are the same bits.
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
    /// Panels of [`F32_PANEL`] columns ([`pack_f32_panels`]).
    Panels,
}

/// Columns per panel of the packed layout.
pub const F32_PANEL: usize = 32;

/// Values the packed layout of a `[K, N]` weight holds (N padded to whole panels).
pub fn f32_panels_len(k: usize, n: usize) -> usize {
    n.div_ceil(F32_PANEL) * F32_PANEL * k
}

/// Packs a `[K, N]` row-major weight into panels (see the module doc).
pub fn pack_f32_panels(w: &[f32], k: usize, n: usize) -> Vec<f32> {
    assert_eq!(w.len(), k * n, "pack_f32_panels: w holds {} values, not {k}×{n}", w.len());
    let mut out = vec![0f32; f32_panels_len(k, n)];
    for (kk, row) in w.chunks_exact(n.max(1)).enumerate().take(k) {
        for (p, cols) in row.chunks(F32_PANEL).enumerate() {
            out[(p * k + kk) * F32_PANEL..][..cols.len()].copy_from_slice(cols);
        }
    }
    out
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
    let w_len = if layout == WeightLayout::Panels { f32_panels_len(k, n) } else { k * n };
    assert_eq!(w.len(), w_len, "gemm_f32: w holds {} values, not {w_len} for {k}×{n} {layout:?}", w.len());
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
                    WeightLayout::Panels => {
                        let (p, j) = (c / F32_PANEL, c % F32_PANEL);
                        for (kk, &x) in a.iter().enumerate() {
                            acc += x * self.w[(p * k + kk) * F32_PANEL + j];
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
            (Isa::Avx2, WeightLayout::Panels) => panels_avx2(job),
            (_, WeightLayout::KN) => kn_512(job),
            (_, WeightLayout::NK) => nk_512(job),
            (_, WeightLayout::Panels) => panels_512(job),
        }
    }

    /// The blocks of W's rows a `[K, N]` task walks. With a few activation rows (decoding) the
    /// kernel is bound by reading W: it takes [`DECODE_ROWS_PER_BLOCK`] rows of W across all of the
    /// task's columns before the next ones, so W streams through memory row after row (a tile
    /// walking all K rows first reads W in short strided pieces); the partial sums wait in y, and
    /// every output is still the same chain of fused multiply-adds in k order. With more rows
    /// (prefill) each tile walks all of K while its slice of W stays in cache.
    fn k_blocks(job: &Job) -> impl Iterator<Item = std::ops::Range<usize>> {
        let step = if job.m <= 4 { DECODE_ROWS_PER_BLOCK } else { job.k.max(1) };
        let k = job.k;
        (0..k.max(1)).step_by(step).map(move |s| s..(s + step).min(k))
    }

    /// Rows of W per block when decoding (see [`k_blocks`]).
    const DECODE_ROWS_PER_BLOCK: usize = 16;

    fn mask16(left: usize) -> __mmask16 {
        if left >= 16 {
            0xffff
        } else {
            ((1u32 << left) - 1) as __mmask16
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
    unsafe fn kn_512(job: &Job) {
        for ks in k_blocks(job) {
            let mut c0 = job.cols.start;
            while c0 < job.cols.end {
                let width = (job.cols.end - c0).min(64);
                let masks = [0, 1, 2, 3].map(|i| mask16(width.saturating_sub(16 * i)));
                let mut r0 = 0;
                while r0 < job.m {
                    match job.m - r0 {
                        1 => kn_tile_512::<1>(job, r0, c0, &masks, ks.clone()),
                        2 => kn_tile_512::<2>(job, r0, c0, &masks, ks.clone()),
                        3 => kn_tile_512::<3>(job, r0, c0, &masks, ks.clone()),
                        _ => kn_tile_512::<4>(job, r0, c0, &masks, ks.clone()),
                    }
                    r0 += (job.m - r0).min(4);
                }
                c0 += width;
            }
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
    unsafe fn kn_tile_512<const R: usize>(
        job: &Job,
        r0: usize,
        c0: usize,
        masks: &[__mmask16; 4],
        ks: std::ops::Range<usize>,
    ) {
        let (k, n) = (job.k, job.n);
        // The accumulators start from the partial sums earlier row blocks left in y.
        let mut acc = [[_mm512_setzero_ps(); 4]; R];
        if ks.start > 0 {
            for r in 0..R {
                for i in 0..4 {
                    acc[r][i] = _mm512_maskz_loadu_ps(masks[i], job.y.add((r0 + r) * n + c0 + 16 * i));
                }
            }
        }
        let last = ks.end == k;
        let mut wp = job.w.as_ptr().add(ks.start * n + c0);
        for kk in ks {
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
                if let (true, Some(b)) = (last, job.bias) {
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

    /// The packed layout: one 32-column panel at a time (tasks own whole panels: their column
    /// ranges start at multiples of 64), every k in order, rows in chunks of 4.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
    unsafe fn panels_512(job: &Job) {
        let (k, n) = (job.k, job.n);
        let mut c0 = job.cols.start;
        while c0 < job.cols.end {
            let width = (job.cols.end - c0).min(super::F32_PANEL);
            let masks = [mask16(width), mask16(width.saturating_sub(16))];
            let panel = job.w.as_ptr().add((c0 / super::F32_PANEL) * k * super::F32_PANEL);
            let mut r0 = 0;
            while r0 < job.m {
                let rows = (job.m - r0).min(4);
                macro_rules! tile {
                    ($r:literal) => {{
                        let mut acc = [[_mm512_setzero_ps(); 2]; $r];
                        let mut wp = panel;
                        for kk in 0..k {
                            let wv = [_mm512_loadu_ps(wp), _mm512_loadu_ps(wp.add(16))];
                            for r in 0..$r {
                                let av = _mm512_set1_ps(*job.a.get_unchecked((r0 + r) * k + kk));
                                for i in 0..2 {
                                    acc[r][i] = _mm512_fmadd_ps(wv[i], av, acc[r][i]);
                                }
                            }
                            wp = wp.add(super::F32_PANEL);
                        }
                        for r in 0..$r {
                            for i in 0..2 {
                                let mut v = acc[r][i];
                                if let Some(b) = job.bias {
                                    v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(masks[i], b.as_ptr().add(c0 + 16 * i)));
                                }
                                _mm512_mask_storeu_ps(job.y.add((r0 + r) * n + c0 + 16 * i), masks[i], v);
                            }
                        }
                    }};
                }
                match rows {
                    1 => tile!(1),
                    2 => tile!(2),
                    3 => tile!(3),
                    _ => tile!(4),
                }
                r0 += rows;
            }
            c0 += width;
        }
    }

    /// As [`panels_512`], four 8-float vectors a row, rows in chunks of 2.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn panels_avx2(job: &Job) {
        let (k, n) = (job.k, job.n);
        let mut c0 = job.cols.start;
        while c0 < job.cols.end {
            let width = (job.cols.end - c0).min(super::F32_PANEL);
            let masks = [0, 1, 2, 3].map(|i| mask8(width.saturating_sub(8 * i)));
            let panel = job.w.as_ptr().add((c0 / super::F32_PANEL) * k * super::F32_PANEL);
            let mut r0 = 0;
            while r0 < job.m {
                let rows = (job.m - r0).min(2);
                macro_rules! tile {
                    ($r:literal) => {{
                        let mut acc = [[_mm256_setzero_ps(); 4]; $r];
                        let mut wp = panel;
                        for kk in 0..k {
                            let wv = [0, 1, 2, 3].map(|i| _mm256_loadu_ps(wp.add(8 * i)));
                            for r in 0..$r {
                                let av = _mm256_set1_ps(*job.a.get_unchecked((r0 + r) * k + kk));
                                for i in 0..4 {
                                    acc[r][i] = _mm256_fmadd_ps(wv[i], av, acc[r][i]);
                                }
                            }
                            wp = wp.add(super::F32_PANEL);
                        }
                        for r in 0..$r {
                            for i in 0..4 {
                                let mut v = acc[r][i];
                                if let Some(b) = job.bias {
                                    v = _mm256_add_ps(v, _mm256_maskload_ps(b.as_ptr().add(c0 + 8 * i), masks[i]));
                                }
                                _mm256_maskstore_ps(job.y.add((r0 + r) * n + c0 + 8 * i), masks[i], v);
                            }
                        }
                    }};
                }
                if rows == 1 {
                    tile!(1)
                } else {
                    tile!(2)
                }
                r0 += rows;
            }
            c0 += width;
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
        for ks in k_blocks(job) {
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
                        kn_tile_avx2::<1>(job, r0, c0, &masks, ks.clone());
                    } else {
                        kn_tile_avx2::<2>(job, r0, c0, &masks, ks.clone());
                    }
                    r0 += (job.m - r0).min(2);
                }
                c0 += width;
            }
        }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn kn_tile_avx2<const R: usize>(
        job: &Job,
        r0: usize,
        c0: usize,
        masks: &[__m256i; 4],
        ks: std::ops::Range<usize>,
    ) {
        let (k, n) = (job.k, job.n);
        // The accumulators start from the partial sums earlier row blocks left in y.
        let mut acc = [[_mm256_setzero_ps(); 4]; R];
        if ks.start > 0 {
            for r in 0..R {
                for i in 0..4 {
                    acc[r][i] = _mm256_maskload_ps(job.y.add((r0 + r) * n + c0 + 8 * i), masks[i]);
                }
            }
        }
        let last = ks.end == k;
        let mut wp = job.w.as_ptr().add(ks.start * n + c0);
        for kk in ks {
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
                if let (true, Some(b)) = (last, job.bias) {
                    v = _mm256_add_ps(v, _mm256_maskload_ps(b.as_ptr().add(c0 + 8 * i), masks[i]));
                }
                _mm256_maskstore_ps(job.y.add((r0 + r) * n + c0 + 8 * i), masks[i], v);
            }
        }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn nk_avx2(job: &Job) {
        if job.m == 1 {
            return nk_one_row_avx2(job);
        }
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

    /// One activation row (decoding; the lm_head of the last position): W's rows one after the
    /// other, each a dot product with four accumulators, so the task reads W as one sequential
    /// stream (four rows side by side are four streams, which this CPU's prefetchers follow
    /// poorly: 3-4× slower measured on the 49152×576 lm_head).
    #[target_feature(enable = "avx2,fma")]
    unsafe fn nk_one_row_avx2(job: &Job) {
        let k = job.k;
        let a = job.a.as_ptr();
        for c in job.cols.clone() {
            let w = job.w.as_ptr().add(c * k);
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut kk = 0;
            while kk + 32 <= k {
                for i in 0..4 {
                    let o = kk + 8 * i;
                    acc[i] = _mm256_fmadd_ps(_mm256_loadu_ps(w.add(o)), _mm256_loadu_ps(a.add(o)), acc[i]);
                }
                kk += 32;
            }
            while kk < k {
                let mask = mask8(k - kk);
                acc[0] =
                    _mm256_fmadd_ps(_mm256_maskload_ps(w.add(kk), mask), _mm256_maskload_ps(a.add(kk), mask), acc[0]);
                kk += 8;
            }
            let sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
            let b = job.bias.map_or(0.0, |b| b[c]);
            *job.y.add(c) = crate::kernels::simd::hsum_256(sum) + b;
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

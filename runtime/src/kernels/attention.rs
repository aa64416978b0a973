//! The per-page arithmetic of paged attention (`crate::kvcache`): the scores of every query row of
//! a GQA group against a page's keys, then per query row the page's softmax partial — its maximum
//! score, the sum of `exp(s − max)` and the weighted sum of the value rows.
//!
//! Every path computes a query row's numbers from that row's query and the page rows it sees
//! alone, in an order fixed by those rows: how many other rows share the call, and which, never
//! changes a row's bits. A decode step and a verify block therefore agree bit for bit on a path.
//! The paths differ from each other by rounding only: the SIMD paths use fused multiply-adds,
//! sum the dot products in other orders and take `exp` from the polynomial of `simd` (within
//! 1.2e-7 relative of exp over the scores' range, see its tests), the scalar path libm's `expf`.

use super::Isa;

/// One query row's part of a page: its query at `q[q_start..q_start + head_dim]` and the page
/// rows `first..end` it sees (none when `first >= end`). `row` is the caller's: the kernels do
/// not read it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RowSpan {
    pub row: usize,
    pub q_start: usize,
    pub first: usize,
    pub end: usize,
}

impl RowSpan {
    fn sees(&self, t: usize) -> bool {
        self.first <= t && t < self.end
    }
}

/// What every query row of a group scores a page with: the call's queries and the page's keys
/// (`[rows, head_dim]`, the valid rows only).
#[derive(Clone, Copy)]
pub(crate) struct PageScores<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub head_dim: usize,
    pub scale: f32,
}

/// `scores[i·stride + t] = scale · q·k_t` for the `i`-th span of `spans` and every page row `t`
/// it sees; key row `t` is scored against all the spans seeing it before the next is read.
/// Entries a span does not see are left as they were.
pub(crate) fn page_scores(isa: Isa, page: PageScores<'_>, spans: &[RowSpan], scores: &mut [f32], stride: usize) {
    let rows = page.k.len() / page.head_dim.max(1);
    for (i, s) in spans.iter().enumerate().filter(|(_, s)| s.first < s.end) {
        assert!(s.end <= rows.min(stride) && s.q_start + page.head_dim <= page.q.len());
        assert!(i * stride + s.end <= scores.len());
    }
    match isa {
        Isa::Scalar => page_scores_scalar(page, spans, scores, stride),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `isa` comes from `Isa::check` (the executor's, or the cache's validated
        // configuration), so the CPU has AVX-512 F/BW/VL; the bounds are asserted above.
        Isa::Avx512 | Isa::Avx512Vnni => unsafe { x86::page_scores_512(page, spans, scores, stride) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, the CPU has AVX2 and FMA.
        Isa::Avx2 => unsafe { x86::page_scores_256(page, spans, scores, stride) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => page_scores_scalar(page, spans, scores, stride),
    }
}

/// One query row's partial over the page rows it sees: `scores` (that row's scores of those
/// rows) become the weights `exp(s − max)`, `out = Σₜ weightₜ · v_t` over the value rows `v`
/// (`[scores.len(), out.len()]`); returns `(max, Σₜ weightₜ)`.
pub(crate) fn row_partial(isa: Isa, scores: &mut [f32], v: &[f32], out: &mut [f32]) -> (f32, f32) {
    assert!(!scores.is_empty() && v.len() >= scores.len() * out.len());
    match isa {
        Isa::Scalar => row_partial_scalar(scores, v, out),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `isa` comes from `Isa::check`, so the CPU has AVX-512 F/BW/VL; the lengths are
        // asserted above.
        Isa::Avx512 | Isa::Avx512Vnni => unsafe { x86::row_partial_512(scores, v, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, the CPU has AVX2 and FMA.
        Isa::Avx2 => unsafe { x86::row_partial_256(scores, v, out) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => row_partial_scalar(scores, v, out),
    }
}

/// `out[t] = codes[t] · scales[t]` for rows of `d` values, at the path's vector width.
pub(crate) fn dequantize_rows(isa: Isa, codes: &[i8], scales: &[f32], d: usize, out: &mut [f32]) {
    match isa {
        Isa::Scalar => dequantize_body(codes, scales, d, out),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `isa` comes from `Isa::check`, so the CPU has AVX-512 F/BW/VL.
        Isa::Avx512 | Isa::Avx512Vnni => unsafe { x86::dequantize_512(codes, scales, d, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, the CPU has AVX2 and FMA.
        Isa::Avx2 => unsafe { x86::dequantize_256(codes, scales, d, out) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => dequantize_body(codes, scales, d, out),
    }
}

/// Asks the CPU to bring `data` into the cache ahead of its use; a hint, no effect on results.
/// Pages of one sequence lie far apart in the pool, where the hardware prefetchers do not follow.
pub(crate) fn prefetch<T>(data: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let bytes = std::mem::size_of_val(data);
        for offset in (0..bytes).step_by(64) {
            // SAFETY: SSE is part of x86_64; a prefetch never faults, and the address is inside
            // `data`.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(data.as_ptr().cast::<i8>().add(offset)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}

/// The element-wise body of [`dequantize_rows`]; the paths compile it at their own width.
#[inline(always)]
fn dequantize_body(codes: &[i8], scales: &[f32], d: usize, out: &mut [f32]) {
    for ((row, out), &scale) in codes.chunks_exact(d).zip(out.chunks_exact_mut(d)).zip(scales) {
        for (o, &c) in out.iter_mut().zip(row) {
            *o = c as f32 * scale;
        }
    }
}

fn page_scores_scalar(page: PageScores<'_>, spans: &[RowSpan], scores: &mut [f32], stride: usize) {
    let d = page.head_dim;
    for (r, span) in spans.iter().enumerate() {
        let q = &page.q[span.q_start..span.q_start + d];
        for t in span.first..span.end {
            scores[r * stride + t] = page.scale * dot(q, &page.k[t * d..(t + 1) * d]);
        }
    }
}

fn row_partial_scalar(weights: &mut [f32], v: &[f32], out: &mut [f32]) -> (f32, f32) {
    let page_max = weights.iter().fold(f32::NEG_INFINITY, |m, &w| m.max(w));
    let mut page_sum = 0f32;
    for w in weights.iter_mut() {
        *w = (*w - page_max).exp();
        page_sum += *w;
    }
    weighted_sum(weights, &v[..weights.len() * out.len()], out);
    (page_max, page_sum)
}

/// `Σ q·row` in sixteen f32 lanes, enough independent sums to keep the vector units busy, summed
/// as a tree.
#[inline]
fn dot(q: &[f32], row: &[f32]) -> f32 {
    const LANES: usize = 16;
    let (q_chunks, q_tail) = q.as_chunks::<LANES>();
    let (row_chunks, row_tail) = row[..q.len()].as_chunks::<LANES>();
    let mut lanes = [0f32; LANES];
    for (x, y) in q_chunks.iter().zip(row_chunks) {
        for l in 0..LANES {
            lanes[l] += x[l] * y[l];
        }
    }
    let mut width = LANES / 2;
    while width > 0 {
        for l in 0..width {
            lanes[l] += lanes[l + width];
        }
        width /= 2;
    }
    lanes[0] + q_tail.iter().zip(row_tail).map(|(x, y)| x * y).sum::<f32>()
}

/// `out = Σₜ weights[t] · rows[t]` over rows of `out.len()` values: column blocks of 32, then 8,
/// then single columns, each block summed over the rows in registers.
#[inline]
fn weighted_sum(weights: &[f32], rows: &[f32], out: &mut [f32]) {
    let d = out.len();
    let done = weighted_sum_columns::<32>(weights, rows, d, 0, out);
    let done = weighted_sum_columns::<8>(weights, rows, d, done, out);
    for (j, o) in out.iter_mut().enumerate().skip(done) {
        *o = weights.iter().enumerate().map(|(t, &w)| w * rows[t * d + j]).sum();
    }
}

/// [`weighted_sum`] for the whole blocks of `W` columns from column `first`; returns the first
/// column left.
#[inline(always)]
fn weighted_sum_columns<const W: usize>(
    weights: &[f32],
    rows: &[f32],
    d: usize,
    first: usize,
    out: &mut [f32],
) -> usize {
    let (blocks, _) = out[first..].as_chunks_mut::<W>();
    for (b, block) in blocks.iter_mut().enumerate() {
        let column = first + b * W;
        let mut lanes = [0f32; W];
        for (t, &w) in weights.iter().enumerate() {
            let row: &[f32; W] = rows[t * d + column..][..W].try_into().expect("W values");
            for l in 0..W {
                lanes[l] += w * row[l];
            }
        }
        *block = lanes;
    }
    first + blocks.len() * W
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The AVX2 and AVX-512 paths. Callers check the lengths; the functions read and write
    //! inside the slices they are given only (tails through masked loads and stores).

    use super::{dequantize_body, PageScores, RowSpan};
    use crate::kernels::simd::{exp_256, exp_512, hsum_256};
    use std::arch::x86_64::*;

    /// The lanes of the first `n` (≤ 16) values.
    #[inline]
    fn mask_16(n: usize) -> __mmask16 {
        if n >= 16 {
            0xffff
        } else {
            ((1u32 << n) - 1) as __mmask16
        }
    }

    /// The lanes of the first `n` (≤ 8) values, as `vmaskmov` takes them.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn mask_8(n: usize) -> __m256i {
        let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        _mm256_cmpgt_epi32(_mm256_set1_epi32(n.min(8) as i32), lanes)
    }

    /// The key rows every span sees: the union of the spans.
    fn key_rows(spans: &[RowSpan]) -> std::ops::Range<usize> {
        let seen = spans.iter().filter(|s| s.first < s.end);
        let first = seen.clone().map(|s| s.first).min().unwrap_or(0);
        first..seen.map(|s| s.end).max().unwrap_or(0)
    }

    /// Writes `dots[j][t]` as the scores of the spans of `block` (those that see key `t0 + t`).
    fn store_scores<const R: usize>(
        dots: [[f32; 4]; R],
        block: &[RowSpan],
        t0: usize,
        scale: f32,
        scores: &mut [f32],
        stride: usize,
        first_span: usize,
    ) {
        for (j, (span, dots)) in block.iter().zip(dots).enumerate() {
            for (t, dot) in dots.into_iter().enumerate().filter(|&(t, _)| span.sees(t0 + t)) {
                scores[(first_span + j) * stride + t0 + t] = scale * dot;
            }
        }
    }

    /// Four key rows from `t0` (the last repeated past `end`), as pointers into `k`.
    fn four_keys(k: &[f32], d: usize, t0: usize, end: usize) -> [*const f32; 4] {
        std::array::from_fn(|t| k[(t0 + t).min(end - 1) * d..].as_ptr())
    }

    /// The `R` spans' queries, as pointers into `q`.
    fn queries<const R: usize>(q: &[f32], block: &[RowSpan]) -> [*const f32; R] {
        std::array::from_fn(|j| q[block[j].q_start..].as_ptr())
    }

    /// Sums the lanes of each of four vectors: `[Σa, Σb, Σc, Σd]`. Each sum is the same fixed tree
    /// of its own vector's lanes, whatever the other three hold.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
    fn hsum4_512(v: [__m512; 4]) -> __m128 {
        let mut q = [_mm_setzero_ps(); 4];
        for (q, x) in q.iter_mut().zip(v) {
            let high = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(x)));
            let halves = _mm256_add_ps(_mm512_castps512_ps256(x), high);
            *q = _mm_add_ps(_mm256_castps256_ps128(halves), _mm256_extractf128_ps::<1>(halves));
        }
        _mm_hadd_ps(_mm_hadd_ps(q[0], q[1]), _mm_hadd_ps(q[2], q[3]))
    }

    /// [`hsum4_512`] of eight-lane vectors.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn hsum4_256(v: [__m256; 4]) -> __m128 {
        let mut q = [_mm_setzero_ps(); 4];
        for (q, x) in q.iter_mut().zip(v) {
            *q = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps::<1>(x));
        }
        _mm_hadd_ps(_mm_hadd_ps(q[0], q[1]), _mm_hadd_ps(q[2], q[3]))
    }

    /// The dot products of `R` queries with four keys over `d` values: one FMA chain per pair
    /// through sixteen-value chunks (the tail masked), then [`hsum4_512`].
    #[inline(always)]
    unsafe fn dots_512<const R: usize>(q: [*const f32; R], k: [*const f32; 4], d: usize) -> [[f32; 4]; R] {
        let mut acc = [[_mm512_setzero_ps(); 4]; R];
        for i in (0..d).step_by(16) {
            let m = mask_16(d - i);
            let mut keys = [_mm512_setzero_ps(); 4];
            for (key, k) in keys.iter_mut().zip(k) {
                *key = _mm512_maskz_loadu_ps(m, k.add(i));
            }
            for (acc, q) in acc.iter_mut().zip(q) {
                let x = _mm512_maskz_loadu_ps(m, q.add(i));
                for (a, key) in acc.iter_mut().zip(keys) {
                    *a = _mm512_fmadd_ps(x, key, *a);
                }
            }
        }
        let mut out = [[0f32; 4]; R];
        for (out, a) in out.iter_mut().zip(acc) {
            _mm_storeu_ps(out.as_mut_ptr(), hsum4_512(a));
        }
        out
    }

    /// [`dots_512`] in eight-value chunks.
    #[inline(always)]
    unsafe fn dots_256<const R: usize>(q: [*const f32; R], k: [*const f32; 4], d: usize) -> [[f32; 4]; R] {
        let mut acc = [[_mm256_setzero_ps(); 4]; R];
        for i in (0..d).step_by(8) {
            let m = mask_8(d - i);
            let mut keys = [_mm256_setzero_ps(); 4];
            for (key, k) in keys.iter_mut().zip(k) {
                *key = _mm256_maskload_ps(k.add(i), m);
            }
            for (acc, q) in acc.iter_mut().zip(q) {
                let x = _mm256_maskload_ps(q.add(i), m);
                for (a, key) in acc.iter_mut().zip(keys) {
                    *a = _mm256_fmadd_ps(x, key, *a);
                }
            }
        }
        let mut out = [[0f32; 4]; R];
        for (out, a) in out.iter_mut().zip(acc) {
            _mm_storeu_ps(out.as_mut_ptr(), hsum4_256(a));
        }
        out
    }

    /// The scores of `R` spans (from span `first_span` of the call) over the keys any of them
    /// sees, four keys at a time: each key row is loaded once for the `R` queries.
    #[inline(always)]
    unsafe fn block_scores_512<const R: usize>(
        page: PageScores<'_>,
        block: &[RowSpan],
        first_span: usize,
        scores: &mut [f32],
        stride: usize,
    ) {
        let (d, q) = (page.head_dim, queries::<R>(page.q, block));
        let keys = key_rows(block);
        for t0 in keys.clone().step_by(4) {
            let dots = dots_512::<R>(q, four_keys(page.k, d, t0, keys.end), d);
            store_scores(dots, block, t0, page.scale, scores, stride, first_span);
        }
    }

    /// [`block_scores_512`] with [`dots_256`].
    #[inline(always)]
    unsafe fn block_scores_256<const R: usize>(
        page: PageScores<'_>,
        block: &[RowSpan],
        first_span: usize,
        scores: &mut [f32],
        stride: usize,
    ) {
        let (d, q) = (page.head_dim, queries::<R>(page.q, block));
        let keys = key_rows(block);
        for t0 in keys.clone().step_by(4) {
            let dots = dots_256::<R>(q, four_keys(page.k, d, t0, keys.end), d);
            store_scores(dots, block, t0, page.scale, scores, stride, first_span);
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
    pub(super) unsafe fn page_scores_512(page: PageScores<'_>, spans: &[RowSpan], scores: &mut [f32], stride: usize) {
        for (b, block) in spans.chunks(4).enumerate() {
            match block.len() {
                1 => block_scores_512::<1>(page, block, 4 * b, scores, stride),
                2 => block_scores_512::<2>(page, block, 4 * b, scores, stride),
                3 => block_scores_512::<3>(page, block, 4 * b, scores, stride),
                _ => block_scores_512::<4>(page, block, 4 * b, scores, stride),
            }
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn page_scores_256(page: PageScores<'_>, spans: &[RowSpan], scores: &mut [f32], stride: usize) {
        // Sixteen vector registers: two queries × four keys of accumulators at a time.
        for (b, block) in spans.chunks(2).enumerate() {
            match block.len() {
                1 => block_scores_256::<1>(page, block, 2 * b, scores, stride),
                _ => block_scores_256::<2>(page, block, 2 * b, scores, stride),
            }
        }
    }

    /// Scores to weights `exp(s − max)` in place; returns `(max, Σ weights)`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
    unsafe fn softmax_partial_512(scores: &mut [f32]) -> (f32, f32) {
        let (p, n) = (scores.as_mut_ptr(), scores.len());
        let mut max = _mm512_set1_ps(f32::NEG_INFINITY);
        for i in (0..n).step_by(16) {
            max = _mm512_mask_max_ps(max, mask_16(n - i), max, _mm512_maskz_loadu_ps(mask_16(n - i), p.add(i)));
        }
        let page_max = _mm512_reduce_max_ps(max);
        let (max, mut sum) = (_mm512_set1_ps(page_max), _mm512_setzero_ps());
        for i in (0..n).step_by(16) {
            let m = mask_16(n - i);
            let w = exp_512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, p.add(i)), max));
            _mm512_mask_storeu_ps(p.add(i), m, w);
            sum = _mm512_mask_add_ps(sum, m, sum, w);
        }
        (page_max, _mm512_reduce_add_ps(sum))
    }

    /// [`softmax_partial_512`] in eight-value chunks.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn softmax_partial_256(scores: &mut [f32]) -> (f32, f32) {
        let (p, n) = (scores.as_mut_ptr(), scores.len());
        let low = _mm256_set1_ps(f32::NEG_INFINITY);
        let mut max = low;
        for i in (0..n).step_by(8) {
            let m = mask_8(n - i);
            let x = _mm256_blendv_ps(low, _mm256_maskload_ps(p.add(i), m), _mm256_castsi256_ps(m));
            max = _mm256_max_ps(max, x);
        }
        let halves = _mm_max_ps(_mm256_castps256_ps128(max), _mm256_extractf128_ps::<1>(max));
        let halves = _mm_max_ps(halves, _mm_movehl_ps(halves, halves));
        let page_max = _mm_cvtss_f32(_mm_max_ss(halves, _mm_shuffle_ps::<0b01>(halves, halves)));
        let (max, mut sum) = (_mm256_set1_ps(page_max), _mm256_setzero_ps());
        for i in (0..n).step_by(8) {
            let m = mask_8(n - i);
            let w = exp_256(_mm256_sub_ps(_mm256_maskload_ps(p.add(i), m), max));
            let w = _mm256_and_ps(w, _mm256_castsi256_ps(m));
            _mm256_maskstore_ps(p.add(i), m, w);
            sum = _mm256_add_ps(sum, w);
        }
        (page_max, hsum_256(sum))
    }

    /// `out[c..c + 16·N] = Σₜ w[t] · v[t][c..]` with N accumulators in registers; `left` is how
    /// many of those columns exist (the last chunk masked).
    #[inline(always)]
    unsafe fn weighted_columns_512<const N: usize>(w: &[f32], v: *const f32, d: usize, c: usize, out: *mut f32) {
        let mut acc = [_mm512_setzero_ps(); N];
        for (t, &wt) in w.iter().enumerate() {
            let wt = _mm512_set1_ps(wt);
            for (j, a) in acc.iter_mut().enumerate() {
                let col = c + 16 * j;
                *a = _mm512_fmadd_ps(wt, _mm512_maskz_loadu_ps(mask_16(d - col), v.add(t * d + col)), *a);
            }
        }
        for (j, a) in acc.iter().enumerate() {
            _mm512_mask_storeu_ps(out.add(c + 16 * j), mask_16(d - c - 16 * j), *a);
        }
    }

    /// [`weighted_columns_512`] in eight-value chunks.
    #[inline(always)]
    unsafe fn weighted_columns_256<const N: usize>(w: &[f32], v: *const f32, d: usize, c: usize, out: *mut f32) {
        let mut acc = [_mm256_setzero_ps(); N];
        for (t, &wt) in w.iter().enumerate() {
            let wt = _mm256_set1_ps(wt);
            for (j, a) in acc.iter_mut().enumerate() {
                let col = c + 8 * j;
                *a = _mm256_fmadd_ps(wt, _mm256_maskload_ps(v.add(t * d + col), mask_8(d - col)), *a);
            }
        }
        for (j, a) in acc.iter().enumerate() {
            _mm256_maskstore_ps(out.add(c + 8 * j), mask_8(d - c - 8 * j), *a);
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
    pub(super) unsafe fn row_partial_512(scores: &mut [f32], v: &[f32], out: &mut [f32]) -> (f32, f32) {
        let partial = softmax_partial_512(scores);
        let (d, mut c) = (out.len(), 0);
        while c < d {
            match (d - c).div_ceil(16) {
                1 => weighted_columns_512::<1>(scores, v.as_ptr(), d, c, out.as_mut_ptr()),
                2 => weighted_columns_512::<2>(scores, v.as_ptr(), d, c, out.as_mut_ptr()),
                3 => weighted_columns_512::<3>(scores, v.as_ptr(), d, c, out.as_mut_ptr()),
                _ => weighted_columns_512::<4>(scores, v.as_ptr(), d, c, out.as_mut_ptr()),
            }
            c += 64;
        }
        partial
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn row_partial_256(scores: &mut [f32], v: &[f32], out: &mut [f32]) -> (f32, f32) {
        let partial = softmax_partial_256(scores);
        let (d, mut c) = (out.len(), 0);
        while c < d {
            match (d - c).div_ceil(8) {
                1 => weighted_columns_256::<1>(scores, v.as_ptr(), d, c, out.as_mut_ptr()),
                2 => weighted_columns_256::<2>(scores, v.as_ptr(), d, c, out.as_mut_ptr()),
                3 => weighted_columns_256::<3>(scores, v.as_ptr(), d, c, out.as_mut_ptr()),
                _ => weighted_columns_256::<4>(scores, v.as_ptr(), d, c, out.as_mut_ptr()),
            }
            c += 32;
        }
        partial
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
    pub(super) unsafe fn dequantize_512(codes: &[i8], scales: &[f32], d: usize, out: &mut [f32]) {
        dequantize_body(codes, scales, d, out);
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dequantize_256(codes: &[i8], scales: &[f32], d: usize, out: &mut [f32]) {
        dequantize_body(codes, scales, d, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SplitMix64 values in [-2, 2).
    struct Rng(u64);

    impl Rng {
        fn value(&mut self) -> f32 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 22) as f32 - 2.0
        }

        fn values(&mut self, n: usize) -> Vec<f32> {
            (0..n).map(|_| self.value()).collect()
        }

        fn below(&mut self, n: usize) -> usize {
            ((self.value() + 2.0) / 4.0 * n as f32) as usize % n
        }
    }

    fn simd_paths() -> Vec<Isa> {
        Isa::ALL.into_iter().filter(|i| *i != Isa::Scalar && i.is_available()).collect()
    }

    /// A random page of `rows` valid rows (of 16) and `spans` query rows seeing parts of it.
    struct Case {
        d: usize,
        q: Vec<f32>,
        k: Vec<f32>,
        v: Vec<f32>,
        spans: Vec<RowSpan>,
    }

    fn case(rng: &mut Rng, d: usize, rows: usize, queries: usize) -> Case {
        let spans = (0..queries)
            .map(|r| {
                let end = 1 + rng.below(rows);
                RowSpan { row: r, q_start: r * d, first: rng.below(end), end }
            })
            .collect();
        Case { d, q: rng.values(queries * d), k: rng.values(rows * d), v: rng.values(rows * d), spans }
    }

    fn scores(isa: Isa, c: &Case, spans: &[RowSpan]) -> Vec<f32> {
        let page = PageScores { q: &c.q, k: &c.k, head_dim: c.d, scale: 0.125 };
        let mut out = vec![f32::NAN; spans.len() * 16];
        page_scores(isa, page, spans, &mut out, 16);
        out
    }

    /// Each SIMD path's scores, weights, maxima, sums and weighted sums within 1e-5 of the scalar
    /// path's (relative to the magnitudes summed), for head dims with and without vector tails,
    /// partial pages and windows (rows seeing a part of the page).
    #[test]
    fn every_path_matches_the_scalar_path_on_random_pages() {
        let mut rng = Rng(3);
        for d in [1, 8, 13, 24, 64, 100, 128] {
            for rows in [1, 5, 16] {
                let c = case(&mut rng, d, rows, 7);
                let want = scores(Isa::Scalar, &c, &c.spans);
                for isa in simd_paths() {
                    let got = scores(isa, &c, &c.spans);
                    for (i, s) in c.spans.iter().enumerate() {
                        for t in s.first..s.end {
                            let bound: f32 =
                                c.q[s.q_start..][..d].iter().zip(&c.k[t * d..]).map(|(a, b)| (a * b).abs()).sum();
                            let (g, w) = (got[i * 16 + t], want[i * 16 + t]);
                            assert!((g - w).abs() <= 1e-6 * 0.125 * bound, "{isa} d={d}: score {g} vs {w}");
                        }
                    }
                    check_partials(isa, &c, &want);
                }
            }
        }
    }

    fn check_partials(isa: Isa, c: &Case, scores: &[f32]) {
        let d = c.d;
        for (i, s) in c.spans.iter().enumerate() {
            let (mut w_want, mut w_got) =
                (scores[i * 16..][s.first..s.end].to_vec(), scores[i * 16..][s.first..s.end].to_vec());
            let (mut want, mut got) = (vec![0f32; d], vec![0f32; d]);
            let v = &c.v[s.first * d..s.end * d];
            let (max_want, sum_want) = row_partial(Isa::Scalar, &mut w_want, v, &mut want);
            let (max_got, sum_got) = row_partial(isa, &mut w_got, v, &mut got);
            assert_eq!(max_got, max_want, "{isa} d={d}: same scores, same maximum");
            assert!((sum_got - sum_want).abs() <= 1e-6 * sum_want, "{isa} d={d}: sum {sum_got} vs {sum_want}");
            for (j, (g, w)) in got.iter().zip(&want).enumerate() {
                let bound: f32 = w_want.iter().enumerate().map(|(t, x)| (x * v[t * d + j]).abs()).sum();
                assert!((g - w).abs() <= 1e-6 * bound.max(1e-30), "{isa} d={d} column {j}: {g} vs {w}");
            }
        }
    }

    /// A row's scores are the same bits whether it is scored alone or with other rows, on every
    /// path: a decode step and a verify block agree.
    #[test]
    fn a_rows_scores_do_not_depend_on_the_rows_scored_with_it() {
        let mut rng = Rng(4);
        for isa in Isa::ALL.into_iter().filter(|i| i.is_available()) {
            for d in [13, 64, 128] {
                let c = case(&mut rng, d, 16, 6);
                let together = scores(isa, &c, &c.spans);
                for (i, s) in c.spans.iter().enumerate() {
                    let alone = scores(isa, &c, std::slice::from_ref(s));
                    let (a, b) = (&alone[s.first..s.end], &together[i * 16..][s.first..s.end]);
                    assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "{isa} d={d} row {i}");
                }
            }
        }
    }

    #[test]
    fn int8_rows_dequantize_alike_on_every_path() {
        let codes: Vec<i8> = (0..5 * 24).map(|i| (i * 37 % 255 - 127) as i8).collect();
        let scales = [0.5, 0.0, 1e-3, 7.0, 0.25];
        let mut want = vec![0f32; codes.len()];
        dequantize_rows(Isa::Scalar, &codes, &scales, 24, &mut want);
        assert_eq!(want[24 * 3 + 1], codes[24 * 3 + 1] as f32 * 7.0);
        for isa in simd_paths() {
            let mut got = vec![0f32; codes.len()];
            dequantize_rows(isa, &codes, &scales, 24, &mut got);
            assert_eq!(got, want, "{isa}");
        }
    }
}

//! The per-page arithmetic of paged attention (`crate::kvcache`): the scores of every query row of
//! a GQA group against a page's keys, then per query row the page's softmax partial — its maximum
//! score, the sum of `exp(s − max)` and the weighted sum of the value rows.
//!
//! A page's keys are read transposed (`[head_dim, page_rows]`: dimension `j` of key row `t` at
//! `j·page_rows + t`), so a vector lane is a key row: the scores of sixteen (eight) keys are sixteen
//! (eight) independent FMA chains over the dimensions, with no horizontal sum. Keys and values are
//! f32 or int8 codes ([`Code`]); int8 rows carry a scale each, applied to what the codes give, not
//! to the codes: a score is `scale · (kscaleₜ · Σⱼ qⱼ·codeₜⱼ)` and a page's value sum is
//! `Σₜ (weightₜ · vscaleₜ) · codeₜ`. Converting an int8 code to f32 is exact, so the kernels give
//! the same bits whether they read the codes in place or from an f32 copy of them.
//!
//! Every path computes a query row's numbers from that row's query and the page rows it sees
//! alone, in an order fixed by those rows: how many other rows share the call, and which, never
//! changes a row's bits. A decode step and a verify block therefore agree bit for bit on a path.
//! The paths differ from each other by rounding only: the SIMD paths use fused multiply-adds and
//! take `exp` from the polynomial of `simd` (within 1.2e-7 relative of exp over the scores'
//! range, see its tests), the scalar path plain products and libm's `expf`.

use super::Isa;

/// What a page stores per value: f32, or an int8 code of a row with its own scale. The scalar
/// path reads a value through [`Code::value`]; the SIMD paths load and widen them a vector at a
/// time.
#[cfg(target_arch = "x86_64")]
pub(crate) trait Code: Copy + x86::Lanes {
    fn value(self) -> f32;
}
#[cfg(not(target_arch = "x86_64"))]
pub(crate) trait Code: Copy {
    fn value(self) -> f32;
}

impl Code for f32 {
    #[inline(always)]
    fn value(self) -> f32 {
        self
    }
}

impl Code for i8 {
    #[inline(always)]
    fn value(self) -> f32 {
        f32::from(self)
    }
}

/// A page's keys or values in their storage type.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Codes<'a> {
    F32(&'a [f32]),
    Int8(&'a [i8]),
}

impl<'a> Codes<'a> {
    /// The values `range` of these.
    pub(crate) fn rows(self, range: std::ops::Range<usize>) -> Codes<'a> {
        match self {
            Codes::F32(v) => Codes::F32(&v[range]),
            Codes::Int8(v) => Codes::Int8(&v[range]),
        }
    }
}

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

/// What every query row of a group scores a page with: the call's queries and the page's keys,
/// transposed (`[head_dim, page_rows]`), with a scale per key row for int8 codes.
#[derive(Clone, Copy)]
pub(crate) struct PageScores<'a> {
    pub q: &'a [f32],
    pub keys: Codes<'a>,
    pub key_scales: Option<&'a [f32]>,
    pub head_dim: usize,
    pub page_rows: usize,
    pub scale: f32,
}

/// The value rows one query row weights (`[rows, head_dim]`, from the first row it sees), with a
/// scale per row for int8 codes.
#[derive(Clone, Copy)]
pub(crate) struct RowValues<'a> {
    pub rows: Codes<'a>,
    pub scales: Option<&'a [f32]>,
}

/// `scores[i·stride + t] = scale · q·k_t` (times key row t's scale for int8 keys) for the `i`-th
/// span of `spans` and every page row `t` it sees; the keys are read once for up to four spans.
/// Entries a span does not see are left as they were.
pub(crate) fn page_scores(isa: Isa, page: PageScores<'_>, spans: &[RowSpan], scores: &mut [f32], stride: usize) {
    let keys = match page.keys {
        Codes::F32(k) => k.len(),
        Codes::Int8(k) => k.len(),
    };
    assert!(keys >= page.head_dim * page.page_rows);
    for (i, s) in spans.iter().enumerate().filter(|(_, s)| s.first < s.end) {
        assert!(s.end <= page.page_rows.min(stride) && s.q_start + page.head_dim <= page.q.len());
        assert!(i * stride + s.end <= scores.len());
        assert!(page.key_scales.is_none_or(|ks| s.end <= ks.len()));
    }
    match page.keys {
        Codes::F32(k) => scores_of(isa, page, k, spans, scores, stride),
        Codes::Int8(k) => scores_of(isa, page, k, spans, scores, stride),
    }
}

fn scores_of<T: Code>(
    isa: Isa,
    page: PageScores<'_>,
    keys: &[T],
    spans: &[RowSpan],
    scores: &mut [f32],
    stride: usize,
) {
    match isa {
        Isa::Scalar => page_scores_scalar(page, keys, spans, scores, stride),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `isa` comes from `Isa::check` (the executor's, or the cache's validated
        // configuration), so the CPU has AVX-512 F/BW/VL; the bounds are asserted by the caller.
        Isa::Avx512 | Isa::Avx512Vnni => unsafe { x86::page_scores_512(page, keys, spans, scores, stride) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, the CPU has AVX2 and FMA.
        Isa::Avx2 => unsafe { x86::page_scores_256(page, keys, spans, scores, stride) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => page_scores_scalar(page, keys, spans, scores, stride),
    }
}

/// One query row's partial over the page rows it sees: `scores` (that row's scores of those
/// rows) become the weights `exp(s − max)`, `out = Σₜ weightₜ · v_t` over the value rows
/// (`[scores.len(), out.len()]`, each times its scale for int8 codes); returns
/// `(max, Σₜ weightₜ)`. With int8 values, `scores` ends holding `weightₜ · scaleₜ`.
pub(crate) fn row_partial(isa: Isa, scores: &mut [f32], values: RowValues<'_>, out: &mut [f32]) -> (f32, f32) {
    let rows = match values.rows {
        Codes::F32(v) => v.len(),
        Codes::Int8(v) => v.len(),
    };
    assert!(!scores.is_empty() && rows >= scores.len() * out.len());
    assert!(values.scales.is_none_or(|s| s.len() >= scores.len()));
    match values.rows {
        Codes::F32(v) => partial_of(isa, scores, v, values.scales, out),
        Codes::Int8(v) => partial_of(isa, scores, v, values.scales, out),
    }
}

fn partial_of<T: Code>(isa: Isa, scores: &mut [f32], v: &[T], scales: Option<&[f32]>, out: &mut [f32]) -> (f32, f32) {
    match isa {
        Isa::Scalar => row_partial_scalar(scores, v, scales, out),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `isa` comes from `Isa::check`, so the CPU has AVX-512 F/BW/VL; the lengths are
        // asserted by the caller.
        Isa::Avx512 | Isa::Avx512Vnni => unsafe { x86::row_partial_512(scores, v, scales, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, the CPU has AVX2 and FMA.
        Isa::Avx2 => unsafe { x86::row_partial_256(scores, v, scales, out) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => row_partial_scalar(scores, v, scales, out),
    }
}

/// Query rows one [`rows_partial`] call weights together at most.
pub(crate) const GROUP_ROWS: usize = 4;

/// [`row_partial`] for `partials.len()` (at most [`GROUP_ROWS`]) query rows that see the same
/// `len` value rows: row r's scores at `scores[r·stride..][..len]`, its output at
/// `out[r·d..][..d]`. Each row's result is [`row_partial`]'s, bit for bit (the same operations in
/// the same order); on AVX-512 with `d` a multiple of 64 each value row is loaded once for all
/// the rows, whose accumulators stay in registers side by side.
pub(crate) fn rows_partial(
    isa: Isa,
    (scores, stride, len): (&mut [f32], usize, usize),
    values: RowValues<'_>,
    out: &mut [f32],
    partials: &mut [(f32, f32)],
) {
    let q = partials.len();
    let d = out.len() / q.max(1);
    assert!((1..=GROUP_ROWS).contains(&q) && len > 0 && scores.len() >= (q - 1) * stride + len);
    let grouped = matches!(isa, Isa::Avx512 | Isa::Avx512Vnni) && d.is_multiple_of(64) && q > 1;
    if !cfg!(target_arch = "x86_64") || !grouped {
        for (r, partial) in partials.iter_mut().enumerate() {
            *partial = row_partial(isa, &mut scores[r * stride..][..len], values, &mut out[r * d..][..d]);
        }
        return;
    }
    let rows = match values.rows {
        Codes::F32(v) => v.len(),
        Codes::Int8(v) => v.len(),
    };
    assert!(rows >= len * d && values.scales.is_none_or(|s| s.len() >= len));
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `grouped` holds only for an AVX-512 `isa`, which comes from `Isa::check`; the
    // lengths are asserted above.
    unsafe {
        match values.rows {
            Codes::F32(v) => x86::rows_partial_512(scores, stride, len, v, values.scales, out, partials),
            Codes::Int8(v) => x86::rows_partial_512(scores, stride, len, v, values.scales, out, partials),
        }
    }
}

/// `out[i] = codes[i]` as f32 (exact), at the path's vector width: int8 pages read by many query
/// rows are widened once for all of them.
pub(crate) fn widen_codes(isa: Isa, codes: &[i8], out: &mut [f32]) {
    match isa {
        Isa::Scalar => widen_body(codes, out),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `isa` comes from `Isa::check`, so the CPU has AVX-512 F/BW/VL.
        Isa::Avx512 | Isa::Avx512Vnni => unsafe { x86::widen_512(codes, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, the CPU has AVX2 and FMA.
        Isa::Avx2 => unsafe { x86::widen_256(codes, out) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => widen_body(codes, out),
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

/// The element-wise body of [`widen_codes`]; the paths compile it at their own width.
#[inline(always)]
fn widen_body(codes: &[i8], out: &mut [f32]) {
    for (o, &c) in out.iter_mut().zip(codes) {
        *o = f32::from(c);
    }
}

fn page_scores_scalar<T: Code>(page: PageScores<'_>, keys: &[T], spans: &[RowSpan], scores: &mut [f32], stride: usize) {
    let (d, rows) = (page.head_dim, page.page_rows);
    for (r, span) in spans.iter().enumerate() {
        let q = &page.q[span.q_start..span.q_start + d];
        for t in span.first..span.end {
            let mut dot = 0f32;
            for (j, &x) in q.iter().enumerate() {
                dot += x * keys[j * rows + t].value();
            }
            let dot = page.key_scales.map_or(dot, |ks| dot * ks[t]);
            scores[r * stride + t] = page.scale * dot;
        }
    }
}

fn row_partial_scalar<T: Code>(weights: &mut [f32], v: &[T], scales: Option<&[f32]>, out: &mut [f32]) -> (f32, f32) {
    let page_max = weights.iter().fold(f32::NEG_INFINITY, |m, &w| m.max(w));
    let mut page_sum = 0f32;
    for w in weights.iter_mut() {
        *w = (*w - page_max).exp();
        page_sum += *w;
    }
    fold_scales(weights, scales);
    weighted_sum(weights, &v[..weights.len() * out.len()], out);
    (page_max, page_sum)
}

/// `weights[t] ·= scales[t]`: an int8 row's scale moves onto its weight.
#[inline(always)]
fn fold_scales(weights: &mut [f32], scales: Option<&[f32]>) {
    if let Some(scales) = scales {
        for (w, &s) in weights.iter_mut().zip(scales) {
            *w *= s;
        }
    }
}

/// `out = Σₜ weights[t] · rows[t]` over rows of `out.len()` values: column blocks of 32, then 8,
/// then single columns, each block summed over the rows in registers.
#[inline]
fn weighted_sum<T: Code>(weights: &[f32], rows: &[T], out: &mut [f32]) {
    let d = out.len();
    let done = weighted_sum_columns::<T, 32>(weights, rows, d, 0, out);
    let done = weighted_sum_columns::<T, 8>(weights, rows, d, done, out);
    for (j, o) in out.iter_mut().enumerate().skip(done) {
        *o = weights.iter().enumerate().map(|(t, &w)| w * rows[t * d + j].value()).sum();
    }
}

/// [`weighted_sum`] for the whole blocks of `W` columns from column `first`; returns the first
/// column left.
#[inline(always)]
fn weighted_sum_columns<T: Code, const W: usize>(
    weights: &[f32],
    rows: &[T],
    d: usize,
    first: usize,
    out: &mut [f32],
) -> usize {
    let (blocks, _) = out[first..].as_chunks_mut::<W>();
    for (b, block) in blocks.iter_mut().enumerate() {
        let column = first + b * W;
        let mut lanes = [0f32; W];
        for (t, &w) in weights.iter().enumerate() {
            let row: &[T; W] = rows[t * d + column..][..W].try_into().expect("W values");
            for l in 0..W {
                lanes[l] += w * row[l].value();
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

    use super::{fold_scales, widen_body, PageScores, RowSpan};
    use crate::kernels::simd::{exp_256, exp_512, hsum_256};
    use std::arch::x86_64::*;

    /// How the SIMD paths load a page's values as f32 lanes.
    pub(crate) trait Lanes: Copy {
        /// Sixteen values from `p` as f32: the lanes of `m`, the others 0. Reads only the lanes
        /// of `m`; AVX-512 F/BW/VL.
        unsafe fn load_512(p: *const Self, m: __mmask16) -> __m512;
        /// Eight values from `p` as f32: the first `n`, the others 0. Reads only those; AVX2.
        unsafe fn load_256(p: *const Self, n: usize) -> __m256;
    }

    impl Lanes for f32 {
        #[inline(always)]
        unsafe fn load_512(p: *const f32, m: __mmask16) -> __m512 {
            _mm512_maskz_loadu_ps(m, p)
        }
        #[inline(always)]
        unsafe fn load_256(p: *const f32, n: usize) -> __m256 {
            _mm256_maskload_ps(p, mask_8(n))
        }
    }

    impl Lanes for i8 {
        #[inline(always)]
        unsafe fn load_512(p: *const i8, m: __mmask16) -> __m512 {
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, p)))
        }
        #[inline(always)]
        unsafe fn load_256(p: *const i8, n: usize) -> __m256 {
            let bytes = if n >= 8 {
                _mm_loadl_epi64(p.cast())
            } else {
                let mut b = [0i8; 16];
                std::ptr::copy_nonoverlapping(p, b.as_mut_ptr(), n);
                _mm_loadu_si128(b.as_ptr().cast())
            };
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes))
        }
    }

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

    /// The `R` spans' queries, as pointers into `q`.
    fn queries<const R: usize>(q: &[f32], block: &[RowSpan]) -> [*const f32; R] {
        std::array::from_fn(|j| q[block[j].q_start..].as_ptr())
    }

    /// The lanes `t0 + l` of a vector that `span` sees: `l` in `lo..hi`.
    fn seen_lanes(span: &RowSpan, t0: usize, width: usize) -> (usize, usize) {
        (span.first.saturating_sub(t0).min(width), span.end.saturating_sub(t0).min(width))
    }

    /// Stores the dot products `dots` of keys `t0..t0 + 16` as the scores `span` sees, into its
    /// row of scores: times the keys' scales (int8), times the call's scale.
    #[inline(always)]
    unsafe fn store_512(page: &PageScores<'_>, dots: __m512, span: &RowSpan, t0: usize, row: *mut f32) {
        let (lo, hi) = seen_lanes(span, t0, 16);
        if lo >= hi {
            return;
        }
        let m = mask_16(hi) & !mask_16(lo);
        let dots = match page.key_scales {
            Some(ks) => _mm512_mul_ps(dots, _mm512_maskz_loadu_ps(m, ks.as_ptr().add(t0))),
            None => dots,
        };
        _mm512_mask_storeu_ps(row.add(t0), m, _mm512_mul_ps(_mm512_set1_ps(page.scale), dots));
    }

    /// [`store_512`] for keys `t0..t0 + 8`.
    #[inline(always)]
    unsafe fn store_256(page: &PageScores<'_>, dots: __m256, span: &RowSpan, t0: usize, row: *mut f32) {
        let (lo, hi) = seen_lanes(span, t0, 8);
        if lo >= hi {
            return;
        }
        let m = _mm256_andnot_si256(mask_8(lo), mask_8(hi));
        let dots = match page.key_scales {
            Some(ks) => _mm256_mul_ps(dots, _mm256_maskload_ps(ks.as_ptr().add(t0), m)),
            None => dots,
        };
        _mm256_maskstore_ps(row.add(t0), m, _mm256_mul_ps(_mm256_set1_ps(page.scale), dots));
    }

    /// The scores of `R` spans (from span `first_span` of the call) over the keys any of them
    /// sees, 64 keys at a time: four vectors of keys per dimension, each loaded once for the `R`
    /// queries, sixteen keys' dot products side by side in a vector.
    #[inline(always)]
    unsafe fn block_scores_512<T: Lanes, const R: usize>(
        page: &PageScores<'_>,
        keys: *const T,
        block: &[RowSpan],
        scores: *mut f32,
        stride: usize,
    ) {
        let (d, page_rows, q) = (page.head_dim, page.page_rows, queries::<R>(page.q, block));
        let seen = key_rows(block);
        for t0 in seen.clone().step_by(64) {
            let n = (seen.end - t0).min(64);
            let masks: [__mmask16; 4] = std::array::from_fn(|c| mask_16(n.saturating_sub(16 * c)));
            let mut acc = [[_mm512_setzero_ps(); 4]; R];
            for j in 0..d {
                let row = keys.add(j * page_rows + t0);
                let k: [__m512; 4] = std::array::from_fn(|c| T::load_512(row.add(16 * c), masks[c]));
                for (acc, q) in acc.iter_mut().zip(q) {
                    let x = _mm512_set1_ps(*q.add(j));
                    for (a, k) in acc.iter_mut().zip(k) {
                        *a = _mm512_fmadd_ps(x, k, *a);
                    }
                }
            }
            for (r, (span, acc)) in block.iter().zip(acc).enumerate() {
                for (c, dots) in acc.into_iter().enumerate() {
                    store_512(page, dots, span, t0 + 16 * c, scores.add(r * stride));
                }
            }
        }
    }

    /// [`block_scores_512`] in eight-key vectors, 32 keys at a time.
    #[inline(always)]
    unsafe fn block_scores_256<T: Lanes, const R: usize>(
        page: &PageScores<'_>,
        keys: *const T,
        block: &[RowSpan],
        scores: *mut f32,
        stride: usize,
    ) {
        let (d, page_rows, q) = (page.head_dim, page.page_rows, queries::<R>(page.q, block));
        let seen = key_rows(block);
        for t0 in seen.clone().step_by(32) {
            let n = (seen.end - t0).min(32);
            let mut acc = [[_mm256_setzero_ps(); 4]; R];
            for j in 0..d {
                let row = keys.add(j * page_rows + t0);
                let k: [__m256; 4] = std::array::from_fn(|c| T::load_256(row.add(8 * c), n.saturating_sub(8 * c)));
                for (acc, q) in acc.iter_mut().zip(q) {
                    let x = _mm256_set1_ps(*q.add(j));
                    for (a, k) in acc.iter_mut().zip(k) {
                        *a = _mm256_fmadd_ps(x, k, *a);
                    }
                }
            }
            for (r, (span, acc)) in block.iter().zip(acc).enumerate() {
                for (c, dots) in acc.into_iter().enumerate() {
                    store_256(page, dots, span, t0 + 8 * c, scores.add(r * stride));
                }
            }
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
    pub(super) unsafe fn page_scores_512<T: Lanes>(
        page: PageScores<'_>,
        keys: &[T],
        spans: &[RowSpan],
        scores: &mut [f32],
        stride: usize,
    ) {
        // Thirty-two vector registers: four queries × four key vectors of accumulators.
        for (b, block) in spans.chunks(4).enumerate() {
            let (k, out) = (keys.as_ptr(), scores.as_mut_ptr().add(4 * b * stride));
            match block.len() {
                1 => block_scores_512::<T, 1>(&page, k, block, out, stride),
                2 => block_scores_512::<T, 2>(&page, k, block, out, stride),
                3 => block_scores_512::<T, 3>(&page, k, block, out, stride),
                _ => block_scores_512::<T, 4>(&page, k, block, out, stride),
            }
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn page_scores_256<T: Lanes>(
        page: PageScores<'_>,
        keys: &[T],
        spans: &[RowSpan],
        scores: &mut [f32],
        stride: usize,
    ) {
        // Sixteen vector registers: two queries × four key vectors of accumulators.
        for (b, block) in spans.chunks(2).enumerate() {
            let (k, out) = (keys.as_ptr(), scores.as_mut_ptr().add(2 * b * stride));
            match block.len() {
                1 => block_scores_256::<T, 1>(&page, k, block, out, stride),
                _ => block_scores_256::<T, 2>(&page, k, block, out, stride),
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
    unsafe fn weighted_columns_512<T: Lanes, const N: usize>(
        w: &[f32],
        v: *const T,
        d: usize,
        c: usize,
        out: *mut f32,
    ) {
        let mut acc = [_mm512_setzero_ps(); N];
        for (t, &wt) in w.iter().enumerate() {
            let wt = _mm512_set1_ps(wt);
            for (j, a) in acc.iter_mut().enumerate() {
                let col = c + 16 * j;
                *a = _mm512_fmadd_ps(wt, T::load_512(v.add(t * d + col), mask_16(d - col)), *a);
            }
        }
        for (j, a) in acc.iter().enumerate() {
            _mm512_mask_storeu_ps(out.add(c + 16 * j), mask_16(d - c - 16 * j), *a);
        }
    }

    /// [`weighted_columns_512`] in eight-value chunks.
    #[inline(always)]
    unsafe fn weighted_columns_256<T: Lanes, const N: usize>(
        w: &[f32],
        v: *const T,
        d: usize,
        c: usize,
        out: *mut f32,
    ) {
        let mut acc = [_mm256_setzero_ps(); N];
        for (t, &wt) in w.iter().enumerate() {
            let wt = _mm256_set1_ps(wt);
            for (j, a) in acc.iter_mut().enumerate() {
                let col = c + 8 * j;
                *a = _mm256_fmadd_ps(wt, T::load_256(v.add(t * d + col), d - col), *a);
            }
        }
        for (j, a) in acc.iter().enumerate() {
            _mm256_maskstore_ps(out.add(c + 8 * j), mask_8(d - c - 8 * j), *a);
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
    pub(super) unsafe fn row_partial_512<T: Lanes>(
        scores: &mut [f32],
        v: &[T],
        scales: Option<&[f32]>,
        out: &mut [f32],
    ) -> (f32, f32) {
        let partial = softmax_partial_512(scores);
        fold_scales(scores, scales);
        let (d, mut c) = (out.len(), 0);
        while c < d {
            match (d - c).div_ceil(16) {
                1 => weighted_columns_512::<T, 1>(scores, v.as_ptr(), d, c, out.as_mut_ptr()),
                2 => weighted_columns_512::<T, 2>(scores, v.as_ptr(), d, c, out.as_mut_ptr()),
                3 => weighted_columns_512::<T, 3>(scores, v.as_ptr(), d, c, out.as_mut_ptr()),
                _ => weighted_columns_512::<T, 4>(scores, v.as_ptr(), d, c, out.as_mut_ptr()),
            }
            c += 64;
        }
        partial
    }

    /// [`super::rows_partial`] on AVX-512: each row's softmax partial and scale folding as
    /// [`row_partial_512`] does them, then the weighted sum of 64 columns at a time for all rows.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
    pub(super) unsafe fn rows_partial_512<T: Lanes>(
        scores: &mut [f32],
        stride: usize,
        len: usize,
        v: &[T],
        scales: Option<&[f32]>,
        out: &mut [f32],
        partials: &mut [(f32, f32)],
    ) {
        for (r, partial) in partials.iter_mut().enumerate() {
            let row = &mut scores[r * stride..][..len];
            *partial = softmax_partial_512(row);
            fold_scales(row, scales);
        }
        let (d, w) = (out.len() / partials.len(), scores.as_ptr());
        for c in (0..d).step_by(64) {
            match partials.len() {
                2 => group_columns_512::<T, 2>((w, stride, len), v.as_ptr(), d, c, out.as_mut_ptr()),
                3 => group_columns_512::<T, 3>((w, stride, len), v.as_ptr(), d, c, out.as_mut_ptr()),
                _ => group_columns_512::<T, 4>((w, stride, len), v.as_ptr(), d, c, out.as_mut_ptr()),
            }
        }
    }

    /// [`weighted_columns_512`] with N = 4 for Q rows of weights (`stride` apart, `len` each):
    /// each value chunk is loaded once and fed to every row's own accumulators, in the order
    /// the one-row kernel uses.
    #[inline(always)]
    unsafe fn group_columns_512<T: Lanes, const Q: usize>(
        (w, stride, len): (*const f32, usize, usize),
        v: *const T,
        d: usize,
        c: usize,
        out: *mut f32,
    ) {
        let mut acc = [[_mm512_setzero_ps(); 4]; Q];
        for t in 0..len {
            let row = v.add(t * d + c);
            let vs: [__m512; 4] = std::array::from_fn(|j| T::load_512(row.add(16 * j), mask_16(d - c - 16 * j)));
            for (r, a) in acc.iter_mut().enumerate() {
                let wt = _mm512_set1_ps(*w.add(r * stride + t));
                for j in 0..4 {
                    a[j] = _mm512_fmadd_ps(wt, vs[j], a[j]);
                }
            }
        }
        for (r, a) in acc.iter().enumerate() {
            for (j, &x) in a.iter().enumerate() {
                _mm512_storeu_ps(out.add(r * d + c + 16 * j), x);
            }
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn row_partial_256<T: Lanes>(
        scores: &mut [f32],
        v: &[T],
        scales: Option<&[f32]>,
        out: &mut [f32],
    ) -> (f32, f32) {
        let partial = softmax_partial_256(scores);
        fold_scales(scores, scales);
        let (d, mut c) = (out.len(), 0);
        while c < d {
            match (d - c).div_ceil(8) {
                1 => weighted_columns_256::<T, 1>(scores, v.as_ptr(), d, c, out.as_mut_ptr()),
                2 => weighted_columns_256::<T, 2>(scores, v.as_ptr(), d, c, out.as_mut_ptr()),
                3 => weighted_columns_256::<T, 3>(scores, v.as_ptr(), d, c, out.as_mut_ptr()),
                _ => weighted_columns_256::<T, 4>(scores, v.as_ptr(), d, c, out.as_mut_ptr()),
            }
            c += 32;
        }
        partial
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
    pub(super) unsafe fn widen_512(codes: &[i8], out: &mut [f32]) {
        widen_body(codes, out);
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn widen_256(codes: &[i8], out: &mut [f32]) {
        widen_body(codes, out);
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

        fn codes(&mut self, n: usize) -> Vec<i8> {
            (0..n).map(|_| (self.value() * 63.75) as i8).collect()
        }

        fn below(&mut self, n: usize) -> usize {
            ((self.value() + 2.0) / 4.0 * n as f32) as usize % n
        }
    }

    fn simd_paths() -> Vec<Isa> {
        Isa::ALL.into_iter().filter(|i| *i != Isa::Scalar && i.is_available()).collect()
    }

    /// Rows weighted together give each row the bits of the one-row kernel, on every path, for
    /// f32 and int8 values, head sizes that take the grouped kernel (64, 128) and one that does not.
    #[test]
    fn rows_weighted_together_give_the_bits_of_one_row_each() {
        let mut rng = Rng(41);
        let (len, stride) = (37, 48);
        for isa in Isa::ALL.into_iter().filter(|i| i.is_available()) {
            for d in [64, 128, 80] {
                let (v, codes, scales) = (rng.values(len * d), rng.codes(len * d), rng.values(len));
                for q in 1..=GROUP_ROWS {
                    let scores = rng.values(q * stride);
                    for (rows, scales) in [(Codes::F32(&v), None), (Codes::Int8(&codes), Some(&scales[..]))] {
                        let values = RowValues { rows, scales };
                        let (mut together, mut out, mut partials) =
                            (scores.clone(), vec![0f32; q * d], vec![(0.0, 0.0); q]);
                        rows_partial(isa, (&mut together, stride, len), values, &mut out, &mut partials);
                        for r in 0..q {
                            let mut alone = scores[r * stride..][..len].to_vec();
                            let mut one = vec![0f32; d];
                            let partial = row_partial(isa, &mut alone, values, &mut one);
                            let what = format!("{isa} d {d} rows {q} row {r} int8 {}", scales.is_some());
                            assert_eq!(partial.0.to_bits(), partials[r].0.to_bits(), "{what}: max");
                            assert_eq!(partial.1.to_bits(), partials[r].1.to_bits(), "{what}: sum");
                            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                            assert_eq!(bits(&one), bits(&out[r * d..][..d]), "{what}: weighted values");
                        }
                    }
                }
            }
        }
    }

    /// A random page of `rows` valid rows (of `PAGE` rows) and `spans` query rows seeing parts of
    /// it; the keys and values as f32 and as int8 codes with a scale per row.
    struct Case {
        d: usize,
        q: Vec<f32>,
        /// Row-major `[rows, d]`, and the same transposed into a page of `PAGE` rows.
        k: Vec<f32>,
        k_t: Vec<f32>,
        v: Vec<f32>,
        k_codes_t: Vec<i8>,
        v_codes: Vec<i8>,
        scales: Vec<f32>,
        spans: Vec<RowSpan>,
    }

    const PAGE: usize = 19;

    fn transposed<T: Copy + Default>(rows: &[T], d: usize) -> Vec<T> {
        let mut t = vec![T::default(); d * PAGE];
        for (r, row) in rows.chunks(d).enumerate() {
            for (j, &x) in row.iter().enumerate() {
                t[j * PAGE + r] = x;
            }
        }
        t
    }

    fn case(rng: &mut Rng, d: usize, rows: usize, queries: usize) -> Case {
        let spans = (0..queries)
            .map(|r| {
                let end = 1 + rng.below(rows);
                RowSpan { row: r, q_start: r * d, first: rng.below(end), end }
            })
            .collect();
        let (k, k_codes) = (rng.values(rows * d), rng.codes(rows * d));
        let scales = (0..rows).map(|_| 0.01 * (rng.value() + 2.5)).collect();
        Case {
            d,
            q: rng.values(queries * d),
            k_t: transposed(&k, d),
            k,
            v: rng.values(rows * d),
            k_codes_t: transposed(&k_codes, d),
            v_codes: rng.codes(rows * d),
            scales,
            spans,
        }
    }

    fn page<'a>(c: &'a Case, keys: Codes<'a>, key_scales: Option<&'a [f32]>) -> PageScores<'a> {
        PageScores { q: &c.q, keys, key_scales, head_dim: c.d, page_rows: PAGE, scale: 0.125 }
    }

    fn scores(isa: Isa, page: PageScores<'_>, spans: &[RowSpan]) -> Vec<f32> {
        let mut out = vec![f32::NAN; spans.len() * PAGE];
        page_scores(isa, page, spans, &mut out, PAGE);
        out
    }

    /// Each SIMD path's scores, weights, maxima, sums and weighted sums within 1e-5 of the scalar
    /// path's (relative to the magnitudes summed), for head dims with and without vector tails,
    /// partial pages and windows (rows seeing a part of the page).
    #[test]
    fn every_path_matches_the_scalar_path_on_random_pages() {
        let mut rng = Rng(3);
        for d in [1, 8, 13, 24, 64, 100, 128] {
            for rows in [1, 5, 16, 19] {
                let c = case(&mut rng, d, rows, 7);
                let want = scores(Isa::Scalar, page(&c, Codes::F32(&c.k_t), None), &c.spans);
                for isa in simd_paths() {
                    let got = scores(isa, page(&c, Codes::F32(&c.k_t), None), &c.spans);
                    for (i, s) in c.spans.iter().enumerate() {
                        for t in s.first..s.end {
                            let bound: f32 =
                                c.q[s.q_start..][..d].iter().zip(&c.k[t * d..]).map(|(a, b)| (a * b).abs()).sum();
                            let (g, w) = (got[i * PAGE + t], want[i * PAGE + t]);
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
                (scores[i * PAGE..][s.first..s.end].to_vec(), scores[i * PAGE..][s.first..s.end].to_vec());
            let (mut want, mut got) = (vec![0f32; d], vec![0f32; d]);
            let v = RowValues { rows: Codes::F32(&c.v[s.first * d..s.end * d]), scales: None };
            let (max_want, sum_want) = row_partial(Isa::Scalar, &mut w_want, v, &mut want);
            let (max_got, sum_got) = row_partial(isa, &mut w_got, v, &mut got);
            assert_eq!(max_got, max_want, "{isa} d={d}: same scores, same maximum");
            assert!((sum_got - sum_want).abs() <= 1e-6 * sum_want, "{isa} d={d}: sum {sum_got} vs {sum_want}");
            for (j, (g, w)) in got.iter().zip(&want).enumerate() {
                let bound: f32 = w_want.iter().enumerate().map(|(t, x)| (x * c.v[(s.first + t) * d + j]).abs()).sum();
                assert!((g - w).abs() <= 1e-6 * bound.max(1e-30), "{isa} d={d} column {j}: {g} vs {w}");
            }
        }
    }

    /// Int8 keys and values with a scale per row: on every path, the scores and the partials of
    /// the codes read in place are the bits of the same codes widened to f32 first, and the
    /// scores are `scale · kscale · q·code` to f32 accuracy (f64 reference).
    #[test]
    fn int8_codes_in_place_give_the_bits_of_their_widened_copy() {
        let mut rng = Rng(5);
        for d in [13, 64, 128] {
            for rows in [3, 16, 19] {
                let c = case(&mut rng, d, rows, 6);
                let mut k_wide = vec![0f32; c.k_codes_t.len()];
                widen_codes(Isa::Scalar, &c.k_codes_t, &mut k_wide);
                for isa in Isa::ALL.into_iter().filter(|i| i.is_available()) {
                    let codes = scores(isa, page(&c, Codes::Int8(&c.k_codes_t), Some(&c.scales)), &c.spans);
                    let wide = scores(isa, page(&c, Codes::F32(&k_wide), Some(&c.scales)), &c.spans);
                    for (i, s) in c.spans.iter().enumerate() {
                        for t in s.first..s.end {
                            let (a, b) = (codes[i * PAGE + t], wide[i * PAGE + t]);
                            assert_eq!(a.to_bits(), b.to_bits(), "{isa} d={d}: score {a} vs {b}");
                            let exact: f64 = (0..d)
                                .map(|j| f64::from(c.q[s.q_start + j]) * f64::from(c.k_codes_t[j * PAGE + t]))
                                .sum::<f64>()
                                * f64::from(c.scales[t])
                                * 0.125;
                            let bound: f64 = (0..d)
                                .map(|j| (f64::from(c.q[s.q_start + j]) * f64::from(c.k_codes_t[j * PAGE + t])).abs())
                                .sum::<f64>()
                                * f64::from(c.scales[t]);
                            assert!((f64::from(a) - exact).abs() <= 1e-6 * bound, "{isa} d={d}: {a} vs {exact}");
                        }
                    }
                    check_int8_partials(isa, &c, &codes);
                }
            }
        }
    }

    fn check_int8_partials(isa: Isa, c: &Case, scores: &[f32]) {
        let d = c.d;
        for (i, s) in c.spans.iter().enumerate() {
            let codes = &c.v_codes[s.first * d..s.end * d];
            let mut wide = vec![0f32; codes.len()];
            widen_codes(isa, codes, &mut wide);
            let scales = Some(&c.scales[s.first..s.end]);
            let mut outs = [vec![0f32; d], vec![0f32; d]];
            let mut partials = [(0f32, 0f32); 2];
            for (n, rows) in [Codes::Int8(codes), Codes::F32(&wide)].into_iter().enumerate() {
                let mut w = scores[i * PAGE..][s.first..s.end].to_vec();
                partials[n] = row_partial(isa, &mut w, RowValues { rows, scales }, &mut outs[n]);
            }
            assert_eq!(partials[0], partials[1], "{isa} d={d}");
            assert!(outs[0].iter().zip(&outs[1]).all(|(a, b)| a.to_bits() == b.to_bits()), "{isa} d={d}");
            // The values' scales weight the rows: against f64 with the same weights.
            let mut w = scores[i * PAGE..][s.first..s.end].to_vec();
            let (max, _) =
                row_partial(Isa::Scalar, &mut w, RowValues { rows: Codes::F32(&wide), scales: None }, &mut outs[1]);
            for (j, &got) in outs[0].iter().enumerate() {
                let weight = |t: usize| (f64::from(scores[i * PAGE + s.first + t]) - f64::from(max)).exp();
                let terms = (0..s.end - s.first)
                    .map(|t| weight(t) * f64::from(c.scales[s.first + t]) * f64::from(codes[t * d + j]));
                let (exact, bound) = terms.fold((0f64, 0f64), |(e, b), x| (e + x, b + x.abs()));
                assert!(
                    (f64::from(got) - exact).abs() <= 1e-5 * bound.max(1e-30),
                    "{isa} d={d} column {j}: {got} vs {exact}"
                );
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
                let c = case(&mut rng, d, 19, 6);
                for p in [page(&c, Codes::F32(&c.k_t), None), page(&c, Codes::Int8(&c.k_codes_t), Some(&c.scales))] {
                    let together = scores(isa, p, &c.spans);
                    for (i, s) in c.spans.iter().enumerate() {
                        let alone = scores(isa, p, std::slice::from_ref(s));
                        let (a, b) = (&alone[s.first..s.end], &together[i * PAGE..][s.first..s.end]);
                        assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "{isa} d={d} row {i}");
                    }
                }
            }
        }
    }

    /// Widening is exact on every path, tails included.
    #[test]
    fn int8_codes_widen_exactly_on_every_path() {
        let codes: Vec<i8> = (0..5 * 24 + 3).map(|i| (i * 37 % 255 - 127) as i8).collect();
        for isa in Isa::ALL.into_iter().filter(|i| i.is_available()) {
            let mut got = vec![f32::NAN; codes.len()];
            widen_codes(isa, &codes, &mut got);
            assert!(got.iter().zip(&codes).all(|(&g, &c)| g == f32::from(c)), "{isa}");
        }
    }
}

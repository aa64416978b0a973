//! Attention over one layer of a sequence, page by page, with an online softmax.
//!
//! For one query row q and the key rows t it may see, attention is
//! `y = Σₜ exp(sₜ − m)·vₜ / Σₜ exp(sₜ − m)` with `sₜ = scale·q·kₜ` and any m ≥ maxₜ sₜ. Each page
//! contributes a partial `(mₚ, lₚ, oₚ)`: its own maximum score, `lₚ = Σ exp(sₜ − mₚ)` and
//! `oₚ = Σ exp(sₜ − mₚ)·vₜ` over its visible rows. Two partials merge exactly (the rescaling
//! identity): with `m = max(m₁, m₂)`, `l = l₁·e^(m₁−m) + l₂·e^(m₂−m)` and
//! `o = o₁·e^(m₁−m) + o₂·e^(m₂−m)`; the output is `o / l` once every page has been merged. The
//! past is read where it lies in the pool, never gathered into one buffer: f32 pages are read in
//! place, f16 and int8 pages (`code · scale`) are converted to f32 one page at a time into the
//! scratch, once for all the query rows reading them. Scores, exponentials, dot products and
//! value sums are f32; the running maximum and denominator are f64.

use half::slice::HalfFloatSliceExt;

use super::pool::PageView;

/// Working memory of [`super::KvCache::attend_with`]: the running softmax state of every query
/// row of one KV head group and one page of converted rows. It grows to the largest call it has
/// served and never shrinks, so decoding with one scratch does not allocate.
#[derive(Debug, Default)]
pub struct AttendScratch {
    /// Running maximum and denominator per query row.
    states: Vec<(f64, f64)>,
    /// Running weighted value sum per query row, `head_dim` values each.
    acc: Vec<f32>,
    /// The current page's weighted value sum for one query row.
    page_acc: Vec<f32>,
    /// The current page's scores, then weights, for one query row.
    scores: Vec<f32>,
    /// An f16 or int8 page converted to f32, K then V.
    k_rows: Vec<f32>,
    v_rows: Vec<f32>,
}

impl AttendScratch {
    /// A scratch sized for `query_rows` query rows (query heads per KV head × new tokens).
    pub fn with_capacity(query_rows: usize, head_dim: usize, page_rows: usize) -> AttendScratch {
        let mut scratch = AttendScratch::default();
        scratch.reserve(query_rows, head_dim, page_rows);
        scratch
    }

    pub(crate) fn reserve(&mut self, query_rows: usize, head_dim: usize, page_rows: usize) {
        fn at_least<T: Clone>(v: &mut Vec<T>, n: usize, fill: T) {
            if v.len() < n {
                v.resize(n, fill);
            }
        }
        at_least(&mut self.states, query_rows, (f64::NEG_INFINITY, 0.0));
        at_least(&mut self.acc, query_rows * head_dim, 0.0);
        at_least(&mut self.page_acc, head_dim, 0.0);
        at_least(&mut self.scores, page_rows, 0.0);
        at_least(&mut self.k_rows, page_rows * head_dim, 0.0);
        at_least(&mut self.v_rows, page_rows * head_dim, 0.0);
    }
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

/// How a query row scores the keys it sees: `scale · q·k`, over every earlier key or over the
/// last `window` positions (its own included: a sliding window).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scoring {
    pub scale: f32,
    pub window: Option<std::num::NonZeroUsize>,
}

impl From<f32> for Scoring {
    fn from(scale: f32) -> Scoring {
        Scoring { scale, window: None }
    }
}

/// What one call attends: the queries of one KV head group and where they sit in the sequence.
pub(crate) struct GroupQueries<'a> {
    /// `[q_heads, S, D]`: the whole query tensor of the call.
    pub q: &'a [f32],
    pub head_dim: usize,
    /// Query heads of this group: `first_q_head..first_q_head + group`.
    pub first_q_head: usize,
    pub group: usize,
    /// New tokens S; token i sits at position `first_position + i` and sees keys `0..=` it.
    pub tokens: usize,
    pub first_position: usize,
    pub scale: f32,
    /// A sliding window: token at position p sees keys `p + 1 − w..=p` only.
    pub window: Option<std::num::NonZeroUsize>,
}

impl GroupQueries<'_> {
    fn rows(&self) -> usize {
        self.group * self.tokens
    }

    /// Query row `r` of the group (head `r / S`, token `r % S`) and its position.
    fn row(&self, r: usize) -> (&[f32], usize) {
        let (j, i) = (r / self.tokens, r % self.tokens);
        let start = ((self.first_q_head + j) * self.tokens + i) * self.head_dim;
        (&self.q[start..start + self.head_dim], self.first_position + i)
    }
}

pub(crate) fn begin(scratch: &mut AttendScratch, queries: &GroupQueries, page_rows: usize) {
    scratch.reserve(queries.rows(), queries.head_dim, page_rows);
    scratch.states[..queries.rows()].fill((f64::NEG_INFINITY, 0.0));
    scratch.acc[..queries.rows() * queries.head_dim].fill(0.0);
}

/// Merges one page holding sequence rows `page_start..page_start + valid_rows` into the running
/// state of every query row of the group.
pub(crate) fn merge_page(
    scratch: &mut AttendScratch,
    queries: &GroupQueries,
    page: PageView<'_>,
    page_start: usize,
    valid_rows: usize,
) {
    let (d, n) = (queries.head_dim, valid_rows * queries.head_dim);
    match page {
        PageView::F32 { k, v } => merge_rows(scratch, queries, &k[..n], &v[..n], page_start),
        PageView::F16 { k, v } => merge_converted(scratch, queries, page_start, n, |k_rows, v_rows| {
            k[..n].convert_to_f32_slice(k_rows);
            v[..n].convert_to_f32_slice(v_rows);
        }),
        PageView::Int8 { k, v, k_scales, v_scales } => {
            merge_converted(scratch, queries, page_start, n, |k_rows, v_rows| {
                dequantize(&k[..n], k_scales, d, k_rows);
                dequantize(&v[..n], v_scales, d, v_rows);
            })
        }
    }
}

/// Converts the `n` valid values of a page's K and V into the scratch with `convert`, once for all
/// the query rows reading them, then merges them.
fn merge_converted(
    scratch: &mut AttendScratch,
    queries: &GroupQueries,
    page_start: usize,
    n: usize,
    convert: impl FnOnce(&mut [f32], &mut [f32]),
) {
    let (mut k_rows, mut v_rows) = (std::mem::take(&mut scratch.k_rows), std::mem::take(&mut scratch.v_rows));
    convert(&mut k_rows[..n], &mut v_rows[..n]);
    merge_rows(scratch, queries, &k_rows[..n], &v_rows[..n], page_start);
    (scratch.k_rows, scratch.v_rows) = (k_rows, v_rows);
}

/// `out[t] = codes[t] · scales[t]` for rows of `d` values.
fn dequantize(codes: &[i8], scales: &[f32], d: usize, out: &mut [f32]) {
    for ((row, out), &scale) in codes.chunks_exact(d).zip(out.chunks_exact_mut(d)).zip(scales) {
        for (o, &c) in out.iter_mut().zip(row) {
            *o = c as f32 * scale;
        }
    }
}

/// Merges the page whose f32 rows are `k` and `v` (`[rows, D]`, the valid rows only), holding
/// sequence rows from `page_start`.
fn merge_rows(scratch: &mut AttendScratch, queries: &GroupQueries, k: &[f32], v: &[f32], page_start: usize) {
    let d = queries.head_dim;
    let valid_rows = k.len() / d;
    for r in 0..queries.rows() {
        let (q, position) = queries.row(r);
        // Causality: the query at `position` sees keys up to and including its own row, and
        // with a window none before `position + 1 − w`.
        let first = queries.window.map_or(0, |w| (position + 1).saturating_sub(w.get())).saturating_sub(page_start);
        if position < page_start || first >= valid_rows {
            continue;
        }
        let visible = valid_rows.min(position + 1 - page_start);
        let (k, v) = (&k[first * d..visible * d], &v[first * d..visible * d]);
        let visible = visible - first;
        // The page's partial: maximum score, sum of exponentials, weighted value sum.
        let weights = &mut scratch.scores[..visible];
        for (t, w) in weights.iter_mut().enumerate() {
            *w = queries.scale * dot(q, &k[t * d..(t + 1) * d]);
        }
        let page_max = weights.iter().fold(f32::NEG_INFINITY, |m, &w| m.max(w));
        let mut page_sum = 0f32;
        for w in weights.iter_mut() {
            *w = (*w - page_max).exp();
            page_sum += *w;
        }
        let page_acc = &mut scratch.page_acc[..d];
        weighted_sum(weights, &v[..visible * d], page_acc);
        merge_partial(&mut scratch.states[r], &mut scratch.acc[r * d..(r + 1) * d], page_max, page_sum, page_acc);
    }
}

/// Merges a partial `(page_max, page_sum, page_acc)` into a running `(max, sum)` and `acc`:
/// both are rescaled to the larger maximum, then added.
#[inline]
fn merge_partial(state: &mut (f64, f64), acc: &mut [f32], page_max: f32, page_sum: f32, page_acc: &[f32]) {
    let (max, sum) = *state;
    let page_max = page_max as f64;
    let new_max = max.max(page_max);
    // exp(−∞) = 0 clears the empty initial state.
    let old_weight = (max - new_max).exp();
    let page_weight = (page_max - new_max).exp();
    *state = (new_max, sum * old_weight + page_sum as f64 * page_weight);
    let (old_weight, page_weight) = (old_weight as f32, page_weight as f32);
    if old_weight == 1.0 {
        for (a, &p) in acc.iter_mut().zip(page_acc) {
            *a += page_weight * p;
        }
    } else {
        for (a, &p) in acc.iter_mut().zip(page_acc) {
            *a = *a * old_weight + page_weight * p;
        }
    }
}

/// Writes `acc / sum` of every query row of the group into `out` (`[q_heads, S, D]`, or the part of
/// it from query head `out_first_head`).
pub(crate) fn finish(scratch: &AttendScratch, queries: &GroupQueries, out_first_head: usize, out: &mut [f32]) {
    let d = queries.head_dim;
    for r in 0..queries.rows() {
        let (j, i) = (r / queries.tokens, r % queries.tokens);
        let start = ((queries.first_q_head - out_first_head + j) * queries.tokens + i) * d;
        let sum = scratch.states[r].1;
        for (o, &a) in out[start..start + d].iter_mut().zip(&scratch.acc[r * d..(r + 1) * d]) {
            *o = (a as f64 / sum) as f32;
        }
    }
}

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
use crate::kernels::attention::{self, Codes, PageScores, RowSpan, RowValues};
use crate::kernels::Isa;

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
    /// The query rows that see the current page, and the page rows each sees.
    spans: Vec<RowSpan>,
    /// The current page's scores, then weights, `page_rows` per span.
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
        at_least(&mut self.page_acc, attention::GROUP_ROWS * head_dim, 0.0);
        at_least(&mut self.scores, query_rows * page_rows, 0.0);
        self.spans.reserve(query_rows.saturating_sub(self.spans.len()));
        at_least(&mut self.k_rows, page_rows * head_dim, 0.0);
        at_least(&mut self.v_rows, page_rows * head_dim, 0.0);
    }
}

/// How a query row scores the keys it sees: `scale · q·k`, over every earlier key or over the
/// last `window` positions (its own included: a sliding window); `sinks`, one logit per query
/// head, join the softmax's denominator and weight no value (gpt-oss's attention sinks).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scoring<'a> {
    pub scale: f32,
    pub window: Option<std::num::NonZeroUsize>,
    pub sinks: Option<&'a [f32]>,
}

impl From<f32> for Scoring<'_> {
    fn from(scale: f32) -> Self {
        Scoring { scale, window: None, sinks: None }
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
    /// A sink logit per query head (of all `q_heads`), or none.
    pub sinks: Option<&'a [f32]>,
}

impl GroupQueries<'_> {
    fn rows(&self) -> usize {
        self.group * self.tokens
    }

    /// Where query row `r` of the group (head `r / S`, token `r % S`) starts in `q`, and its
    /// position.
    fn row(&self, r: usize) -> (usize, usize) {
        let (j, i) = (r / self.tokens, r % self.tokens);
        (((self.first_q_head + j) * self.tokens + i) * self.head_dim, self.first_position + i)
    }

    /// The rows of the group that see any of the page rows `page_start..page_start +
    /// valid_rows`, with the ones they see, into `spans`.
    fn spans(&self, page_start: usize, valid_rows: usize, spans: &mut Vec<RowSpan>) {
        spans.clear();
        for r in 0..self.rows() {
            let (q_start, position) = self.row(r);
            // Causality: the query at `position` sees keys up to and including its own row, and
            // with a window none before `position + 1 − w`.
            let first = self.window.map_or(0, |w| (position + 1).saturating_sub(w.get())).saturating_sub(page_start);
            if position < page_start || first >= valid_rows {
                continue;
            }
            let end = valid_rows.min(position + 1 - page_start);
            spans.push(RowSpan { row: r, q_start, first, end });
        }
    }
}

pub(crate) fn begin(scratch: &mut AttendScratch, queries: &GroupQueries, page_rows: usize) {
    scratch.reserve(queries.rows(), queries.head_dim, page_rows);
    // A sink is a page of one key scoring the sink logit, whose value is zero: (max, sum) =
    // (sink, e⁰), nothing added to the accumulator.
    for (r, state) in scratch.states[..queries.rows()].iter_mut().enumerate() {
        let sink = queries.sinks.map(|s| s[queries.first_q_head + r / queries.tokens]);
        *state = sink.map_or((f64::NEG_INFINITY, 0.0), |s| (f64::from(s), 1.0));
    }
    scratch.acc[..queries.rows() * queries.head_dim].fill(0.0);
}

/// When an int8 page is widened to f32 in the scratch, once for all the query rows reading it,
/// rather than read in place (where every block of four query rows widens the keys in registers,
/// and so does every group of rows weighting the values together — up to
/// [`attention::GROUP_ROWS`] on AVX-512, one row elsewhere): the keys above this many rows (each
/// widened key vector serves four rows' FMAs, so widening pays only when the rows are many), the
/// values above as many rows as one group holds. The bits are the same either way.
const WIDEN_KEYS_ABOVE: usize = 8;

fn widen_values(isa: Isa, spans: usize) -> bool {
    match isa {
        Isa::Avx512 | Isa::Avx512Vnni => spans > attention::GROUP_ROWS,
        _ => spans > 1,
    }
}

/// Where a page's rows lie: `page_rows` rows per page (the keys' row stride), the first
/// `valid_rows` of them held.
#[derive(Clone, Copy)]
pub(crate) struct PageRows {
    pub page_rows: usize,
    pub valid_rows: usize,
}

/// Merges one page holding sequence rows `page_start..page_start + valid_rows` into the running
/// state of every query row of the group, on the `isa` path.
pub(crate) fn merge_page(
    isa: Isa,
    scratch: &mut AttendScratch,
    queries: &GroupQueries,
    page: PageView<'_>,
    rows: PageRows,
    page_start: usize,
) {
    queries.spans(page_start, rows.valid_rows, &mut scratch.spans);
    if scratch.spans.is_empty() {
        return;
    }
    let n = rows.valid_rows * queries.head_dim;
    match page {
        PageView::F32 { k, v } => {
            let (keys, values) = (Codes::F32(k), Codes::F32(&v[..n]));
            merge_rows(isa, scratch, queries, rows, (keys, None), (values, None));
        }
        PageView::F16 { k, v } => merge_converted(isa, scratch, queries, rows, |k_rows, v_rows| {
            k.convert_to_f32_slice(k_rows);
            v[..n].convert_to_f32_slice(v_rows);
        }),
        PageView::Int8 { k, v, k_scales, v_scales } => {
            merge_int8(isa, scratch, queries, rows, (k, k_scales), (&v[..n], v_scales));
        }
    }
}

/// Merges an int8 page: its keys and values with their scales, each read in place or widened in
/// the scratch first (see [`WIDEN_KEYS_ABOVE`]).
fn merge_int8(
    isa: Isa,
    scratch: &mut AttendScratch,
    queries: &GroupQueries,
    rows: PageRows,
    (k, k_scales): (&[i8], &[f32]),
    (v, v_scales): (&[i8], &[f32]),
) {
    let spans = scratch.spans.len();
    let (mut k_rows, mut v_rows) = (std::mem::take(&mut scratch.k_rows), std::mem::take(&mut scratch.v_rows));
    let keys = if spans > WIDEN_KEYS_ABOVE {
        attention::widen_codes(isa, k, &mut k_rows[..k.len()]);
        Codes::F32(&k_rows[..k.len()])
    } else {
        Codes::Int8(k)
    };
    let values = if widen_values(isa, spans) {
        attention::widen_codes(isa, v, &mut v_rows[..v.len()]);
        Codes::F32(&v_rows[..v.len()])
    } else {
        Codes::Int8(v)
    };
    merge_rows(isa, scratch, queries, rows, (keys, Some(k_scales)), (values, Some(v_scales)));
    (scratch.k_rows, scratch.v_rows) = (k_rows, v_rows);
}

/// Starts loading a page that is about to be merged: its keys (transposed, so the whole page)
/// and its first `valid_rows` value rows.
pub(crate) fn prefetch_page(page: PageView<'_>, valid_rows: usize, head_dim: usize) {
    let n = valid_rows * head_dim;
    match page {
        PageView::F32 { k, v } => (attention::prefetch(k), attention::prefetch(&v[..n])),
        PageView::F16 { k, v } => (attention::prefetch(k), attention::prefetch(&v[..n])),
        PageView::Int8 { k, v, k_scales, v_scales } => {
            attention::prefetch(&k_scales[..valid_rows]);
            attention::prefetch(&v_scales[..valid_rows]);
            (attention::prefetch(k), attention::prefetch(&v[..n]))
        }
    };
}

/// Converts a page's K (all of it, transposed) and its valid V rows into the scratch with
/// `convert`, once for all the query rows reading them, then merges them.
fn merge_converted(
    isa: Isa,
    scratch: &mut AttendScratch,
    queries: &GroupQueries,
    rows: PageRows,
    convert: impl FnOnce(&mut [f32], &mut [f32]),
) {
    let (k_len, v_len) = (rows.page_rows * queries.head_dim, rows.valid_rows * queries.head_dim);
    let (mut k_rows, mut v_rows) = (std::mem::take(&mut scratch.k_rows), std::mem::take(&mut scratch.v_rows));
    convert(&mut k_rows[..k_len], &mut v_rows[..v_len]);
    let (keys, values) = ((Codes::F32(&k_rows[..k_len]), None), (Codes::F32(&v_rows[..v_len]), None));
    merge_rows(isa, scratch, queries, rows, keys, values);
    (scratch.k_rows, scratch.v_rows) = (k_rows, v_rows);
}

/// Merges a page into the rows of `scratch.spans`: its `keys` (transposed, `[head_dim,
/// page_rows]`) and `values` (`[valid_rows, head_dim]`), each with its rows' scales when they are
/// int8 codes. Every span's scores first, reading each key once for up to four of them, then each
/// span's partial.
fn merge_rows(
    isa: Isa,
    scratch: &mut AttendScratch,
    queries: &GroupQueries,
    rows: PageRows,
    (keys, key_scales): (Codes<'_>, Option<&[f32]>),
    (values, value_scales): (Codes<'_>, Option<&[f32]>),
) {
    let (d, stride) = (queries.head_dim, rows.valid_rows);
    let page =
        PageScores { q: queries.q, keys, key_scales, head_dim: d, page_rows: rows.page_rows, scale: queries.scale };
    attention::page_scores(isa, page, &scratch.spans, &mut scratch.scores, stride);
    // Consecutive query rows that see the same page rows (a decode step's query heads) weight
    // the value rows together.
    let mut i = 0;
    while i < scratch.spans.len() {
        let span = scratch.spans[i];
        let same = |s: &&RowSpan| (s.first, s.end) == (span.first, span.end);
        let q = scratch.spans[i..].iter().take(attention::GROUP_ROWS).take_while(same).count();
        let page_acc = &mut scratch.page_acc[..q * d];
        let span_values = RowValues {
            rows: values.rows(span.first * d..span.end * d),
            scales: value_scales.map(|s| &s[span.first..span.end]),
        };
        let weights = (&mut scratch.scores[i * stride + span.first..], stride, span.end - span.first);
        let mut partials = [(0.0, 0.0); attention::GROUP_ROWS];
        attention::rows_partial(isa, weights, span_values, page_acc, &mut partials[..q]);
        for (r, &(page_max, page_sum)) in partials[..q].iter().enumerate() {
            let row = scratch.spans[i + r].row;
            let acc = &mut scratch.acc[row * d..(row + 1) * d];
            merge_partial(&mut scratch.states[row], acc, page_max, page_sum, &page_acc[r * d..][..d]);
        }
        i += q;
    }
}

/// Merges a partial `(page_max, page_sum, page_acc)` into a running `(max, sum)` and `acc`:
/// both are rescaled to the larger maximum, then added.
#[inline]
fn merge_partial(state: &mut (f64, f64), acc: &mut [f32], page_max: f32, page_sum: f32, page_acc: &[f32]) {
    let (max, sum) = *state;
    let page_max = page_max as f64;
    let new_max = max.max(page_max);
    // One of the two weights is e⁰ = 1, exactly; exp(−∞) = 0 clears the empty initial state.
    let (old_weight, page_weight) =
        if page_max <= max { (1.0, (page_max - max).exp()) } else { ((max - page_max).exp(), 1.0) };
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

//! The recurrent layers of a step and their gates (f32 arithmetic): CausalConvWithState and
//! LinearAttention read and update the step's sequence's state slots in place (no copy per
//! token; a verify step also keeps the state after each row, see `exec::rollback`); the
//! element-wise gates, GatedRMSNorm, the L2 norm, GatedAdd and text-only M-RoPE write their
//! output buffer `y`.

use super::delta_chunk::DeltaChunk;
use super::View;
use crate::exec::error::{node_fail, ExecError};
use crate::exec::plan::{LinearHeads, Op, StateSlot};
use crate::exec::Executor;
use crate::kernels::{split_range, SyncPtr, ThreadPool};
use crate::kvcache::SeqId;
use std::sync::Mutex;

/// The state of `seq` in slot `slot`.
fn slot_of(states: &mut [(SeqId, Vec<f32>)], seq: SeqId, slot: StateSlot) -> &mut [f32] {
    let (_, state) = states.iter_mut().find(|(s, _)| *s == seq).expect("every live sequence has a state");
    &mut state[slot.offset..slot.offset + slot.len]
}

pub(super) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

fn softplus(x: f32) -> f32 {
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}

impl Executor<'_> {
    pub(super) fn run_causal_conv(&mut self, index: usize, y: &mut [f32]) -> Result<(), ExecError> {
        let (node, op) = self.plan.node_op(index);
        let &Op::CausalConv { x, w, bias, state, channels, taps, silu, .. } = op else { unreachable!("a CausalConv") };
        let view = view!(self);
        let (input, weight, bias) = (view.f32(x), view.f32(w), bias.map(|b| view.f32(b)));
        let tokens = input.len() / channels;
        if tokens * channels != input.len()
            || weight.len() != channels * taps
            || bias.is_some_and(|b| b.len() != channels)
        {
            return Err(node_fail(node)(format!(
                "input of {} values, weight of {}: not {channels} channels of {taps} taps",
                input.len(),
                weight.len()
            )));
        }
        let slot = self.plan.states[state];
        let past = slot_of(&mut self.states, self.current, slot);
        let s = taps - 1;
        for t in 0..tokens {
            if let Some(kept) = self.row_states.slot_mut(t, slot) {
                conv_state_after(past, input, (channels, tokens, s), t + 1, kept);
            }
        }
        for c in 0..channels {
            let (x, w, p) = (&input[c * tokens..][..tokens], &weight[c * taps..][..taps], &mut past[c * s..][..s]);
            conv_channel(x, (w, bias.map_or(0.0, |b| b[c])), p, silu, &mut y[c * tokens..][..tokens]);
        }
        Ok(())
    }

    pub(super) fn run_linear_attention(&mut self, index: usize, y: &mut [f32]) -> Result<(), ExecError> {
        let (node, op) = self.plan.node_op(index);
        let &Op::LinearAttention { q, k, v, decay, beta, qk_l2norm_eps, state, heads: h, scale, .. } = op else {
            unreachable!("a LinearAttention")
        };
        let view = view!(self);
        let (mut q, mut k, v) = (view.f32(q), view.f32(k), view.f32(v));
        if let Some(eps) = qk_l2norm_eps {
            let (qn, kn) = &mut self.qk_scratch;
            for (x, normed) in [(q, &mut *qn), (k, &mut *kn)] {
                normed.clear();
                normed.extend_from_slice(x);
                l2_normalize_rows(normed, h.dk, eps);
            }
            (q, k) = (&qn[..], &kn[..]);
        }
        let tokens = q.len() / (h.q_heads * h.dk);
        let x = LinearInputs { h, q, k, v, decay: decay.map(|d| view.f32(d)), beta: beta.map(|b| view.f32(b)), tokens };
        if !x.consistent() {
            return Err(node_fail(node)(format!("q, k, v, decay and beta do not hold the same {tokens} tokens")));
        }
        let slot = self.plan.states[state];
        let st = slot_of(&mut self.states, self.current, slot);
        if !self.row_states.recording() {
            delta_rule_rows(&x, st, (self.delta_chunk, Some(&self.pool)), &mut self.delta_scratch, scale, y);
            return Ok(());
        }
        // Chunks keep no per-row states: a verify step's rows go token by token.
        let row = &mut self.delta_scratch.row;
        row.resize(h.dv, 0.0);
        for t in 0..tokens {
            x.update_token(st, t, row);
            if let Some(kept) = self.row_states.slot_mut(t, slot) {
                kept.copy_from_slice(st);
            }
            x.output_token(st, t, scale, y);
        }
        Ok(())
    }
}

/// One thread's delta-rule scratch: a chunk, and a row of `dv` for the token-by-token form.
#[derive(Default)]
struct HeadScratch {
    chunk: DeltaChunk,
    row: Vec<f32>,
}

/// What runs one state head: `(head, its state, the thread's scratch, the output rows)`.
type HeadRun<'a> = dyn Fn(usize, &mut [f32], &mut HeadScratch, SyncPtr<f32>) + Sync + 'a;

/// A delta rule's scratch: one [`HeadScratch`] for each thread the state heads are split over,
/// and a row for a verify step's token-by-token loop.
#[derive(Default)]
pub(crate) struct DeltaScratch {
    heads: Vec<Mutex<HeadScratch>>,
    row: Vec<f32>,
}

/// The gated delta rule over every row of `x`, the state `st` updated in place, keeping no
/// per-row states, the state heads split over `pool`'s threads (each head on one thread, in
/// token order, so the bits do not depend on the threads): in chunks of `chunk` rows
/// ([`DeltaChunk`]) when there is more than one row and the decay is per head, else token by
/// token. The host executor's steps and the intel-npu plan's host step both run it.
pub(crate) fn delta_rule_rows(
    x: &LinearInputs,
    st: &mut [f32],
    (chunk, pool): (usize, Option<&ThreadPool>),
    scratch: &mut DeltaScratch,
    scale: f32,
    y: &mut [f32],
) {
    let chunked = chunk > 1 && x.tokens > 1 && !x.h.decay_per_key;
    x.by_heads(st, pool, &mut scratch.heads, y, &|head, s, hs, out| {
        if chunked {
            x.head_by_chunks(head, s, chunk, &mut hs.chunk, scale, out);
        } else {
            x.head_by_tokens(head, s, &mut hs.row, scale, out);
        }
    });
}

/// One channel of a depthwise causal convolution: `y[t]` (with `silu`, its SiLU) from this
/// step's inputs `x` and the `taps − 1` inputs before them in `past`, which then holds the last
/// `taps − 1` inputs of past-then-`x`.
pub(crate) fn conv_channel(x: &[f32], (w, bias): (&[f32], f32), past: &mut [f32], silu: bool, y: &mut [f32]) {
    let (taps, s) = (w.len(), past.len());
    for (t, out) in y[..x.len()].iter_mut().enumerate() {
        // Position s + t of the past-then-input sequence, tap j reading (taps - 1 - j) back.
        let acc = (0..taps).fold(bias, |acc, j| {
            let at = s + t - (taps - 1 - j);
            acc + w[j] * if at < s { past[at] } else { x[at - s] }
        });
        *out = if silu { acc * sigmoid(acc) } else { acc };
    }
    // The last s values of past-then-input; ascending, so each read precedes its overwrite.
    for i in 0..s {
        let at = x.len() + i;
        past[i] = if at < s { past[at] } else { x[at - s] };
    }
}

/// A LinearAttention step's inputs: `tokens` rows of queries, keys, values and gates.
pub(crate) struct LinearInputs<'a> {
    pub h: LinearHeads,
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    /// Log decay per token and head (or key dimension).
    pub decay: Option<&'a [f32]>,
    pub beta: Option<&'a [f32]>,
    pub tokens: usize,
}

impl LinearInputs<'_> {
    fn decay_width(&self) -> usize {
        if self.h.decay_per_key {
            self.h.kv_heads * self.h.dk
        } else {
            self.h.kv_heads
        }
    }

    /// Every input holds `tokens` rows.
    fn consistent(&self) -> bool {
        let (h, fits) = (self.h, |len: usize, width: usize| len == self.tokens * width);
        let bw = if h.beta_shared { 1 } else { h.kv_heads };
        fits(self.k.len(), h.k_heads * h.dk)
            && fits(self.v.len(), h.kv_heads * h.dv)
            && self.decay.is_none_or(|d| fits(d.len(), self.decay_width()))
            && self.beta.is_none_or(|b| fits(b.len(), bw))
    }

    fn key(&self, t: usize, head: usize) -> &[f32] {
        let h = self.h;
        &self.k[(t * h.k_heads + h.key_head_of(head)) * h.dk..][..h.dk]
    }

    fn value(&self, t: usize, head: usize) -> &[f32] {
        &self.v[(t * self.h.kv_heads + head) * self.h.dv..][..self.h.dv]
    }

    fn query(&self, t: usize, qh: usize) -> &[f32] {
        &self.q[(t * self.h.q_heads + qh) * self.h.dk..][..self.h.dk]
    }

    fn rate(&self, t: usize, head: usize) -> Option<f32> {
        self.beta.map(|b| if self.h.beta_shared { b[t] } else { b[t * self.h.kv_heads + head] })
    }

    /// Token `t`'s update of every state head of `st`.
    fn update_token(&self, st: &mut [f32], t: usize, scratch: &mut [f32]) {
        let (h, dw) = (self.h, self.decay_width());
        for head in 0..h.kv_heads {
            let s = &mut st[head * h.dk * h.dv..][..h.dk * h.dv];
            let g = self.decay.map(|d| &d[t * dw..][..dw]);
            update_state(&h, head, s, (self.key(t, head), self.value(t, head)), (g, self.rate(t, head)), scratch);
        }
    }

    /// Token `t`'s output rows from the state after it.
    fn output_token(&self, st: &[f32], t: usize, scale: f32, y: &mut [f32]) {
        let h = self.h;
        for o in 0..h.out_heads() {
            let (qh, head) = h.heads_of_output(o);
            let s = &st[head * h.dk * h.dv..][..h.dk * h.dv];
            self.output_row(s, (t, qh), scale, &mut y[(t * h.out_heads() + o) * h.dv..][..h.dv]);
        }
    }

    /// `row = scale · sᵀq` for token `t`'s query head `qh` and the state head `s` it reads.
    fn output_row(&self, s: &[f32], (t, qh): (usize, usize), scale: f32, row: &mut [f32]) {
        let dv = self.h.dv;
        row.fill(0.0);
        for (i, &qi) in self.query(t, qh).iter().enumerate() {
            row.iter_mut().zip(&s[i * dv..][..dv]).for_each(|(r, &e)| *r += e * qi);
        }
        row.iter_mut().for_each(|r| *r *= scale);
    }

    /// State head `head` token by token: its state `s`, its output heads' rows of `y`.
    fn head_by_tokens(&self, head: usize, s: &mut [f32], row: &mut Vec<f32>, scale: f32, y: SyncPtr<f32>) {
        let (h, dw) = (self.h, self.decay_width());
        row.resize(h.dv, 0.0);
        for t in 0..self.tokens {
            let g = self.decay.map(|d| &d[t * dw..][..dw]);
            update_state(&h, head, s, (self.key(t, head), self.value(t, head)), (g, self.rate(t, head)), row);
            for o in (0..h.out_heads()).filter(|&o| h.heads_of_output(o).1 == head) {
                // SAFETY: as in `head_by_chunks`.
                let out = unsafe { std::slice::from_raw_parts_mut(y.get().add((t * h.out_heads() + o) * h.dv), h.dv) };
                self.output_row(s, (t, h.heads_of_output(o).0), scale, out);
            }
        }
    }

    /// `run(head, state of head, scratch, y)` for every state head, the heads split over `pool`'s
    /// threads.
    fn by_heads(
        &self,
        st: &mut [f32],
        pool: Option<&ThreadPool>,
        scratch: &mut Vec<Mutex<HeadScratch>>,
        y: &mut [f32],
        run: &HeadRun,
    ) {
        let h = self.h;
        let head_len = h.dk * h.dv;
        let tasks = pool.map_or(1, ThreadPool::threads).min(h.kv_heads).max(1);
        if scratch.len() < tasks {
            scratch.resize_with(tasks, Default::default);
        }
        assert!(st.len() >= h.kv_heads * head_len && y.len() >= self.tokens * h.out_heads() * h.dv);
        let (state, out, scratch) = (SyncPtr(st.as_mut_ptr()), SyncPtr(y.as_mut_ptr()), &scratch[..]);
        let task = |t: usize| {
            let mut hs = scratch[t].lock().unwrap_or_else(|e| e.into_inner());
            for head in split_range(h.kv_heads, tasks, t) {
                // SAFETY: state head `head` is its own run of `st`, inside it (asserted above),
                // and this task's alone.
                let s = unsafe { std::slice::from_raw_parts_mut(state.get().add(head * head_len), head_len) };
                run(head, s, &mut hs, out);
            }
        };
        match pool {
            Some(pool) if tasks > 1 => pool.run(tasks, &task),
            _ => (0..tasks).for_each(task),
        }
    }

    /// State head `head`'s chunks in order: its output heads' rows of `y`, its state `s`.
    fn head_by_chunks(
        &self,
        head: usize,
        s: &mut [f32],
        chunk: usize,
        c: &mut DeltaChunk,
        scale: f32,
        y: SyncPtr<f32>,
    ) {
        let h = self.h;
        for start in (0..self.tokens).step_by(chunk) {
            let rows = chunk.min(self.tokens - start);
            c.start(rows, (h.dk, h.dv), self.beta.is_some());
            for r in 0..rows {
                let t = start + r;
                c.k[r * h.dk..][..h.dk].copy_from_slice(self.key(t, head));
                c.u[r * h.dv..][..h.dv].copy_from_slice(self.value(t, head));
                c.g[r] = self.decay.map_or(0.0, |d| d[t * h.kv_heads + head]);
                if let (Some(b), Some(rate)) = (&mut c.beta, self.rate(t, head)) {
                    b[r] = rate;
                }
            }
            c.solve(s);
            for o in (0..h.out_heads()).filter(|&o| h.heads_of_output(o).1 == head) {
                let qh = h.heads_of_output(o).0;
                for r in 0..rows {
                    let t = start + r;
                    // SAFETY: output head o's rows are read from state head `head` alone, so one
                    // task writes them; (t·heads + o + 1)·dv ≤ y's length (asserted by the caller).
                    let row =
                        unsafe { std::slice::from_raw_parts_mut(y.get().add((t * h.out_heads() + o) * h.dv), h.dv) };
                    c.output(s, r, self.query(t, qh), scale, row);
                }
            }
            c.update_state(s);
        }
    }
}

/// The conv state (`channels × s`, the last `s` inputs of each channel) after the first `rows`
/// of the step's `tokens` inputs (`input` channel-major), from the state `past` before them.
fn conv_state_after(
    past: &[f32],
    input: &[f32],
    (channels, tokens, s): (usize, usize, usize),
    rows: usize,
    out: &mut [f32],
) {
    for c in 0..channels {
        for i in 0..s {
            let at = rows + i;
            out[c * s + i] = if at < s { past[c * s + at] } else { input[c * tokens + at - s] };
        }
    }
}

/// One token's update of state head `head` (`dk × dv`): decay, then the delta rule's correction
/// (or the plain outer product without beta).
fn update_state(
    h: &LinearHeads,
    head: usize,
    s: &mut [f32],
    (key, value): (&[f32], &[f32]),
    (decay, rate): (Option<&[f32]>, Option<f32>),
    retrieved: &mut [f32],
) {
    let dv = h.dv;
    if let Some(g) = decay {
        for i in 0..h.dk {
            let gi = if h.decay_per_key { g[head * h.dk + i] } else { g[head] };
            let f = gi.exp();
            s[i * dv..(i + 1) * dv].iter_mut().for_each(|e| *e *= f);
        }
    }
    retrieved[..dv].copy_from_slice(value);
    if let Some(beta) = rate {
        for (i, &ki) in key.iter().enumerate() {
            retrieved[..dv].iter_mut().zip(&s[i * dv..][..dv]).for_each(|(r, &e)| *r -= e * ki);
        }
        retrieved[..dv].iter_mut().for_each(|r| *r *= beta);
    }
    for (i, &ki) in key.iter().enumerate() {
        s[i * dv..][..dv].iter_mut().zip(&retrieved[..dv]).for_each(|(e, &r)| *e += ki * r);
    }
}

impl Executor<'_> {
    /// DecayGate, Sigmoid, GatedAdd and the L2 norm: element-wise and row-wise ops.
    pub(super) fn run_gates(&mut self, index: usize, y: &mut [f32]) -> Result<(), ExecError> {
        let (node, op) = self.plan.node_op(index);
        let view = view!(self);
        let fail = node_fail(node);
        match *op {
            Op::DecayGate { a, bias, scale, .. } => {
                let (a, bias, scale) = (view.f32(a), view.f32(bias), view.f32(scale));
                for (i, (o, &x)) in y.iter_mut().zip(a).enumerate() {
                    let h = i % bias.len();
                    *o = scale[h] * softplus(x + bias[h]);
                }
            }
            Op::Sigmoid { x, .. } => y.iter_mut().zip(view.f32(x)).for_each(|(o, &x)| *o = sigmoid(x)),
            Op::GatedAdd { x, y: other, gate, .. } => {
                let (x, other, gate) = (view.f32(x), view.f32(other), view.f32(gate));
                if x.len() != other.len() || gate.is_empty() || x.len() % gate.len() != 0 {
                    return Err(fail(format!(
                        "X of {}, Y of {} and a gate of {} rows",
                        x.len(),
                        other.len(),
                        gate.len()
                    )));
                }
                let row = x.len() / gate.len();
                for (i, o) in y[..x.len()].iter_mut().enumerate() {
                    *o = x[i] + other[i] * gate[i / row];
                }
            }
            Op::L2Norm { x, width, .. } => {
                let x = view.f32(x);
                y[..x.len()].copy_from_slice(x);
                l2_normalize_rows(&mut y[..x.len()], width, 0.0);
            }
            _ => unreachable!("a gate op"),
        }
        Ok(())
    }

    pub(super) fn run_gated_rms_norm(&mut self, index: usize, y: &mut [f32]) -> Result<(), ExecError> {
        let (node, op) = self.plan.node_op(index);
        let &Op::GatedRmsNorm { x, gamma, gate, eps, silu, .. } = op else { unreachable!("a GatedRmsNorm") };
        let view = view!(self);
        let (x, gamma, gate) = (view.f32(x), view.f32(gamma), view.f32(gate));
        let c = gamma.len();
        if c == 0 || x.len() % c != 0 || gate.len() != x.len() {
            return Err(node_fail(node)(format!("X of {}, scale of {c}, gate of {}", x.len(), gate.len())));
        }
        for ((row, g), out) in x.chunks(c).zip(gate.chunks(c)).zip(y.chunks_mut(c)) {
            let inv_rms = 1.0 / (row.iter().map(|v| v * v).sum::<f32>() / c as f32 + eps).sqrt();
            for (((o, &v), &gv), &s) in out.iter_mut().zip(row).zip(g).zip(gamma) {
                let act = if silu { gv * sigmoid(gv) } else { sigmoid(gv) };
                *o = v * inv_rms * s * act;
            }
        }
        Ok(())
    }

    /// Text-only M-RoPE: every section reads the row of the token's position.
    pub(super) fn run_m_rope(&mut self, index: usize, y: &mut [f32]) -> Result<(), ExecError> {
        let (node, op) = self.plan.node_op(index);
        let &Op::MRope { x, cos, sin, heads, head, half, .. } = op else { unreachable!("an MRope") };
        let view = view!(self);
        let (x, cos, sin) = (view.f32(x), view.f32(cos), view.f32(sin));
        let width = heads * head;
        let rows = cos.len() / half;
        y[..x.len()].copy_from_slice(x);
        for (t, row) in y[..x.len()].chunks_mut(width).enumerate() {
            let p = view.positions.get(t).copied().unwrap_or(-1);
            if p < 0 || p as usize >= rows {
                return Err(node_fail(node)(format!("position {p} is outside the {rows} rows of the cos/sin cache")));
            }
            let (c, s) = (&cos[p as usize * half..][..half], &sin[p as usize * half..][..half]);
            for h in row.chunks_mut(head) {
                for i in 0..half {
                    let (x1, x2) = (h[i], h[i + half]);
                    h[i] = x1 * c[i] - x2 * s[i];
                    h[i + half] = x2 * c[i] + x1 * s[i];
                }
            }
        }
        Ok(())
    }
}

/// Each run of `width` values of `x` divided by √(Σx² + ε) in place; a run whose root is zero
/// gives zeros (LpNormalization's zero norm). The OpenVINO host steps normalise with it too.
pub(crate) fn l2_normalize_rows(x: &mut [f32], width: usize, eps: f32) {
    for row in x.chunks_mut(width) {
        let norm = (row.iter().map(|v| v * v).sum::<f32>() + eps).sqrt();
        let inv = if norm > 0.0 { 1.0 / norm } else { 0.0 };
        row.iter_mut().for_each(|v| *v *= inv);
    }
}

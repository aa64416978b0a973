//! The recurrent layers of a step and their gates (f32 arithmetic): CausalConvWithState and
//! LinearAttention read and update the step's sequence's state slots in place (no copy per
//! token; a verify step also keeps the state after each row, see `exec::rollback`); the
//! element-wise gates, GatedRMSNorm, the L2 norm, GatedAdd and text-only M-RoPE write their
//! output buffer `y`.

use super::View;
use crate::exec::error::{node_fail, ExecError};
use crate::exec::plan::{LinearHeads, Op, StateSlot};
use crate::exec::Executor;
use crate::kvcache::SeqId;

/// The state of `seq` in slot `slot`.
fn slot_of(states: &mut [(SeqId, Vec<f32>)], seq: SeqId, slot: StateSlot) -> &mut [f32] {
    let (_, state) = states.iter_mut().find(|(s, _)| *s == seq).expect("every live sequence has a state");
    &mut state[slot.offset..slot.offset + slot.len]
}

fn sigmoid(x: f32) -> f32 {
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
            let b = bias.map_or(0.0, |b| b[c]);
            for (t, out) in y[c * tokens..][..tokens].iter_mut().enumerate() {
                // Position s + t of the past-then-input sequence, tap j reading (taps - 1 - j) back.
                let acc = (0..taps).fold(b, |acc, j| {
                    let at = s + t - (taps - 1 - j);
                    acc + w[j] * if at < s { p[at] } else { x[at - s] }
                });
                *out = if silu { acc * sigmoid(acc) } else { acc };
            }
            // The last s values of past-then-input; ascending, so each read precedes its overwrite.
            for i in 0..s {
                let at = tokens + i;
                p[i] = if at < s { p[at] } else { x[at - s] };
            }
        }
        Ok(())
    }

    pub(super) fn run_linear_attention(&mut self, index: usize, y: &mut [f32]) -> Result<(), ExecError> {
        let (node, op) = self.plan.node_op(index);
        let &Op::LinearAttention { q, k, v, decay, beta, state, heads, scale, .. } = op else {
            unreachable!("a LinearAttention")
        };
        let view = view!(self);
        let h = heads;
        let (qv, kv, vv) = (view.f32(q), view.f32(k), view.f32(v));
        let tokens = qv.len() / (h.q_heads * h.dk);
        let fits = |len: usize, width: usize| len == tokens * width;
        let (dw, bw) =
            (if h.decay_per_key { h.kv_heads * h.dk } else { h.kv_heads }, if h.beta_shared { 1 } else { h.kv_heads });
        let gates = (decay.map(|d| view.f32(d)), beta.map(|b| view.f32(b)));
        if !fits(kv.len(), h.k_heads * h.dk)
            || !fits(vv.len(), h.kv_heads * h.dv)
            || gates.0.is_some_and(|d| !fits(d.len(), dw))
            || gates.1.is_some_and(|b| !fits(b.len(), bw))
        {
            return Err(node_fail(node)(format!("q, k, v, decay and beta do not hold the same {tokens} tokens")));
        }
        let slot = self.plan.states[state];
        let st = slot_of(&mut self.states, self.current, slot);
        self.state_scratch.resize(h.dv, 0.0);
        let out_width = h.out_heads() * h.dv;
        for t in 0..tokens {
            for head in 0..h.kv_heads {
                let s = &mut st[head * h.dk * h.dv..][..h.dk * h.dv];
                let key = &kv[(t * h.k_heads + h.key_head_of(head)) * h.dk..][..h.dk];
                let value = &vv[(t * h.kv_heads + head) * h.dv..][..h.dv];
                let g = gates.0.map(|d| &d[t * dw..][..dw]);
                let rate = gates.1.map(|b| if h.beta_shared { b[t] } else { b[t * h.kv_heads + head] });
                update_state(&h, head, s, (key, value), (g, rate), &mut self.state_scratch);
            }
            if let Some(kept) = self.row_states.slot_mut(t, slot) {
                kept.copy_from_slice(st);
            }
            for o in 0..h.out_heads() {
                let (qh, head) = h.heads_of_output(o);
                let s = &st[head * h.dk * h.dv..][..h.dk * h.dv];
                let query = &qv[(t * h.q_heads + qh) * h.dk..][..h.dk];
                let row = &mut y[t * out_width + o * h.dv..][..h.dv];
                row.fill(0.0);
                for (i, &qi) in query.iter().enumerate() {
                    row.iter_mut().zip(&s[i * h.dv..][..h.dv]).for_each(|(r, &e)| *r += e * qi);
                }
                row.iter_mut().for_each(|r| *r *= scale);
            }
        }
        Ok(())
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
                for (row, out) in x.chunks(width).zip(y.chunks_mut(width)) {
                    let norm = row.iter().map(|v| v * v).sum::<f32>().sqrt();
                    let inv = if norm > 0.0 { 1.0 / norm } else { 0.0 };
                    out.iter_mut().zip(row).for_each(|(o, v)| *o = v * inv);
                }
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

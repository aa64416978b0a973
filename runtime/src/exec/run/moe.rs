//! MoE and QMoE (f32 accumulation): every token row is routed (softmax over the router logits,
//! the top k, ties to the lower expert), then the tokens are grouped per expert and each routed
//! expert's rows are read — and, for codes, dequantised — once per call, for all its tokens.
//! Experts no token chose are not read: [`Executor::moe_expert_passes`] counts the experts
//! computed.

use super::View;
use crate::exec::error::{node_fail, ExecError};
use crate::exec::plan::{ExpertActivation, ExpertWeights, MoeExperts, MoeMixing, Op};
use crate::exec::Executor;

/// The MoE ops' reusable vectors.
#[derive(Default)]
pub struct MoeScratch {
    /// (token, weight) of every route, grouped by expert.
    routes: Vec<Vec<(usize, f32)>>,
    /// One dequantised weight row.
    row: Vec<f32>,
    /// The expert's tokens' GEMM inputs, fc1 outputs and activations.
    xs: Vec<f32>,
    up: Vec<f32>,
    mid: Vec<f32>,
    probs: Vec<f32>,
}

impl ExpertWeights<'_> {
    /// Row `row` (of `k` values) of the `[E·n, k]` projection into `out`.
    fn row_into(&self, row: usize, k: usize, out: &mut [f32]) {
        match *self {
            ExpertWeights::F32(w) => out.copy_from_slice(&w[row * k..][..k]),
            ExpertWeights::Codes { codes, scales, bits, block } => {
                let (row_bytes, blocks, zero) = (k * bits / 8, k / block, (1u32 << (bits - 1)) as f32);
                let bytes = &codes[row * row_bytes..][..row_bytes];
                for (kk, o) in out.iter_mut().enumerate() {
                    let bit = kk * bits;
                    let code = (u32::from(bytes[bit / 8]) >> (bit % 8)) & ((1 << bits) - 1);
                    *o = (code as f32 - zero) * scales[row * blocks + kk / block];
                }
            }
        }
    }
}

/// The top `k` experts of one router row and their weights.
fn route(logits: &[f32], k: usize, normalize: bool, probs: &mut Vec<f32>, mut chosen: impl FnMut(usize, f32)) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    probs.clear();
    probs.extend(logits.iter().map(|l| (l - max).exp()));
    let total: f32 = probs.iter().sum();
    let mut picked = [usize::MAX; 16];
    let mut sum = 0.0;
    for slot in 0..k.min(16) {
        let best =
            (0..probs.len()).filter(|e| !picked[..slot].contains(e)).fold(None, |best: Option<usize>, e| match best {
                Some(b) if probs[b] >= probs[e] => Some(b),
                _ => Some(e),
            });
        picked[slot] = best.unwrap_or(0);
        sum += probs[picked[slot]] / total;
    }
    for &e in &picked[..k.min(16)] {
        let w = probs[e] / total;
        chosen(e, if normalize { w / sum } else { w });
    }
}

/// `v` quantised to int8 per block and back, as QMoE's int8 kernels read their inputs.
fn int8_blocks(v: &mut [f32], block: usize) {
    for blk in v.chunks_mut(block) {
        let amax = blk.iter().fold(0.0f32, |m, &x| m.max(x.abs()));
        let (scale, inv) = (amax / 127.0, if amax != 0.0 { 127.0 / amax } else { 0.0 });
        blk.iter_mut().for_each(|x| *x = (*x * inv).round_ties_even().clamp(-128.0, 127.0) * scale);
    }
}

fn activate(act: ExpertActivation, h: &[f32], out: &mut [f32]) {
    let sigmoid = |x: f32| 1.0 / (1.0 + (-x).exp());
    let inter = out.len();
    for (i, o) in out.iter_mut().enumerate() {
        *o = match act {
            ExpertActivation::Relu => h[i].max(0.0),
            ExpertActivation::Gelu => {
                let x = h[i];
                0.5 * x * (1.0 + ((2.0 / std::f32::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
            }
            ExpertActivation::Silu => h[i] * sigmoid(h[i]),
            ExpertActivation::Identity => h[i],
            ExpertActivation::SwiGlu { interleaved, alpha, beta, limit } => {
                let (g, l) = if interleaved { (h[2 * i], h[2 * i + 1]) } else { (h[i], h[inter + i]) };
                let (g, l) = (g.min(limit), l.clamp(-limit, limit));
                g * sigmoid(alpha * g) * (l + beta)
            }
        };
    }
}

/// `out[t·n + r] = W[e·n + r] · xs[t·k..] + bias` for the expert's `tokens` rows, each weight row
/// read once.
fn project(
    w: &ExpertWeights,
    bias: Option<&[f32]>,
    (e, n, k): (usize, usize, usize),
    xs: &[f32],
    row: &mut Vec<f32>,
    out: &mut [f32],
) {
    row.resize(k, 0.0);
    let tokens = xs.len() / k;
    for r in 0..n {
        w.row_into(e * n + r, k, row);
        let b = bias.map_or(0.0, |b| b[e * n + r]);
        for t in 0..tokens {
            out[t * n + r] = row.iter().zip(&xs[t * k..][..k]).map(|(a, x)| a * x).sum::<f32>() + b;
        }
    }
}

/// One expert over its routed tokens, added into `y` with the routing weights.
fn run_expert(ex: &MoeExperts, m: MoeMixing, e: usize, x: &[f32], y: &mut [f32], s: &mut MoeScratch) {
    let (h, n1, inter) = (ex.hidden, m.act.fusion() * ex.inter, ex.inter);
    let tokens = std::mem::take(&mut s.routes[e]);
    s.xs.clear();
    for &(t, _) in &tokens {
        s.xs.extend_from_slice(&x[t * h..][..h]);
    }
    if let Some(block) = m.int8_block {
        int8_blocks(&mut s.xs, block);
    }
    s.up.resize(tokens.len() * n1, 0.0);
    project(&ex.fc1, ex.b1, (e, n1, h), &s.xs, &mut s.row, &mut s.up);
    s.mid.resize(tokens.len() * inter, 0.0);
    for (up, mid) in s.up.chunks(n1).zip(s.mid.chunks_mut(inter)) {
        activate(m.act, up, mid);
    }
    if let Some(block) = m.int8_block {
        int8_blocks(&mut s.mid, block);
    }
    s.up.resize(tokens.len() * h, 0.0);
    project(&ex.fc2, ex.b2, (e, h, inter), &s.mid, &mut s.row, &mut s.up);
    for (i, &(t, w)) in tokens.iter().enumerate() {
        y[t * h..][..h].iter_mut().zip(&s.up[i * h..][..h]).for_each(|(o, d)| *o += w * d);
    }
    s.routes[e] = tokens;
    s.routes[e].clear();
}

impl Executor<'_> {
    pub(super) fn run_moe(&mut self, index: usize, y: &mut [f32]) -> Result<(), ExecError> {
        let (node, op) = self.plan.node_op(index);
        let &Op::Moe { x, router, experts, mixing, .. } = op else { unreachable!("a Moe") };
        let view = view!(self);
        let ex = &self.plan.moe[experts];
        let (x, logits) = (view.f32(x), view.f32(router));
        let rows = x.len() / ex.hidden;
        if rows * ex.hidden != x.len() || logits.len() != rows * ex.count || mixing.k > 16 {
            return Err(node_fail(node)(format!(
                "{} input values, {} router logits, k {}: not rows of {} and {} experts (k ≤ 16)",
                x.len(),
                logits.len(),
                mixing.k,
                ex.hidden,
                ex.count
            )));
        }
        let s = &mut self.moe_scratch;
        s.routes.resize_with(ex.count, Vec::new);
        for t in 0..rows {
            let routes = &mut s.routes;
            route(&logits[t * ex.count..][..ex.count], mixing.k, mixing.normalize, &mut s.probs, |e, w| {
                routes[e].push((t, w))
            });
        }
        y[..x.len()].fill(0.0);
        for e in 0..ex.count {
            if !s.routes[e].is_empty() {
                run_expert(ex, mixing, e, x, y, s);
                self.moe_expert_passes += 1;
                self.moe_expert_bytes += ex.expert_bytes() as u64;
            }
        }
        Ok(())
    }
}

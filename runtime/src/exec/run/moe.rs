//! MoE and QMoE (f32 accumulation): every token row is routed (softmax over the router logits,
//! the top k, ties to the lower expert), then the tokens are grouped per expert and each routed
//! expert's rows are read — and, for codes, dequantised — once per call, for all its tokens.
//! Experts no token chose are not read: [`Executor::moe_expert_passes`] counts the experts
//! computed.

use std::sync::Mutex;

use super::View;
use crate::exec::error::{node_fail, ExecError};
use crate::exec::plan::{ExpertActivation, ExpertWeights, MoeExperts, MoeMixing, Op};
use crate::exec::Executor;
use crate::kernels::{split_range, SyncPtr, ThreadPool};

/// The MoE ops' reusable vectors.
#[derive(Default)]
pub struct MoeScratch {
    /// (token, weight) of every route, grouped by expert.
    routes: Vec<Vec<(usize, f32)>>,
    /// One dequantised weight row per worker of the pool.
    rows: Vec<Mutex<Vec<f32>>>,
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
            ExpertWeights::Codes { codes, scales, bits: 4, block } if block % 2 == 0 => {
                let bytes = &codes[row * k / 2..][..k / 2];
                let scales = &scales[row * (k / block)..][..k / block];
                // Two codes a byte, low nibble first, one scale a block: a loop the compiler
                // vectorises.
                for ((pairs, vals), &scale) in bytes.chunks(block / 2).zip(out.chunks_mut(block)).zip(scales) {
                    for (&b, v) in pairs.iter().zip(vals.chunks_exact_mut(2)) {
                        v[0] = (f32::from(b & 15) - 8.0) * scale;
                        v[1] = (f32::from(b >> 4) - 8.0) * scale;
                    }
                }
            }
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

/// `a · b` in 8 running sums (a shape the compiler vectorises), then their total.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let (a8, b8) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = a8.remainder().iter().zip(b8.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in a8.zip(b8) {
        for i in 0..8 {
            lanes[i] += x[i] * y[i];
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// The top `k` experts of one router row and their weights.
pub(crate) fn route(
    logits: &[f32],
    k: usize,
    normalize: bool,
    probs: &mut Vec<f32>,
    mut chosen: impl FnMut(usize, f32),
) {
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

pub(crate) fn activate(act: ExpertActivation, h: &[f32], out: &mut [f32]) {
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

/// A projection runs on the pool's workers from this many multiply-adds (tokens × rows × k) on.
const PARALLEL_PROJECTION_MACS: usize = 1 << 15;

/// `out[t·n + r] = W[e·n + r] · xs[t·k..] + bias` for the expert's `tokens` rows, each weight row
/// read once; the rows split over the pool's workers (one dequantised row buffer each in `rows`)
/// when the projection is large enough.
fn project(
    pool: &ThreadPool,
    w: &ExpertWeights,
    bias: Option<&[f32]>,
    (e, n, k): (usize, usize, usize),
    xs: &[f32],
    rows: &[Mutex<Vec<f32>>],
    out: &mut [f32],
) {
    let tokens = xs.len() / k;
    let workers = if tokens * n * k < PARALLEL_PROJECTION_MACS { 1 } else { pool.threads().min(rows.len()).min(n) };
    let base = SyncPtr(out.as_mut_ptr());
    let run_rows = |worker: usize| {
        let mut row = rows[worker].lock().unwrap_or_else(|e| e.into_inner());
        row.resize(k, 0.0);
        for r in split_range(n, workers, worker) {
            w.row_into(e * n + r, k, &mut row);
            let b = bias.map_or(0.0, |b| b[e * n + r]);
            for t in 0..tokens {
                // SAFETY: each worker writes the columns of its own rows `r` only, inside `out`
                // (`tokens × n` values); `run` returns after every worker has finished.
                unsafe { *base.get().add(t * n + r) = dot(&row, &xs[t * k..][..k]) + b };
            }
        }
    };
    match workers {
        1 => run_rows(0),
        _ => pool.run(workers, &run_rows),
    }
}

/// One expert over its routed tokens, added into `y` with the routing weights.
fn run_expert(
    pool: &ThreadPool,
    ex: &MoeExperts,
    m: MoeMixing,
    e: usize,
    x: &[f32],
    y: &mut [f32],
    s: &mut MoeScratch,
) {
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
    if s.rows.len() < pool.threads() {
        s.rows.resize_with(pool.threads(), Mutex::default);
    }
    project(pool, &ex.fc1, ex.b1, (e, n1, h), &s.xs, &s.rows, &mut s.up);
    s.mid.resize(tokens.len() * inter, 0.0);
    for (up, mid) in s.up.chunks(n1).zip(s.mid.chunks_mut(inter)) {
        activate(m.act, up, mid);
    }
    if let Some(block) = m.int8_block {
        int8_blocks(&mut s.mid, block);
    }
    s.up.resize(tokens.len() * h, 0.0);
    project(pool, &ex.fc2, ex.b2, (e, h, inter), &s.mid, &s.rows, &mut s.up);
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
                run_expert(&self.pool, ex, mixing, e, x, y, s);
                self.moe_expert_passes += 1;
                self.moe_expert_bytes += ex.expert_bytes() as u64;
            }
        }
        Ok(())
    }
}

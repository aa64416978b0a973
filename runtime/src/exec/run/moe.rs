//! MoE and QMoE (f32 accumulation): every token row is routed (softmax over the router logits,
//! the top k, ties to the lower expert), then the tokens are grouped per expert and each routed
//! expert's rows are read once per call, for all its tokens: packed code experts by the WGemm
//! kernels (one call per projection over the expert's panels), other codes dequantised row by
//! row. Experts no token chose are not read: [`Executor::moe_expert_passes`] counts the experts
//! computed.

use std::sync::Mutex;

use super::recurrent::sigmoid;
use super::View;
use crate::exec::error::{node_fail, ExecError};
use crate::exec::plan::{ExpertActivation, ExpertWeights, MoeExperts, MoeMixing, Op, WGemmStore};
use crate::exec::Executor;
use crate::kernels::wgemm::{wgemm, WGemmPrecision, WGemmScratch};
use crate::kernels::{split_range, Isa, SyncPtr, ThreadPool};

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
    wgemm: WGemmScratch,
}

/// What computing an expert uses besides its weights and the scratch.
struct Kernels<'a, 'b> {
    pool: &'a ThreadPool,
    isa: Isa,
    /// How packed experts whose node asks for no int8 inputs meet their activations.
    precision: WGemmPrecision,
    packed: &'a [WGemmStore<'b>],
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
            ExpertWeights::Packed { .. } => unreachable!("packed experts are read by the WGemm kernels"),
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

/// `out[t·n + r] = W[e·n + r] · xs[t·k..] + bias[e·n + r]` for the expert's `tokens` rows, each
/// weight read once: packed experts by WGemm over the expert's panels (int8 inputs per block when
/// `int8`), the others by [`project_rows`].
#[allow(clippy::too_many_arguments)]
fn project(
    kx: &Kernels,
    w: &ExpertWeights,
    bias: Option<&[f32]>,
    (e, n, k): (usize, usize, usize),
    xs: &[f32],
    int8: bool,
    s: &mut ProjectScratch,
    out: &mut [f32],
) {
    let ExpertWeights::Packed { store, .. } = *w else {
        return project_rows(kx.pool, w, bias, (e, n, k), xs, s.rows, out);
    };
    let view = kx.packed[store].weights().columns(e * n..(e + 1) * n);
    let precision = if int8 { WGemmPrecision::Int8Activations } else { kx.precision };
    let bias = bias.map(|b| &b[e * n..][..n]);
    wgemm(kx.isa, kx.pool, &view, xs, xs.len() / k, bias, out, precision, s.wgemm);
}

/// The scratch a projection reuses.
struct ProjectScratch<'s> {
    rows: &'s [Mutex<Vec<f32>>],
    wgemm: &'s mut WGemmScratch,
}

/// [`project`] for f32 or unpacked code experts: the rows split over the pool's workers (one
/// dequantised row buffer each in `rows`) when the projection is large enough.
fn project_rows(
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
fn run_expert(kx: &Kernels, ex: &MoeExperts, m: MoeMixing, e: usize, x: &[f32], y: &mut [f32], s: &mut MoeScratch) {
    let (h, n1, inter) = (ex.hidden, m.act.fusion() * ex.inter, ex.inter);
    let tokens = std::mem::take(&mut s.routes[e]);
    s.xs.clear();
    for &(t, _) in &tokens {
        s.xs.extend_from_slice(&x[t * h..][..h]);
    }
    // Packed experts quantise their inputs in the kernel; the row path does it here, for each
    // projection on its own (one may be packed and the other not).
    let int8_here = |w: &ExpertWeights| m.int8_block.filter(|_| !matches!(w, ExpertWeights::Packed { .. }));
    if let Some(block) = int8_here(&ex.fc1) {
        int8_blocks(&mut s.xs, block);
    }
    if s.rows.len() < kx.pool.threads() {
        s.rows.resize_with(kx.pool.threads(), Mutex::default);
    }
    let int8 = m.int8_block.is_some();
    let mut ps = ProjectScratch { rows: &s.rows, wgemm: &mut s.wgemm };
    s.up.resize(tokens.len() * n1, 0.0);
    project(kx, &ex.fc1, ex.b1, (e, n1, h), &s.xs, int8, &mut ps, &mut s.up);
    s.mid.resize(tokens.len() * inter, 0.0);
    for (up, mid) in s.up.chunks(n1).zip(s.mid.chunks_mut(inter)) {
        activate(m.act, up, mid);
    }
    if let Some(block) = int8_here(&ex.fc2) {
        int8_blocks(&mut s.mid, block);
    }
    s.up.resize(tokens.len() * h, 0.0);
    project(kx, &ex.fc2, ex.b2, (e, h, inter), &s.mid, int8, &mut ps, &mut s.up);
    for (i, &(t, w)) in tokens.iter().enumerate() {
        y[t * h..][..h].iter_mut().zip(&s.up[i * h..][..h]).for_each(|(o, d)| *o += w * d);
    }
    s.routes[e] = tokens;
    s.routes[e].clear();
}

impl Executor<'_> {
    pub(super) fn run_moe(&mut self, index: usize, y: &mut [f32]) -> Result<(), ExecError> {
        let (node, op) = self.plan.node_op(index);
        let &Op::Moe { x, router, experts, mixing, shared, .. } = op else { unreachable!("a Moe") };
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
        let kx =
            Kernels { pool: &self.pool, isa: self.isa, precision: self.wgemm_precision, packed: &self.plan.packed };
        for e in 0..ex.count {
            if !s.routes[e].is_empty() {
                run_expert(&kx, ex, mixing, e, x, y, s);
                self.moe_expert_passes += 1;
                self.moe_expert_bytes += ex.expert_bytes() as u64;
            }
        }
        if let Some((output, logits)) = shared {
            add_shared_expert(&mut y[..x.len()], view.f32(output), view.f32(logits))
                .map_err(|msg| node_fail(node)(msg))?;
        }
        Ok(())
    }
}

/// `y += shared · σ(logit)` row by row, each product rounded to f32 as com.microsoft `GatedAdd`
/// of `Sigmoid` rounds it.
fn add_shared_expert(y: &mut [f32], shared: &[f32], logits: &[f32]) -> Result<(), String> {
    if shared.len() != y.len() || logits.is_empty() || !y.len().is_multiple_of(logits.len()) {
        let (s, l, r) = (shared.len(), logits.len(), y.len());
        return Err(format!("a shared expert of {s} values with {l} gate logits for {r} output values"));
    }
    let width = y.len() / logits.len();
    for ((y, s), &g) in y.chunks_exact_mut(width).zip(shared.chunks_exact(width)).zip(logits) {
        let gate = sigmoid(g);
        y.iter_mut().zip(s).for_each(|(o, &s)| *o += s * gate);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::wgemm::{pack_wgemm, MatMulNBits, NBitsZeroPoints};

    /// A small deterministic stream of values in [0, 1).
    struct Stream(u64);

    impl Stream {
        fn next(&mut self) -> f32 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 >> 40) as f32 / (1u64 << 24) as f32
        }
        fn bytes(&mut self, n: usize) -> Vec<u8> {
            (0..n).map(|_| (self.next() * 256.0) as u8).collect()
        }
        fn values(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
            (0..n).map(|_| lo + (hi - lo) * self.next()).collect()
        }
    }

    /// Expert `e` of 4 (swiglu, 2·32 fc1 rows of hidden 64, blocks of 32) over 5 token rows, by
    /// the row path and by WGemm over the packed experts' panels; the largest difference
    /// relative to the largest output.
    fn packed_against_rows(int8: bool, bits: usize, e: usize, pack_fc: [bool; 2]) -> f64 {
        let (count, hidden, inter, block, tokens) = (4, 64, 32, 32, 5);
        let mut rng = Stream(0x9e37_79b9 + e as u64);
        let (rows1, rows2) = (2 * inter, hidden);
        let codes1 = rng.bytes(count * rows1 * hidden * bits / 8);
        let codes2 = rng.bytes(count * rows2 * inter * bits / 8);
        let scales1 = rng.values(count * rows1 * hidden / block, 0.01, 0.05);
        let scales2 = rng.values(count * rows2 * inter / block, 0.01, 0.05);
        let (b1, b2) = (rng.values(count * rows1, -0.5, 0.5), rng.values(count * rows2, -0.5, 0.5));
        let x = rng.values(tokens * hidden, -2.0, 2.0);
        let pack = |k: usize, n: usize, b: &[u8], scales: &[f32]| {
            let src = MatMulNBits { k, n, bits, block_size: block, b, scales, zero_points: NBitsZeroPoints::Default };
            WGemmStore::PackedAtLoad(pack_wgemm(&src).unwrap())
        };
        let packed = [pack(hidden, count * rows1, &codes1, &scales1), pack(inter, count * rows2, &codes2, &scales2)];
        let act = ExpertActivation::SwiGlu { interleaved: false, alpha: 1.0, beta: 0.0, limit: f32::INFINITY };
        let mixing = MoeMixing { act, k: 1, normalize: true, int8_block: int8.then_some(block) };
        let rows = MoeExperts {
            count,
            hidden,
            inter,
            fc1: ExpertWeights::Codes { codes: &codes1, scales: &scales1, bits, block },
            b1: Some(&b1),
            fc2: ExpertWeights::Codes { codes: &codes2, scales: &scales2, bits, block },
            b2: Some(&b2),
        };
        let panels = MoeExperts {
            fc1: if pack_fc[0] { ExpertWeights::Packed { store: 0, bytes: 0 } } else { rows.fc1 },
            fc2: if pack_fc[1] { ExpertWeights::Packed { store: 1, bytes: 0 } } else { rows.fc2 },
            ..rows
        };
        let pool = ThreadPool::new(2);
        let kx = Kernels { pool: &pool, isa: Isa::detect(), precision: WGemmPrecision::Exact, packed: &packed };
        let run = |ex: &MoeExperts| {
            let mut s = MoeScratch::default();
            s.routes.resize_with(count, Vec::new);
            s.routes[e] = (0..tokens).map(|t| (t, 0.5 + t as f32 / 8.0)).collect();
            let mut y = vec![0f32; tokens * hidden];
            run_expert(&kx, ex, mixing, e, &x, &mut y, &mut s);
            y
        };
        let (want, got) = (run(&rows), run(&panels));
        let top = want.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
        assert!(top > 1.0, "outputs too small to compare: {top}");
        want.iter().zip(&got).map(|(a, b)| (a - b).abs() as f64 / top).fold(0.0, f64::max)
    }

    #[test]
    fn packed_experts_compute_what_their_rows_do() {
        // Both projections packed, or one of them (each projection is packed on its own).
        for pack_fc in [[true, true], [true, false], [false, true]] {
            for bits in [4, 8] {
                for e in [0, 3] {
                    let exact = packed_against_rows(false, bits, e, pack_fc);
                    assert!(exact < 1e-5, "{bits}-bit expert {e} {pack_fc:?}, f32 inputs: {exact:e}");
                    // Both quantise the same inputs per block; fc1's outputs differ by f32
                    // rounding, which can move one of fc2's input codes by one step.
                    let int8 = packed_against_rows(true, bits, e, pack_fc);
                    assert!(int8 < 1e-3, "{bits}-bit expert {e} {pack_fc:?}, int8 inputs: {int8:e}");
                }
            }
        }
    }
}

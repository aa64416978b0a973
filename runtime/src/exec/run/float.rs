//! The f32 ops of a step: gathers, MatMul, the layout copies, norms, RoPE, gated products,
//! element-wise arithmetic and attention over the paged cache. Each writes its output buffer `y`,
//! which [`Executor::run_op`] has taken out of the buffer list.

use std::sync::Mutex;

use super::{check_rows, numel, product_rows, row_ids, View};
use crate::exec::error::{node_fail, ExecError};
use crate::exec::plan::{Loc, Op};
use crate::exec::Executor;
use crate::kernels::swiglu::GateActivation;
use crate::kernels::{embed, gemm, layout, norm, rope, split_range, swiglu, SyncPtr, ThreadPool};
use crate::kvcache::{KvError, Scoring};

/// Query rows × key rows from which a step's attention is split over the pool's threads by KV
/// head: a prefill block of 8 rows past 64 keys, a decode step past 512 (below, one row attends
/// serially; the workers' scratches are grown once, so decoding still allocates nothing).
const PARALLEL_ATTENTION_WORK: usize = 512;

impl Executor<'_> {
    pub(super) fn run_gather(&mut self, index: usize, y: &mut [f32]) -> Result<(), ExecError> {
        let (node, op) = self.plan.node_op(index);
        let Op::Gather { data, ids, out } = op else { unreachable!("a Gather") };
        let fail = node_fail(node);
        let view = view!(self);
        let table = view.f32(*data);
        let rows = self.shapes[*data].first().copied().unwrap_or(0);
        let width = table.len().checked_div(rows).unwrap_or(0);
        row_ids(view.i64(*ids), rows, &mut self.gather_ids).map_err(&fail)?;
        let n = numel(&self.shapes[*out]);
        embed::embed_f32(table, width, &self.gather_ids, &mut y[..n])?;
        Ok(())
    }

    pub(super) fn run_gather_columns(&mut self, index: usize, y: &mut [f32]) -> Result<(), ExecError> {
        let (node, op) = self.plan.node_op(index);
        let Op::GatherColumns { table, layout, k, n, ids, out } = op else { unreachable!("a GatherColumns") };
        let fail = node_fail(node);
        let view = view!(self);
        row_ids(view.i64(*ids), *n, &mut self.gather_ids).map_err(&fail)?;
        let len = numel(&self.shapes[*out]);
        let w = self.plan.weights[*table];
        embed::embed_columns(w, *layout, *k, *n, &self.gather_ids, &mut y[..len])?;
        Ok(())
    }

    pub(super) fn run_matmul(&mut self, index: usize, y: &mut [f32]) -> Result<(), ExecError> {
        let (node, op) = self.plan.node_op(index);
        let Op::MatMul { a, w, panels, layout, k, n, last_row_only, .. } = op else { unreachable!("a MatMul") };
        let fail = node_fail(node);
        let view = view!(self);
        let weights = match panels {
            Some(i) => self.plan.weights[*i],
            None => {
                let (Loc::Weight(i) | Loc::WeightT(i)) = self.plan.locs[*w] else { unreachable!("checked at load") };
                self.plan.weights[i]
            }
        };
        let (x, m) = product_rows(&fail, view.f32(*a), *k, *last_row_only && !self.every_row_logits)?;
        gemm::gemm_f32(self.isa, &self.pool, x, m, *k, weights, *n, *layout, None, &mut y[..m * n]);
        Ok(())
    }

    pub(super) fn run_transpose(&mut self, index: usize, y: &mut [f32]) -> Result<(), ExecError> {
        let Op::Transpose { x, perm, .. } = self.plan.node_op(index).1 else { unreachable!("a Transpose") };
        let input = view!(self).f32(*x);
        layout::transpose(input, &self.shapes[*x], perm, &mut y[..input.len()]);
        Ok(())
    }

    pub(super) fn run_slice(&mut self, index: usize, y: &mut [f32]) -> Result<(), ExecError> {
        let (node, op) = self.plan.node_op(index);
        let Op::Slice { x, starts, ends, axes, steps, out } = op else { unreachable!("a Slice") };
        let view = view!(self);
        let input = view.f32(*x);
        let (st, en) = (view.i64(*starts), view.i64(*ends));
        let ax = axes.map(|a| view.i64(a));
        let sp = steps.map(|s| view.i64(s));
        let n = numel(&self.shapes[*out]);
        layout::slice(input, &self.shapes[*x], st, en, ax, sp, &mut y[..n]).map_err(node_fail(node))
    }

    pub(super) fn run_concat(&mut self, index: usize, y: &mut [f32]) -> Result<(), ExecError> {
        let (node, op) = self.plan.node_op(index);
        let Op::Concat { inputs, axis, out } = op else { unreachable!("a Concat") };
        let view = view!(self);
        let out_shape = &self.shapes[*out];
        let n = numel(out_shape);
        let input = |i: usize| (view.f32(inputs[i]), &self.shapes[inputs[i]][..]);
        layout::concat(inputs.len(), input, *axis, out_shape, &mut y[..n]).map_err(node_fail(node))
    }

    pub(super) fn run_rms_norm(&mut self, index: usize, y: &mut [f32]) -> Result<(), ExecError> {
        let (node, op) = self.plan.node_op(index);
        let Op::RmsNorm { x, gamma, eps, .. } = op else { unreachable!("an RmsNorm") };
        let view = view!(self);
        let (input, g) = (view.f32(*x), view.f32(*gamma));
        check_rows(&node_fail(node), input.len(), g.len(), "γ")?;
        norm::rms_norm(self.isa, input, g, *eps, &mut y[..input.len()]);
        Ok(())
    }

    pub(super) fn run_inverse_rms(&mut self, index: usize, y: &mut [f32]) -> Result<(), ExecError> {
        let (node, op) = self.plan.node_op(index);
        let Op::InverseRms { x, d, eps, squares, .. } = op else { unreachable!("an InverseRms") };
        let input = view!(self).f32(*x);
        check_rows(&node_fail(node), input.len(), *d, "a row")?;
        norm::inverse_rms(self.isa, input, *d, *eps, *squares, &mut y[..input.len() / d]);
        Ok(())
    }

    pub(super) fn run_skip_rms_norm(&mut self, index: usize, y: &mut [f32], y2: &mut [f32]) -> Result<(), ExecError> {
        let (node, op) = self.plan.node_op(index);
        let Op::SkipRmsNorm { x, skip, gamma, bias, eps, .. } = op else { unreachable!("a SkipRmsNorm") };
        let fail = node_fail(node);
        let view = view!(self);
        let (input, skip_in, g) = (view.f32(*x), view.f32(*skip), view.f32(*gamma));
        let bias_in = bias.map(|b| view.f32(b));
        check_rows(&fail, input.len(), g.len(), "γ")?;
        if skip_in.is_empty() || !input.len().is_multiple_of(skip_in.len()) || !skip_in.len().is_multiple_of(g.len()) {
            return Err(fail(format!("skip of {} values does not repeat over x of {}", skip_in.len(), input.len())));
        }
        if bias_in.is_some_and(|b| b.len() != g.len()) {
            return Err(fail(format!("bias is not {} values", g.len())));
        }
        let n = input.len();
        norm::skip_rms_norm(self.isa, input, skip_in, g, bias_in, *eps, &mut y[..n], &mut y2[..n]);
        Ok(())
    }

    pub(super) fn run_rope(&mut self, index: usize, y: &mut [f32]) -> Result<(), ExecError> {
        let (node, op) = self.plan.node_op(index);
        let Op::Rope { x, cos, sin, interleaved, .. } = op else { unreachable!("a Rope") };
        let fail = node_fail(node);
        let view = view!(self);
        let (input, c, s) = (view.f32(*x), view.f32(*cos), view.f32(*sin));
        let (d, rows_per_cos_row) = rope_broadcast(&self.shapes[*x], &self.shapes[*cos], c.len()).map_err(&fail)?;
        if s.len() != c.len() || self.shapes[*sin] != self.shapes[*cos] {
            return Err(fail("cos and sin differ in shape".to_string()));
        }
        let n = input.len();
        y[..n].copy_from_slice(input);
        rope::rope_in_place(self.isa, &mut y[..n], d, c, s, rows_per_cos_row, *interleaved);
        Ok(())
    }

    pub(super) fn run_gate(&mut self, index: usize, y: &mut [f32]) -> Result<(), ExecError> {
        let (node, op) = self.plan.node_op(index);
        let Op::Gate { gate, up, act, .. } = op else { unreachable!("a Gate") };
        let view = view!(self);
        let (g, u) = (view.f32(*gate), view.f32(*up));
        if g.len() != u.len() {
            return Err(node_fail(node)(format!("gate of {} values and up of {}", g.len(), u.len())));
        }
        match act {
            GateActivation::Silu => swiglu::swiglu(self.isa, g, u, &mut y[..g.len()]),
            GateActivation::GeluTanh => swiglu::gelu_gate(g, u, &mut y[..g.len()]),
        }
        Ok(())
    }

    pub(super) fn run_binary(&mut self, index: usize, y: &mut [f32]) -> Result<(), ExecError> {
        let (node, op) = self.plan.node_op(index);
        let Op::BinaryF32 { a, b, mul, .. } = op else { unreachable!("a BinaryF32") };
        let view = view!(self);
        let (x, z) = (view.f32(*a), view.f32(*b));
        let (big, small) = if x.len() >= z.len() { (x, z) } else { (z, x) };
        if small.is_empty() || big.len() % small.len() != 0 {
            return Err(node_fail(node)(format!(
                "combines {} values with {}: neither repeats over the other",
                small.len(),
                big.len()
            )));
        }
        for (row, out) in big.chunks(small.len()).zip(y[..big.len()].chunks_mut(small.len())) {
            for ((o, p), q) in out.iter_mut().zip(row).zip(small) {
                *o = if *mul { p * q } else { p + q };
            }
        }
        Ok(())
    }

    /// Appends the step's K and V to the node's layer, then attends: serially for little work (or
    /// one thread), else split by KV head over the pool with one scratch per worker.
    pub(super) fn run_attention(&mut self, index: usize, y: &mut [f32]) -> Result<(), ExecError> {
        let Op::Attention { q, k, v, layer, scoring, sinks, .. } = self.plan.node_op(index).1 else {
            unreachable!("an Attention")
        };
        let view = view!(self);
        let (queries, keys, values) = (view.f32(*q), view.f32(*k), view.f32(*v));
        let scoring = &Scoring { sinks: sinks.map(|s| view.f32(s)), ..*scoring };
        self.cache.append(self.current, *layer, keys, values)?;
        let a = self.plan.attention;
        let tokens = queries.len() / (a.q_heads * a.head_dim).max(1);
        let workers = self.pool.threads().min(a.kv_heads);
        let key_rows = self.cache.rows(self.current, *layer)?;
        if tokens * key_rows < PARALLEL_ATTENTION_WORK || workers < 2 {
            self.cache.attend(self.current, *layer, queries, *scoring, &mut y[..queries.len()])?;
            return Ok(());
        }
        while self.attend_scratches.len() < workers {
            self.attend_scratches.push(Mutex::new(self.cache.new_scratch()));
        }
        let (cache, seq, scratches) = (&self.cache, self.current, &self.attend_scratches);
        attend_in_parallel(&self.pool, workers, a.kv_heads, &mut y[..queries.len()], &|heads, out, t| {
            let mut scratch = scratches[t].lock().unwrap_or_else(|e| e.into_inner());
            cache.attend_heads(seq, *layer, queries, *scoring, heads, out, &mut scratch)
        })
    }
}

/// Attention for some KV heads into their part of the output, by one worker (its index).
type AttendHeads<'a> = dyn Fn(std::ops::Range<usize>, &mut [f32], usize) -> Result<(), KvError> + Sync + 'a;

/// Runs `attend(heads, out_of_those_heads, worker)` for `workers` disjoint ranges of the
/// `kv_heads` KV heads on the pool; `out` is `[q_heads, S, D]`, each range's query heads a
/// contiguous part of it. The first error is returned.
fn attend_in_parallel(
    pool: &ThreadPool,
    workers: usize,
    kv_heads: usize,
    out: &mut [f32],
    attend: &AttendHeads,
) -> Result<(), ExecError> {
    let per_head = out.len() / kv_heads;
    let base = SyncPtr(out.as_mut_ptr());
    let error: Mutex<Option<KvError>> = Mutex::new(None);
    pool.run(workers, &|t| {
        let heads = split_range(kv_heads, workers, t);
        // SAFETY: the ranges of KV heads are disjoint, so are their parts of `out`; `run` returns
        // after every task has finished.
        let part =
            unsafe { std::slice::from_raw_parts_mut(base.get().add(heads.start * per_head), heads.len() * per_head) };
        if let Err(e) = attend(heads, part, t) {
            error.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(e);
        }
    });
    match error.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}

/// Rope's broadcast of cos/sin over x as the kernel takes it: the rotary width and how many
/// consecutive rows of x share one cos row. The cos axes other than 1 must be one run of axes
/// equal to x's; the axes of x before the run repeat the table.
fn rope_broadcast(x: &[usize], cos: &[usize], cos_len: usize) -> Result<(usize, usize), String> {
    let (r, rc) = (x.len(), cos.len());
    let d = x.last().copied().unwrap_or(0);
    if rc == 0 || rc > r || cos[rc - 1] != d {
        return Err(format!("cos {cos:?} does not broadcast to x {x:?} over the full width"));
    }
    let cos_dim = |i: usize| if i + rc >= r { cos[i + rc - r] } else { 1 };
    let spread: Vec<usize> = (0..r - 1).filter(|&i| cos_dim(i) != 1).collect();
    let (Some(&first), Some(&last)) = (spread.first(), spread.last()) else {
        return Ok((d, 1));
    };
    if (first..=last).any(|i| cos_dim(i) != x[i]) {
        return Err(format!("cos {cos:?} does not broadcast to x {x:?} as one run of axes"));
    }
    let cos_rows: usize = (first..=last).map(|i| x[i]).product();
    if cos_rows * d != cos_len {
        return Err(format!("cos holds {cos_len} values, not {cos_rows} rows of {d}"));
    }
    Ok((d, x[last + 1..r - 1].iter().product()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_tables_broadcast_over_heads() {
        // x [1, 9, 5, 64] (BNSH) with cos [1, 1, 5, 64]: rows cycle through the 5 positions.
        assert_eq!(rope_broadcast(&[1, 9, 5, 64], &[1, 1, 5, 64], 5 * 64), Ok((64, 1)));
        // x [1, 5, 9, 64] (BSNH) with cos [1, 5, 1, 64]: 9 consecutive rows share one.
        assert_eq!(rope_broadcast(&[1, 5, 9, 64], &[1, 5, 1, 64], 5 * 64), Ok((64, 9)));
        assert!(rope_broadcast(&[1, 9, 5, 64], &[1, 1, 5, 32], 5 * 32).is_err());
    }
}

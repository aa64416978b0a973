//! Lowerings of the f32 ops: gathers of table rows (or of a transposed weight's columns), MatMul
//! by a weight (stored, transposed, or as panels), Transpose (read in place when only MatMul,
//! Gather or a folded QuantizeLinear reads it), Slice, Concat, the norms, RoPE, the gated
//! products, element-wise Add and Mul, and Attention over the cache.

use std::num::NonZeroUsize;

use super::{input, output, Builder};
use crate::exec::error::{node_fail, ExecError};
use crate::exec::plan::weights::{panels_view, weight_name};
use crate::exec::plan::{Loc, Op};
use crate::exec::program::{ElemType, NodeInfo, ValueDef};
use crate::kernels::gemm::WeightLayout;
use crate::kernels::layout::MAX_TRANSPOSE_RANK;
use crate::kernels::swiglu::GateActivation;
use crate::kvcache::Scoring;

/// Gather of f32 rows by token ids, positions or integer indices; rows of a transposed weight
/// (its columns) are read in place.
pub(super) fn gather(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    let fail = node_fail(node);
    let values = b.values;
    let ids = input(node, 1)?;
    if !matches!(b.locs[ids], Loc::Ids | Loc::Positions | Loc::ConstI64(_) | Loc::I64Buf(_)) {
        return Err(fail(format!("indices `{}` are not token ids, positions or a constant", values[ids].name)));
    }
    let data = input(node, 0)?;
    let o = output(node, 0)?;
    let (table, layout) = match b.locs[data] {
        Loc::WeightT(i) => (i, WeightLayout::KN),
        Loc::PanelsT(i) => (i, WeightLayout::Panels),
        _ => {
            let data = b.f32_input(node, 0)?;
            b.fresh(o);
            b.push(n, Op::Gather { data, ids, out: o });
            return Ok(());
        }
    };
    // The transpose of W [K, N]: its rows are W's columns.
    let [Some(n_rows), Some(k)] = b.dims(data)[..] else {
        return Err(fail(format!("`{}` is not a 2-D table of fixed sizes", values[data].name)));
    };
    b.fresh(o);
    b.push(n, Op::GatherColumns { table, layout, k, n: n_rows, ids, out: o });
    Ok(())
}

/// MatMul by a weight: its panels when the bundle holds them, else the weight or its transpose
/// as stored.
pub(super) fn matmul(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    if weight_name(b.cx.program, node, 1).is_some_and(|s| b.cx.layouts.gemm.contains_key(s)) {
        matmul_panels(b, n, node)
    } else {
        matmul_weight(b, n, node)
    }
}

fn matmul_panels(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    let a = b.f32_input(node, 0)?;
    let w = input(node, 1)?;
    let (layouts, weight, values) = (b.cx.layouts, b.cx.weight, b.values);
    let layout = &layouts.gemm[weight_name(b.cx.program, node, 1).expect("checked by the caller")];
    let dims = b.dims(w);
    if dims[..] != [Some(layout.k), Some(layout.n)] {
        return Err(node_fail(node)(format!(
            "the panels of `{}` are K={} N={}, the node's weight is {:?}",
            layout.source, layout.k, layout.n, dims
        )));
    }
    let (view, panels) = panels_view(weight, layout, &values[w].name)?;
    let panels = b.add_weight(panels, view);
    let o = output(node, 0)?;
    b.fresh(o);
    let last_row_only = b.last_row_only(o);
    let (k, n_cols) = (layout.k, layout.n);
    let op =
        Op::MatMul { a, w, panels: Some(panels), layout: WeightLayout::Panels, k, n: n_cols, out: o, last_row_only };
    b.push(n, op);
    Ok(())
}

fn matmul_weight(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    let fail = node_fail(node);
    let values = b.values;
    let a = b.f32_input(node, 0)?;
    let w = b.f32_input(node, 1)?;
    let layout = match b.locs[w] {
        Loc::Weight(_) => WeightLayout::KN,
        Loc::WeightT(_) => WeightLayout::NK,
        _ => {
            return Err(fail(format!(
                "the right operand `{}` is computed; the executor multiplies by weights",
                values[w].name
            )))
        }
    };
    let wshape = &values[w].shape;
    let (k, n_cols) =
        match (wshape.len(), wshape.first().and_then(|d| d.as_const()), wshape.get(1).and_then(|d| d.as_const())) {
            (2, Some(k), Some(n)) => (k, n),
            _ => return Err(fail(format!("the weight operand `{}` is not 2-D with fixed sizes", values[w].name))),
        };
    let (Loc::Weight(i) | Loc::WeightT(i)) = b.locs[w] else { unreachable!("matched above") };
    if b.weights[i].len() != k * n_cols {
        return Err(fail(format!(
            "the weight `{}` holds {} values, not {k}×{n_cols}",
            values[w].name,
            b.weights[i].len()
        )));
    }
    let o = output(node, 0)?;
    b.fresh(o);
    let last_row_only = b.last_row_only(o);
    b.push(n, Op::MatMul { a, w, panels: None, layout, k, n: n_cols, out: o, last_row_only });
    Ok(())
}

/// Transpose: a 2-D weight transposed only to be read by MatMul and Gather (or quantised at
/// load) is read in place — as stored, or as its panels when the bundle holds only those and
/// only Gathers read it; anything else is copied.
pub(super) fn transpose(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    let x = input(node, 0)?;
    let perm = permutation(node, b.values[x].shape.len())?;
    let o = output(node, 0)?;
    let panels_only = match &b.values[x].def {
        ValueDef::Weight(name) if b.locs[x] == Loc::Unused => b.cx.layouts.gemm.get(name),
        _ => None,
    };
    match (b.locs[x], panels_only) {
        (Loc::Weight(i), _) if perm == [1, 0] && read_in_place(b, o, false) => b.locs[o] = Loc::WeightT(i),
        (_, Some(layout)) if perm == [1, 0] && read_in_place(b, o, true) => {
            let (view, panels) = panels_view(b.cx.weight, layout, &b.values[x].name)?;
            let index = b.add_weight(panels, view);
            b.locs[o] = Loc::PanelsT(index);
        }
        _ => {
            let x = b.f32_input(node, 0)?;
            b.fresh(o);
            b.push(n, Op::Transpose { x, perm, out: o });
        }
    }
    Ok(())
}

/// The node's `perm` (reversed axes by default), checked to permute `rank` axes the executor
/// transposes.
fn permutation(node: &NodeInfo, rank: usize) -> Result<Vec<usize>, ExecError> {
    let fail = node_fail(node);
    if rank > MAX_TRANSPOSE_RANK {
        return Err(fail(format!("rank {rank} is above the {MAX_TRANSPOSE_RANK} axes the executor transposes")));
    }
    let perm: Vec<usize> = match node.attr_ints("perm") {
        Some(p) => p.iter().map(|&d| d as usize).collect(),
        None => (0..rank).rev().collect(),
    };
    let mut sorted = perm.clone();
    sorted.sort_unstable();
    if sorted != (0..rank).collect::<Vec<_>>() {
        return Err(fail(format!("perm {perm:?} is not a permutation of {rank} axes")));
    }
    Ok(perm)
}

/// Whether every reader of `o` (and there is one) reads it in place: a Gather of rows, or, unless
/// `gather_only`, a MatMul's weight or a QuantizeLinear of a weight (folded at load).
fn read_in_place(b: &Builder<'_, '_>, o: usize, gather_only: bool) -> bool {
    let consumers = &b.cx.uses.consumers[o];
    !consumers.is_empty()
        && consumers.iter().all(|&(c, slot)| {
            let node = &b.cx.program.nodes[c];
            let gather = node.op == "ai.onnx::Gather" && slot == 0 && node.attr_i64("axis").unwrap_or(0) == 0;
            gather
                || !gather_only
                    && ((node.op == "ai.onnx::MatMul" && slot == 1)
                        || (node.op == "ai.onnx::QuantizeLinear" && slot == 0))
        })
}

/// Slice of an f32 tensor by integer starts, ends, axes and steps the executor holds.
pub(super) fn slice(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    let fail = node_fail(node);
    let x = b.f32_input(node, 0)?;
    if b.values[x].shape.len() > MAX_TRANSPOSE_RANK {
        return Err(fail(format!("rank above the {MAX_TRANSPOSE_RANK} axes the executor slices")));
    }
    let int = |slot: usize| -> Result<Option<usize>, ExecError> {
        match node.input(slot) {
            None => Ok(None),
            Some(v)
                if b.values[v].elem == Some(ElemType::I64)
                    && matches!(b.locs[v], Loc::ConstI64(_) | Loc::I64Buf(_)) =>
            {
                Ok(Some(v))
            }
            Some(v) => {
                Err(fail(format!("input {slot} (`{}`) is not an integer tensor the executor holds", b.values[v].name)))
            }
        }
    };
    let (starts, ends) = match (int(1)?, int(2)?) {
        (Some(s), Some(e)) => (s, e),
        _ => return Err(fail("starts and ends are required".to_string())),
    };
    let (axes, steps) = (int(3)?, int(4)?);
    let o = output(node, 0)?;
    b.fresh(o);
    b.push(n, Op::Slice { x, starts, ends, axes, steps, out: o });
    Ok(())
}

/// Concat of f32 tensors along an axis of the output's rank.
pub(super) fn concat(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    let axis = node.attr_i64("axis").unwrap_or(0);
    let o = output(node, 0)?;
    let rank = b.values[o].shape.len();
    if rank > MAX_TRANSPOSE_RANK || rank == 0 || axis < -(rank as i64) || axis >= rank as i64 {
        return Err(node_fail(node)(format!("axis {axis} of rank {rank} is not one the executor concatenates")));
    }
    let ins = (0..node.inputs.len()).map(|s| b.f32_input(node, s)).collect::<Result<Vec<_>, _>>()?;
    b.fresh(o);
    b.push(n, Op::Concat { inputs: ins, axis, out: o });
    Ok(())
}

pub(super) fn rms_norm(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    let (x, gamma) = (b.f32_input(node, 0)?, b.f32_input(node, 1)?);
    let o = output(node, 0)?;
    b.fresh(o);
    b.push(n, Op::RmsNorm { x, gamma, eps: node.attr_f32("epsilon").unwrap_or(1e-5), out: o });
    Ok(())
}

/// InverseRms: rows of a fixed last axis into one f32 a row.
pub(super) fn inverse_rms(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    let x = b.f32_input(node, 0)?;
    let d =
        b.values[x].shape.last().and_then(|d| d.as_const()).filter(|&d| d > 0).ok_or_else(|| {
            node_fail(node)(format!("`{}` has no fixed last axis to take the rms of", b.values[x].name))
        })?;
    use crate::kernels::norm::{Squares, ALIGNED_MAX_D};
    let squares = match node.attr_str("squares") {
        None | Some("f32") => Squares::F32,
        Some("aligned") if d <= ALIGNED_MAX_D => Squares::Aligned,
        Some("aligned") => {
            return Err(node_fail(node)(format!("aligned squares take rows of at most {ALIGNED_MAX_D}, not {d}")))
        }
        Some(other) => return Err(node_fail(node)(format!("squares is \"f32\" or \"aligned\", not {other:?}"))),
    };
    let o = output(node, 0)?;
    b.fresh(o);
    b.push(n, Op::InverseRms { x, d, eps: node.attr_f32("epsilon").unwrap_or(1e-5), squares, out: o });
    Ok(())
}

/// SkipRmsNorm, with its residual sum as a second output when the program keeps it.
pub(super) fn skip_rms_norm(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    let (x, skip, gamma) = (b.f32_input(node, 0)?, b.f32_input(node, 1)?, b.f32_input(node, 2)?);
    let bias = match node.input(3) {
        Some(_) => Some(b.f32_input(node, 3)?),
        None => None,
    };
    let y = output(node, 0)?;
    b.fresh(y);
    let sum = node.outputs.get(1).copied();
    if let Some(s) = sum {
        b.fresh(s);
    }
    let eps = node.attr_f32("epsilon").unwrap_or(1e-5);
    b.push(n, Op::SkipRmsNorm { x, skip, gamma, bias, eps, y, sum });
    Ok(())
}

pub(super) fn rope(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    let (x, cos, sin) = (b.f32_input(node, 0)?, b.f32_input(node, 1)?, b.f32_input(node, 2)?);
    let o = output(node, 0)?;
    b.fresh(o);
    let interleaved = node.attr_i64("interleaved").unwrap_or(0) != 0;
    b.push(n, Op::Rope { x, cos, sin, interleaved, out: o });
    Ok(())
}

/// SwiGlu and GeluGate: `act(gate) · up`.
pub(super) fn gate(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    let (gate, up) = (b.f32_input(node, 0)?, b.f32_input(node, 1)?);
    let act = if node.op == "npuc::SwiGlu" { GateActivation::Silu } else { GateActivation::GeluTanh };
    let o = output(node, 0)?;
    b.fresh(o);
    b.push(n, Op::Gate { gate, up, act, out: o });
    Ok(())
}

/// Attention over the cache: the next layer, scaled by the node's `scale` (1/√head_dim by
/// default), within its sliding `window` if it has one, with the sink logits of input 6 if given.
pub(super) fn attention(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    let (q, k, v) = (b.f32_input(node, 0)?, b.f32_input(node, 1)?, b.f32_input(node, 2)?);
    let head_dim = b.cx.attention.map_or(1, |a| a.head_dim);
    let scale = node.attr_f32("scale").unwrap_or(1.0 / (head_dim as f32).sqrt());
    let window = match node.attr_i64("window").unwrap_or(0) {
        w if w < 0 => return Err(node_fail(node)(format!("window {w} is negative"))),
        w => NonZeroUsize::new(w as usize),
    };
    let sinks = node.input(6).map(|_| b.f32_input(node, 6)).transpose()?;
    let o = output(node, 0)?;
    b.fresh(o);
    let scoring = Scoring { scale, window, sinks: None };
    b.push(n, Op::Attention { q, k, v, layer: b.layer, scoring, sinks, out: o });
    b.layer += 1;
    Ok(())
}

/// Float `a + b` or `a · b` where one operand is the output's shape and the other that shape or a
/// suffix of it (leading 1s aside): the only broadcast the row-wise kernel computes.
pub(super) fn binary(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    let values = b.values;
    let (a, c) = (b.f32_input(node, 0)?, b.f32_input(node, 1)?);
    let o = output(node, 0)?;
    let trailing = |v: usize| {
        let s = &values[v].shape;
        let s = &s[s.iter().take_while(|d| d.as_const() == Some(1)).count()..];
        values[o].shape.ends_with(s)
    };
    let full = |v: usize| values[v].shape == values[o].shape;
    if !(full(a) && trailing(c) || full(c) && trailing(a)) {
        return Err(node_fail(node)(format!(
            "combines `{}` and `{}` with a broadcast other than a trailing one",
            values[a].name, values[c].name
        )));
    }
    b.fresh(o);
    b.push(n, Op::BinaryF32 { a, b: c, mul: node.op == "ai.onnx::Mul", out: o });
    Ok(())
}

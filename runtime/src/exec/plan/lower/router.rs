//! The element-wise and row ops a MoE router is spelled with when the builder writes it out
//! (LFM2-MoE's sigmoid scores, expert bias, top k and renormalisation): Neg, Exp, Reciprocal,
//! Log, Clip and Div of f32 tensors; ReduceSum, TopK (indices only), GatherElements and
//! ScatterElements along the last axis; ConstantOfShape of an f32 value. Other forms are refused
//! by name.

use super::{input, output, Builder};
use crate::bundle::program::Attr;
use crate::exec::error::{node_fail, ExecError};
use crate::exec::plan::{Loc, Op, UnaryKind};
use crate::exec::program::NodeInfo;

/// A scalar f32 constant input.
fn scalar(b: &Builder<'_, '_>, node: &NodeInfo, slot: usize) -> Result<Option<f32>, ExecError> {
    let Some(v) = node.input(slot) else { return Ok(None) };
    match b.locs[v] {
        Loc::ConstF32(i) if b.consts_f32[i].len() == 1 => Ok(Some(b.consts_f32[i][0])),
        Loc::Weight(i) if b.weights[i].len() == 1 => Ok(Some(b.weights[i][0])),
        _ => Err(node_fail(node)(format!("input {slot} (`{}`) is not a scalar constant", b.values[v].name))),
    }
}

/// A constant i64 input's values.
fn ints(b: &Builder<'_, '_>, node: &NodeInfo, slot: usize) -> Result<Vec<i64>, ExecError> {
    let v = input(node, slot)?;
    match b.locs[v] {
        Loc::ConstI64(i) => Ok(b.consts_i64[i].clone()),
        _ => Err(node_fail(node)(format!("input {slot} (`{}`) is not an integer constant", b.values[v].name))),
    }
}

/// The last axis, which `axis` must name; its fixed size.
fn last_axis(b: &Builder<'_, '_>, node: &NodeInfo, x: usize, axis: i64) -> Result<usize, ExecError> {
    let dims = b.dims(x);
    let rank = dims.len() as i64;
    match dims.last().copied().flatten() {
        Some(w) if w > 0 && (axis == -1 || axis == rank - 1) => Ok(w),
        _ => Err(node_fail(node)(format!("axis {axis}: the executor runs this op along a fixed last axis"))),
    }
}

pub(super) fn unary(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    let x = b.f32_input(node, 0)?;
    let kind = match node.op.as_str() {
        "ai.onnx::Neg" => UnaryKind::Neg,
        "ai.onnx::Exp" => UnaryKind::Exp,
        "ai.onnx::Reciprocal" => UnaryKind::Reciprocal,
        "ai.onnx::Log" => UnaryKind::Log,
        _ => UnaryKind::Clip {
            min: scalar(b, node, 1)?.unwrap_or(f32::NEG_INFINITY),
            max: scalar(b, node, 2)?.unwrap_or(f32::INFINITY),
        },
    };
    let out = output(node, 0)?;
    b.fresh(out);
    b.push(n, Op::Unary { x, kind, out });
    Ok(())
}

pub(super) fn div(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    let (x, y) = (b.f32_input(node, 0)?, b.f32_input(node, 1)?);
    let out = output(node, 0)?;
    b.fresh(out);
    b.push(n, Op::Div { a: x, b: y, out });
    Ok(())
}

/// ReduceSum over the last axis (kept or not: the values are the same).
pub(super) fn reduce_sum(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    let x = b.f32_input(node, 0)?;
    let axes = ints(b, node, 1)?;
    let width = match axes[..] {
        [a] => last_axis(b, node, x, a)?,
        _ => return Err(node_fail(node)(format!("axes {axes:?}: the executor sums along the last axis"))),
    };
    let out = output(node, 0)?;
    b.fresh(out);
    b.push(n, Op::ReduceLast { x, width, out });
    Ok(())
}

/// TopK along the last axis, largest first: its indices (the values output must be unread).
pub(super) fn top_k(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    let fail = node_fail(node);
    let x = b.f32_input(node, 0)?;
    let width = last_axis(b, node, x, node.attr_i64("axis").unwrap_or(-1))?;
    let k = match ints(b, node, 1)?[..] {
        [k] if k >= 1 && k as usize <= width => k as usize,
        ref k => return Err(fail(format!("k {k:?} is not one value in 1..={width}"))),
    };
    if node.attr_i64("largest").unwrap_or(1) != 1 {
        return Err(fail("largest = 0 is not supported".to_string()));
    }
    let (values, indices) = (output(node, 0)?, output(node, 1)?);
    if !b.cx.uses.consumers[values].is_empty() {
        return Err(fail("reads TopK's values; the executor computes its indices only".to_string()));
    }
    b.fresh_i64(indices);
    b.push(n, Op::TopK { x, width, k, out: indices });
    Ok(())
}

/// GatherElements and ScatterElements (no reduction) along the last axis with i64 indices.
pub(super) fn elements(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    let fail = node_fail(node);
    let data = b.f32_input(node, 0)?;
    let width = last_axis(b, node, data, node.attr_i64("axis").unwrap_or(0))?;
    let idx = input(node, 1)?;
    if !matches!(b.locs[idx], Loc::I64Buf(_) | Loc::ConstI64(_)) {
        return Err(fail(format!("indices `{}` are not an integer tensor", b.values[idx].name)));
    }
    if node.attr_str("reduction").is_some_and(|r| r != "none") {
        return Err(fail("a reduction is not supported".to_string()));
    }
    let updates = match node.op.as_str() {
        "ai.onnx::ScatterElements" => Some(b.f32_input(node, 2)?),
        _ => None,
    };
    let out = output(node, 0)?;
    b.fresh(out);
    b.push(n, Op::Elements { data, idx, updates, width, out });
    Ok(())
}

/// ConstantOfShape of one f32 value, its shape the output's (evaluated per step).
pub(super) fn constant_of_shape(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    let value = match node.attrs.get("value") {
        None => Some(0.0),
        Some(Attr::Tensor { tensor }) if tensor.dtype == "f32" => tensor.floats().and_then(|v| v.first().copied()),
        Some(_) => None,
    };
    let value = value.ok_or_else(|| node_fail(node)("value is not one f32".to_string()))?;
    let out = output(node, 0)?;
    b.fresh(out);
    b.push(n, Op::Fill { value, out });
    Ok(())
}

/// The operands of a Mul by one value per row: `(x, scale)` when one input is `[.., 1]` and the
/// other has the same leading dimensions and a wider last one.
pub(super) fn row_scale_operands(b: &Builder<'_, '_>, node: &NodeInfo) -> Result<Option<(usize, usize)>, ExecError> {
    let (p, q) = (input(node, 0)?, input(node, 1)?);
    let per_row = |x: usize, s: usize| {
        let (xs, ss) = (&b.values[x].shape, &b.values[s].shape);
        xs.len() == ss.len()
            && xs.len() > 1
            && xs[..xs.len() - 1] == ss[..ss.len() - 1]
            && ss.last().and_then(|d| d.as_const()) == Some(1)
            && xs.last().and_then(|d| d.as_const()).is_some_and(|w| w > 1)
    };
    Ok(if per_row(p, q) {
        Some((p, q))
    } else if per_row(q, p) {
        Some((q, p))
    } else {
        None
    })
}

pub(super) fn row_scale(
    b: &mut Builder<'_, '_>,
    n: usize,
    node: &NodeInfo,
    x: usize,
    scale: usize,
) -> Result<(), ExecError> {
    let slot = |v: usize| if node.input(0) == Some(v) { 0 } else { 1 };
    let (x, scale) = (b.f32_input(node, slot(x))?, b.f32_input(node, slot(scale))?);
    let out = output(node, 0)?;
    b.fresh(out);
    b.push(n, Op::RowScale { x, scale, out });
    Ok(())
}

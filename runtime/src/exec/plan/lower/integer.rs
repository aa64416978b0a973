//! Lowerings of shape and position arithmetic: Shape, Gather, Add, Sub, Mul, Range and Concat of
//! i64 tensors, each an [`Op::Int`] evaluated exactly at every step into a small i64 buffer from
//! constants, the step's ids and positions, or other integer ops' buffers.

use super::{input, output, Builder};
use crate::exec::error::{node_err, ExecError};
use crate::exec::plan::{IntKind, Loc, Op};
use crate::exec::program::{ElemType, NodeInfo};

/// Shape (or a range of its axes), read from the step's concrete shapes.
pub(super) fn shape(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    let start = node.attr_i64("start").unwrap_or(0);
    let end = node.attr_i64("end");
    let x = input(node, 0)?;
    let o = output(node, 0)?;
    b.fresh_i64(o);
    b.push(n, Op::Int { kind: IntKind::Shape { start, end }, inputs: vec![x], out: o });
    Ok(())
}

/// Gather of integer rows (the caller checked the axis).
pub(super) fn gather(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    let ins = int_inputs(b, node, 2)?;
    let o = output(node, 0)?;
    b.fresh_i64(o);
    b.push(n, Op::Int { kind: IntKind::Gather, inputs: ins, out: o });
    Ok(())
}

/// Add, Sub, Mul (two inputs) and Range (three) of integers.
pub(super) fn arithmetic(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    let (kind, arity) = match node.op.as_str() {
        "ai.onnx::Add" => (IntKind::Add, 2),
        "ai.onnx::Sub" => (IntKind::Sub, 2),
        "ai.onnx::Mul" => (IntKind::Mul, 2),
        _ => (IntKind::Range, 3),
    };
    let ins = int_inputs(b, node, arity)?;
    let o = output(node, 0)?;
    b.fresh_i64(o);
    b.push(n, Op::Int { kind, inputs: ins, out: o });
    Ok(())
}

/// Slice of an integer vector along axis 0 with step 1.
pub(super) fn slice(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    let o = output(node, 0)?;
    let ins = int_inputs(b, node, 3)?;
    let plain = |slot: usize| {
        node.input(slot)
            .is_none_or(|v| matches!(b.locs[v], Loc::ConstI64(i) if b.consts_i64[i] == [if slot == 3 { 0 } else { 1 }]))
    };
    if b.values[o].shape.len() != 1 || !plain(3) || !plain(4) {
        return Err(node_err(
            &node.name,
            &node.op,
            "slices an integer tensor other than a vector along axis 0 with step 1",
        ));
    }
    b.fresh_i64(o);
    b.push(n, Op::Int { kind: IntKind::Slice, inputs: ins, out: o });
    Ok(())
}

/// Concat of integer vectors (rank 1).
pub(super) fn concat(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    let o = output(node, 0)?;
    let ins = int_inputs(b, node, node.inputs.len())?;
    if b.values[o].shape.len() != 1 {
        return Err(node_err(&node.name, &node.op, "concatenates integer tensors of rank other than 1"));
    }
    b.fresh_i64(o);
    b.push(n, Op::Int { kind: IntKind::Concat, inputs: ins, out: o });
    Ok(())
}

/// The first `arity` inputs of an integer op: constants, the step's ids or positions, or values
/// computed by integer ops.
fn int_inputs(b: &Builder<'_, '_>, node: &NodeInfo, arity: usize) -> Result<Vec<usize>, ExecError> {
    let values = b.values;
    (0..arity)
        .map(|slot| {
            let v = input(node, slot)?;
            if values[v].elem != Some(ElemType::I64)
                || !matches!(b.locs[v], Loc::ConstI64(_) | Loc::I64Buf(_) | Loc::Ids | Loc::Positions)
            {
                return Err(node_err(
                    &node.name,
                    &node.op,
                    format!(
                        "input {slot} (`{}`, {}) is not an integer tensor the executor holds",
                        values[v].name, values[v].dtype
                    ),
                ));
            }
            Ok(v)
        })
        .collect()
}

//! The integer ops of a step: shape and position arithmetic (Shape, Gather, Add, Sub, Mul, Range
//! and Concat of i64 tensors), evaluated exactly from the step's concrete shapes into small i64
//! buffers.

use super::{numel, View};
use crate::exec::error::{node_err, ExecError};
use crate::exec::plan::{IntKind, Op};
use crate::exec::Executor;

impl Executor<'_> {
    /// Evaluates an integer op exactly into `y`.
    pub(super) fn compute_int(&self, index: usize, y: &mut Vec<i64>) -> Result<(), ExecError> {
        let (node_index, op) = &self.plan.ops[index];
        let node = &self.plan.program.nodes[*node_index];
        let fail = |problem: String| node_err(&node.name, &node.op, problem);
        let Op::Int { kind, inputs, .. } = op else { unreachable!("an integer op") };
        let view = view!(self);
        let scalar = |slot: usize| -> Result<i64, ExecError> {
            match view.i64(inputs[slot]) {
                [v] => Ok(*v),
                other => Err(fail(format!("input {slot} holds {} values, not one", other.len()))),
            }
        };
        y.clear();
        match kind {
            IntKind::Shape { start, end } => {
                let shape = &self.shapes[inputs[0]];
                let rank = shape.len() as i64;
                let clamp = |i: i64| (if i < 0 { i + rank } else { i }).clamp(0, rank) as usize;
                let (s, e) = (clamp(*start), clamp(end.unwrap_or(rank)));
                y.extend(shape[s..e.max(s)].iter().map(|&d| d as i64));
            }
            IntKind::Gather => {
                let (data, ids) = (view.i64(inputs[0]), view.i64(inputs[1]));
                let rows = self.shapes[inputs[0]].first().copied().unwrap_or(0);
                let width = data.len().checked_div(rows).unwrap_or(0);
                for &i in ids {
                    let row = if i < 0 { i + rows as i64 } else { i };
                    if row < 0 || row as usize >= rows {
                        return Err(fail(format!("index {i} is outside {rows} rows")));
                    }
                    y.extend_from_slice(&data[row as usize * width..(row as usize + 1) * width]);
                }
            }
            IntKind::Add | IntKind::Sub | IntKind::Mul => {
                let (a, b) = (view.i64(inputs[0]), view.i64(inputs[1]));
                let f = |x: i64, y: i64| match kind {
                    IntKind::Add => x.wrapping_add(y),
                    IntKind::Sub => x.wrapping_sub(y),
                    _ => x.wrapping_mul(y),
                };
                // Scalars broadcast; otherwise the shapes must agree.
                match (a.len(), b.len()) {
                    (1, _) => y.extend(b.iter().map(|&v| f(a[0], v))),
                    (_, 1) => y.extend(a.iter().map(|&v| f(v, b[0]))),
                    (x, z) if x == z && self.shapes[inputs[0]] == self.shapes[inputs[1]] => {
                        y.extend(a.iter().zip(b).map(|(&u, &v)| f(u, v)))
                    }
                    _ => {
                        return Err(fail(format!(
                            "shapes {:?} and {:?} do not broadcast the ways the executor does",
                            self.shapes[inputs[0]], self.shapes[inputs[1]]
                        )))
                    }
                }
            }
            IntKind::Range => {
                let (start, limit, delta) = (scalar(0)?, scalar(1)?, scalar(2)?);
                if delta == 0 {
                    return Err(fail("delta is 0".to_string()));
                }
                let count = ((limit - start) as f64 / delta as f64).ceil().max(0.0) as i64;
                y.extend((0..count).map(|i| start + i * delta));
            }
            IntKind::Concat => {
                for &i in inputs {
                    y.extend_from_slice(view.i64(i));
                }
            }
            IntKind::Slice => y.extend_from_slice(slice_range(view.i64(inputs[0]), scalar(1)?, scalar(2)?)),
        }
        let out = op_out(op);
        let want = numel(&self.shapes[out]);
        if y.len() != want {
            return Err(fail(format!("computed {} values; the program says {:?}", y.len(), self.shapes[out])));
        }
        Ok(())
    }
}

/// `data[start..end]` with ONNX's clamping (negative bounds count from the end).
fn slice_range(data: &[i64], start: i64, end: i64) -> &[i64] {
    let len = data.len() as i64;
    let clamp = |i: i64| (if i < 0 { i + len } else { i }).clamp(0, len) as usize;
    let (s, e) = (clamp(start), clamp(end));
    &data[s..e.max(s)]
}

fn op_out(op: &Op) -> usize {
    match op {
        Op::Int { out, .. } => *out,
        _ => unreachable!("used for integer ops"),
    }
}

//! The ops a written-out MoE router runs (see `plan::lower::router`): element-wise functions,
//! division, row sums, top-k indices, GatherElements/ScatterElements along rows, and fills.

use super::View;
use crate::exec::error::{node_fail, ExecError};
use crate::exec::plan::{Loc, Op, UnaryKind};
use crate::exec::Executor;

impl Executor<'_> {
    /// Unary, Div, RowScale, ReduceLast, Elements and Fill into `y`.
    pub(super) fn run_router(&mut self, index: usize, y: &mut [f32]) -> Result<(), ExecError> {
        let (node, op) = self.plan.node_op(index);
        let fail = node_fail(node);
        let view = view!(self);
        match *op {
            Op::Unary { x, kind, .. } => {
                let f = |v: f32| match kind {
                    UnaryKind::Neg => -v,
                    UnaryKind::Exp => v.exp(),
                    UnaryKind::Reciprocal => 1.0 / v,
                    UnaryKind::Log => v.ln(),
                    UnaryKind::Clip { min, max } => v.max(min).min(max),
                };
                y.iter_mut().zip(view.f32(x)).for_each(|(o, &v)| *o = f(v));
            }
            Op::Div { a, b, .. } => {
                let (a, b) = (view.f32(a), view.f32(b));
                if b.is_empty() || a.len() % b.len() != 0 {
                    return Err(fail(format!("divides {} values by {}", a.len(), b.len())));
                }
                for (i, o) in y[..a.len()].iter_mut().enumerate() {
                    *o = a[i] / b[i % b.len()];
                }
            }
            Op::RowScale { x, scale, .. } => {
                let (x, scale) = (view.f32(x), view.f32(scale));
                if scale.is_empty() || x.len() % scale.len() != 0 {
                    return Err(fail(format!("scales {} values by {} row scales", x.len(), scale.len())));
                }
                let width = x.len() / scale.len();
                for (i, o) in y[..x.len()].iter_mut().enumerate() {
                    *o = x[i] * scale[i / width];
                }
            }
            Op::ReduceLast { x, width, .. } => {
                y.iter_mut().zip(view.f32(x).chunks(width)).for_each(|(o, row)| *o = row.iter().sum());
            }
            Op::Elements { data, idx, updates, width, out } => {
                let (data, idx) = (view.f32(data), view.i64(idx));
                elements(data, idx, updates.map(|u| view.f32(u)), width, &mut y[..numel(&self.shapes[out])])
                    .map_err(fail)?;
            }
            Op::Fill { value, out } => y[..numel(&self.shapes[out])].fill(value),
            _ => unreachable!("a router op"),
        }
        Ok(())
    }

    /// TopK's indices into their i64 buffer.
    pub(super) fn run_top_k(&mut self, index: usize) -> Result<(), ExecError> {
        let &Op::TopK { x, width, k, out } = &self.plan.ops[index].1 else { unreachable!("a TopK") };
        let Loc::I64Buf(b) = self.plan.locs[out] else { unreachable!("TopK's indices live in an i64 buffer") };
        let mut y = std::mem::take(&mut self.ibufs[b]);
        y.clear();
        let view = view!(self);
        for row in view.f32(x).chunks(width) {
            let mut picked: Vec<usize> = Vec::with_capacity(k);
            for _ in 0..k {
                let best = (0..width).filter(|e| !picked.contains(e)).fold(None, |best: Option<usize>, e| match best {
                    Some(b) if row[b] >= row[e] => Some(b),
                    _ => Some(e),
                });
                picked.push(best.unwrap_or(0));
            }
            y.extend(picked.iter().map(|&e| e as i64));
        }
        self.ibufs[b] = y;
        Ok(())
    }
}

/// GatherElements (`updates` none: `y[r][j] = data[r][idx[r][j]]`) or ScatterElements (`y` =
/// data, then `y[r][idx[r][j]] = updates[r][j]`) along rows of `width`.
fn elements(data: &[f32], idx: &[i64], updates: Option<&[f32]>, width: usize, y: &mut [f32]) -> Result<(), String> {
    let rows = data.len() / width;
    let per_row = idx.len().checked_div(rows).unwrap_or(0);
    let at = |i: i64| -> Result<usize, String> {
        let j = if i < 0 { i + width as i64 } else { i };
        usize::try_from(j).ok().filter(|&j| j < width).ok_or_else(|| format!("index {i} is outside rows of {width}"))
    };
    if per_row * rows != idx.len() {
        return Err(format!("{} indices are not rows of {rows}", idx.len()));
    }
    match updates {
        None => {
            for (o, (r, &i)) in y.iter_mut().zip(idx.iter().enumerate().map(|(n, i)| (n / per_row, i))) {
                *o = data[r * width + at(i)?];
            }
        }
        Some(u) => {
            y.copy_from_slice(&data[..y.len()]);
            for (n, &i) in idx.iter().enumerate() {
                y[(n / per_row) * width + at(i)?] = u[n];
            }
        }
    }
    Ok(())
}

use super::numel;

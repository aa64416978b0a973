//! Everything inference needs about one node ([`NodeCtx`]), and the checks the op families share:
//! required and optional inputs, axes, numpy broadcasting, dtype agreement, constant operands.

use super::value::{Ctx, Info};
use crate::error::ErrorKind;
use ir::{Attrs, DType, Dim, Domain};

/// Everything inference needs about one node.
pub struct NodeCtx<'a> {
    pub name: &'a str,
    pub domain: Domain,
    pub op: &'static str,
    pub opset: i64,
    pub attrs: &'a Attrs,
    pub num_outputs: usize,
}

impl NodeCtx<'_> {
    pub(super) fn bad(&self, detail: impl Into<String>) -> ErrorKind {
        ErrorKind::BadNode { node: self.name.into(), op: self.op.into(), detail: detail.into() }
    }
    pub(super) fn shape_err(&self, detail: impl Into<String>) -> ErrorKind {
        ErrorKind::Shape { node: self.name.into(), op: self.op.into(), detail: detail.into() }
    }
    pub(super) fn dtype_err(&self, detail: impl Into<String>) -> ErrorKind {
        ErrorKind::Dtype { node: self.name.into(), op: self.op.into(), detail: detail.into() }
    }
    pub(super) fn attr_int(&self, name: &str, default: i64) -> Result<i64, ErrorKind> {
        self.attrs.int_or(name, default).map_err(|e| self.bad(e.to_string()))
    }
    pub(super) fn attr_ints(&self, name: &str) -> Result<Option<Vec<i64>>, ErrorKind> {
        self.attrs.ints(name).map(|o| o.map(|v| v.to_vec())).map_err(|e| self.bad(e.to_string()))
    }
}

pub(super) type In<'a> = &'a [Option<&'a Info>];

pub(super) fn req<'a>(n: &NodeCtx, inputs: In<'a>, i: usize) -> Result<&'a Info, ErrorKind> {
    inputs.get(i).copied().flatten().ok_or_else(|| n.bad(format!("required input {i} is missing")))
}

pub(super) fn opt<'a>(inputs: In<'a>, i: usize) -> Option<&'a Info> {
    inputs.get(i).copied().flatten()
}

pub(super) fn norm_axis(n: &NodeCtx, axis: i64, rank: usize) -> Result<usize, ErrorKind> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 0 || a >= r.max(1) && !(r == 0 && a == 0) {
        return Err(n.shape_err(format!("axis {axis} is out of range for rank {rank}")));
    }
    Ok(a as usize)
}

/// Numpy broadcasting of symbolic shapes.
pub(super) fn broadcast(n: &NodeCtx, ctx: &mut Ctx, shapes: &[&[Dim]]) -> Result<Vec<Dim>, ErrorKind> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = Vec::with_capacity(rank);
    for i in 0..rank {
        let mut acc: Option<Dim> = None;
        for s in shapes {
            let Some(d) = (i + s.len()).checked_sub(rank).map(|j| ctx.normalize(&s[j])) else { continue };
            acc = Some(match acc {
                None => d,
                Some(a) if a == d => a,
                Some(a) if a.as_known() == Some(1) => d,
                Some(a) if d.as_known() == Some(1) => a,
                Some(a) if a.is_known() && d.is_known() => {
                    let shapes: Vec<String> = shapes.iter().map(|s| ir::dim::shape_to_string(s)).collect();
                    return Err(n.shape_err(format!("cannot broadcast {} (dim {a} vs {d})", shapes.join(" with "))));
                }
                Some(a) => ctx.unify(&a, &d),
            });
        }
        out.push(acc.unwrap_or_else(|| Dim::known(1)));
    }
    Ok(out)
}

pub(super) fn same_dtype(n: &NodeCtx, infos: &[&Info]) -> Result<DType, ErrorKind> {
    let first = infos[0].dtype;
    for i in &infos[1..] {
        if i.dtype != first {
            return Err(n.dtype_err(format!("inputs are {first} and {}", i.dtype)));
        }
    }
    Ok(first)
}

pub(super) fn attr_dtype(n: &NodeCtx, name: &str) -> Result<Option<DType>, ErrorKind> {
    match n.attrs.int(name).map_err(|e| n.bad(e.to_string()))? {
        None => Ok(None),
        Some(code) => DType::from_onnx_code(code as i32)
            .map(Some)
            .ok_or_else(|| n.bad(format!("attribute `{name}` is unknown dtype code {code}"))),
    }
}

pub(super) fn known_ints(n: &NodeCtx, info: &Info, what: &str) -> Result<Vec<i64>, ErrorKind> {
    let (dims, _) = info.as_dims().ok_or_else(|| n.bad(format!("{what} must be a constant integer tensor")))?;
    dims.iter()
        .map(|d| d.as_known())
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| n.bad(format!("{what} must be constant, it depends on symbolic sizes")))
}

/// Axes for Reduce*/Squeeze/Unsqueeze: the input (opset ≥ 13/18) or the attribute.
pub(super) fn axes_of(n: &NodeCtx, inputs: In, input_index: usize) -> Result<Option<Vec<i64>>, ErrorKind> {
    if let Some(a) = opt(inputs, input_index) {
        return known_ints(n, a, "axes").map(Some);
    }
    n.attr_ints("axes")
}

/// One output of this dtype and shape.
pub(super) fn one(dtype: DType, shape: Vec<Dim>) -> Result<Vec<Info>, ErrorKind> {
    Ok(vec![Info::new(dtype, shape)])
}

/// One output with the first input's dtype and shape (Clip, Trilu, the scatters, RotaryEmbedding).
pub(super) fn like_first_input(n: &NodeCtx, _ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    let x = req(n, inputs, 0)?;
    one(x.dtype, x.shape.clone())
}

//! Elementwise ops: arithmetic, comparisons and logic with numpy broadcasting, Where, the maps
//! that keep their input's dtype and shape (float-only where ONNX defines them on floats only,
//! softmax and cumulative sums along an axis among them), the bool predicates, and casts.

use super::node::{attr_dtype, broadcast, one, req, same_dtype, In, NodeCtx};
use super::value::{Ctx, Info};
use crate::error::ErrorKind;
use ir::{DType, Dim};

/// Ops of [`unary`] that ONNX defines on floating-point inputs only.
const FLOAT_ONLY: &[&str] = &[
    "Sqrt",
    "Reciprocal",
    "Exp",
    "Log",
    "Sin",
    "Cos",
    "Tanh",
    "Erf",
    "Sigmoid",
    "Softmax",
    "Gelu",
    "Softplus",
    "LogSoftmax",
    "Hardmax",
];

/// Add, Sub, Mul, Div, Mod, Max, Min, Sum, Mean: every input of one dtype, the shapes broadcast.
pub(super) fn arithmetic(n: &NodeCtx, ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    let ins: Vec<&Info> = inputs.iter().flatten().copied().collect();
    let dt = same_dtype(n, &ins)?;
    let shapes: Vec<&[Dim]> = ins.iter().map(|i| i.shape.as_slice()).collect();
    one(dt, broadcast(n, ctx, &shapes)?)
}

/// Pow: the base's dtype (the exponent may be of another type), the shapes broadcast.
pub(super) fn pow(n: &NodeCtx, ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    let (a, b) = (req(n, inputs, 0)?, req(n, inputs, 1)?);
    one(a.dtype, broadcast(n, ctx, &[&a.shape, &b.shape])?)
}

/// Comparisons and logic: two inputs of one dtype, a bool output of the broadcast shape.
pub(super) fn compare(n: &NodeCtx, ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    let (a, b) = (req(n, inputs, 0)?, req(n, inputs, 1)?);
    same_dtype(n, &[a, b])?;
    one(DType::Bool, broadcast(n, ctx, &[&a.shape, &b.shape])?)
}

/// Where: a bool condition, two branches of one dtype, all three shapes broadcast.
pub(super) fn where_(n: &NodeCtx, ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    let (c, a, b) = (req(n, inputs, 0)?, req(n, inputs, 1)?, req(n, inputs, 2)?);
    if c.dtype != DType::Bool {
        return Err(n.dtype_err(format!("condition is {}, not bool", c.dtype)));
    }
    let dt = same_dtype(n, &[a, b])?;
    one(dt, broadcast(n, ctx, &[&c.shape, &a.shape, &b.shape])?)
}

/// Not, IsNaN, IsInf: a bool of the input's shape.
pub(super) fn predicate(n: &NodeCtx, _ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    one(DType::Bool, req(n, inputs, 0)?.shape.clone())
}

/// Maps that keep the input's dtype and shape; those in [`FLOAT_ONLY`] refuse other inputs.
pub(super) fn unary(n: &NodeCtx, _ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    let x = req(n, inputs, 0)?;
    if FLOAT_ONLY.contains(&n.op) && !x.dtype.is_float() {
        return Err(n.dtype_err(format!("{} needs a float input, got {}", n.op, x.dtype)));
    }
    one(x.dtype, x.shape.clone())
}

/// Cast: the dtype of attribute `to`, the input's shape.
pub(super) fn cast(n: &NodeCtx, _ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    one(attr_dtype(n, "to")?.ok_or_else(|| n.bad("Cast needs `to`"))?, req(n, inputs, 0)?.shape.clone())
}

/// CastLike: the second input's dtype, the first input's shape.
pub(super) fn cast_like(n: &NodeCtx, _ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    one(req(n, inputs, 1)?.dtype, req(n, inputs, 0)?.shape.clone())
}

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

#[cfg(test)]
mod tests {
    use crate::infer::testing::*;
    use crate::infer::Ctx;
    use ir::DType::*;

    #[test]
    fn arithmetic_broadcasts_known_and_symbolic_dims() {
        // Numpy broadcasting aligns trailing dims; a 1 stretches to the other side's size.
        let (a, b) = (value(F32, &["batch", "1", "64"]), value(F32, &["seq", "1"]));
        assert_eq!(TestNode::new("add", "Add").types(&[&a, &b]), ["f32[batch,seq,64]"]);
        // Sum takes any number of inputs.
        let c = value(F32, &["64"]);
        assert_eq!(TestNode::new("sum", "Sum").types(&[&a, &b, &c]), ["f32[batch,seq,64]"]);
    }

    #[test]
    fn broadcasting_two_different_sizes_assumes_them_equal() {
        let (a, b) = (value(F32, &["kv_len", "8"]), value(F32, &["total", "8"]));
        let mut ctx = Ctx::default();
        let out = TestNode::new("mask_add", "Add").infer(&mut ctx, &[Some(&a), Some(&b)]).unwrap();
        assert_eq!(typed(&out[0]), "f32[total,8]");
        assert_eq!(ctx.substitutions, [("kv_len".to_string(), sym("total"))]);
    }

    #[test]
    fn arithmetic_refuses_shapes_that_do_not_broadcast_and_mixed_dtypes() {
        let err = TestNode::new("add", "Add").refusal(&[&value(F32, &["2", "3"]), &value(F32, &["4"])]);
        assert_eq!(err, "node `add` (Add): shape mismatch: cannot broadcast [2,3] with [4] (dim 3 vs 4)");
        let err = TestNode::new("mul", "Mul").refusal(&[&value(F32, &["2"]), &value(F16, &["2"])]);
        assert_eq!(err, "node `mul` (Mul): dtype mismatch: inputs are f32 and f16");
    }

    #[test]
    fn pow_has_the_base_dtype() {
        // Pow's exponent may be of another numeric type (T2); the output is of the base's (T).
        let out = TestNode::new("pow", "Pow").types(&[&value(F16, &["n", "3"]), &value(F32, &[])]);
        assert_eq!(out, ["f16[n,3]"]);
    }

    #[test]
    fn comparisons_and_logic_give_bools_of_the_broadcast_shape() {
        let (a, b) = (value(I64, &["seq", "1"]), value(I64, &["1", "total"]));
        assert_eq!(TestNode::new("lt", "Less").types(&[&a, &b]), ["bool[seq,total]"]);
        let p = value(Bool, &["4"]);
        assert_eq!(TestNode::new("and", "And").types(&[&p, &p]), ["bool[4]"]);
        let err = TestNode::new("eq", "Equal").refusal(&[&a, &value(I32, &["1"])]);
        assert_eq!(err, "node `eq` (Equal): dtype mismatch: inputs are i64 and i32");
    }

    #[test]
    fn where_broadcasts_three_shapes_and_needs_a_bool_condition() {
        let cond = value(Bool, &["seq", "total"]);
        let (x, y) = (value(F32, &[]), value(F32, &["batch", "1", "1", "total"]));
        assert_eq!(TestNode::new("mask", "Where").types(&[&cond, &x, &y]), ["f32[batch,1,seq,total]"]);
        let err = TestNode::new("mask", "Where").refusal(&[&value(I64, &["seq", "total"]), &x, &y]);
        assert_eq!(err, "node `mask` (Where): dtype mismatch: condition is i64, not bool");
    }

    #[test]
    fn maps_keep_dtype_and_shape_and_float_only_ones_refuse_integers() {
        let x = value(F16, &["batch", "seq", "64"]);
        for op in ["Sigmoid", "Softmax", "Gelu", "Erf", "Relu", "Identity"] {
            assert_eq!(TestNode::new("map", op).types(&[&x]), ["f16[batch,seq,64]"], "{op}");
        }
        assert_eq!(TestNode::new("cumsum", "CumSum").types(&[&value(I64, &["n"]), &ints(&[0])]), ["i64[n]"]);
        assert_eq!(TestNode::new("neg", "Neg").types(&[&value(I32, &["n"])]), ["i32[n]"]);
        let err = TestNode::new("sqrt", "Sqrt").refusal(&[&value(I64, &["n"])]);
        assert_eq!(err, "node `sqrt` (Sqrt): dtype mismatch: Sqrt needs a float input, got i64");
    }

    #[test]
    fn predicates_give_bools_of_the_input_shape() {
        assert_eq!(TestNode::new("nan", "IsNaN").types(&[&value(F16, &["n", "2"])]), ["bool[n,2]"]);
        assert_eq!(TestNode::new("inf", "IsInf").types(&[&value(F32, &["n"])]), ["bool[n]"]);
        assert_eq!(TestNode::new("not", "Not").types(&[&value(Bool, &["n"])]), ["bool[n]"]);
    }

    #[test]
    fn casts_take_the_dtype_of_to_or_of_the_second_input() {
        // `to` is a TensorProto.DataType code: 10 is FLOAT16.
        let x = value(F32, &["batch", "seq"]);
        assert_eq!(TestNode::new("cast", "Cast").int("to", 10).types(&[&x]), ["f16[batch,seq]"]);
        assert_eq!(TestNode::new("like", "CastLike").types(&[&x, &value(BF16, &[])]), ["bf16[batch,seq]"]);
        let err = TestNode::new("cast", "Cast").refusal(&[&x]);
        assert_eq!(err, "node `cast` (Cast): Cast needs `to`");
    }
}

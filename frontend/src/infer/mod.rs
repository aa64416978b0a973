//! Dtype and symbolic shape inference, with constant and shape-arithmetic folding.
//!
//! Every value gets an [`Info`]: dtype, symbolic shape, and what is known of its contents — a
//! concrete small tensor, or a vector of symbolic dims (what `Shape(x)` and the arithmetic on it
//! produce). Nodes whose inputs are all concrete are evaluated with the reference evaluator;
//! shape arithmetic on symbolic dims is folded exactly on [`Dim`] polynomials. Provable mismatches
//! (a concrete 256 against a concrete 384) are errors naming the node; agreements the frontend has
//! to assume (`total_sequence_length` = `past_sequence_length + sequence_length`) are recorded.
//!
//! [`infer_node`] folds shape arithmetic on symbolic dims (`dims.rs`), or else dispatches the op
//! to the function of its family that infers it (`inference_of`), then evaluates nodes whose
//! inputs are all constants. The families, one file each: `elementwise`, `matmul` (MatMul, Gemm,
//! Einsum), `reduce` (Reduce*, Arg*, TopK, losses), `normalization`, `shape_ops` (Reshape,
//! Transpose, (Un)Squeeze, Expand, Tile, ...), `slicing` (Concat, Split, Slice, Pad), `gather`,
//! `creation` (Range, ConstantOfShape), `quant`, `attention` and `recurrent` (LinearAttention,
//! CausalConvWithState, LinearAttentionGate). `value.rs` holds what is known
//! of values ([`Info`]) and the assumed equalities ([`Ctx`]); `node.rs` the node's view
//! ([`NodeCtx`]) and the checks the families share.
//!
//! [`Dim`]: ir::Dim

mod attention;
mod creation;
mod dims;
mod elementwise;
mod gather;
mod matmul;
mod node;
mod normalization;
mod quant;
mod recurrent;
mod reduce;
mod shape_ops;
mod slicing;
mod value;

#[cfg(test)]
mod testing;

pub use node::NodeCtx;
pub use shape_ops::reshape_shape;
pub use slicing::constant_slice_bounds;
pub use value::{Ctx, Info, Known};

use crate::error::ErrorKind;
use ir::op::OpRef;
use ir::Tensor;
use node::{like_first_input, In};

/// Folded results with more elements than this stay nodes (a constant causal mask of 2048² would
/// otherwise land in the graph by value).
pub const FOLD_LIMIT_ELEMENTS: usize = 1 << 16;

/// Infers the outputs of one node.
pub fn infer_node(n: &NodeCtx, ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    // Shape arithmetic on symbolic dims folds before general inference.
    if let Some(folded) = dims::fold(n, ctx, inputs)? {
        return Ok(vec![folded]);
    }
    let infer = inference_of(n.op).ok_or_else(|| n.bad(format!("no shape inference for {}", n.op)))?;
    let mut outs = infer(n, ctx, inputs)?;
    for o in outs.iter_mut() {
        o.shape = o.shape.iter().map(|d| ctx.normalize(d)).collect();
    }
    let all_concrete = inputs.iter().flatten().all(|i| i.is_concrete());
    let small = outs.iter().all(|o| {
        o.shape
            .iter()
            .try_fold(1usize, |acc, d| d.as_known().and_then(|k| acc.checked_mul(k as usize)))
            .is_some_and(|numel| numel <= FOLD_LIMIT_ELEMENTS)
    });
    if all_concrete && small && n.op != "Constant" {
        return evaluate(n, inputs, &outs);
    }
    Ok(outs)
}

/// Evaluates a node whose inputs are all constants with the reference evaluator; what it computes
/// must have the dtypes and shapes inference gave (`inferred`).
fn evaluate(n: &NodeCtx, inputs: In, inferred: &[Info]) -> Result<Vec<Info>, ErrorKind> {
    let fold_err = |detail: String| ErrorKind::Fold { node: n.name.into(), op: n.op.into(), detail };
    let tensors: Vec<Option<&Tensor>> = inputs.iter().map(|i| i.and_then(|i| i.as_const())).collect();
    let op = OpRef { node: n.name, domain: n.domain, op: n.op, opset: n.opset, attrs: n.attrs };
    let results = ir::eval::eval_op(&op, &tensors, n.num_outputs).map_err(|e| fold_err(e.msg))?;
    for (i, (t, o)) in results.iter().zip(inferred).enumerate() {
        let shape: Vec<Option<i64>> = o.shape.iter().map(|d| d.as_known()).collect();
        let got: Vec<Option<i64>> = t.shape.iter().map(|&d| Some(d as i64)).collect();
        if shape != got || t.dtype != o.dtype {
            return Err(fold_err(format!(
                "output {i} evaluated to {}{:?} but inference said {}{}",
                t.dtype,
                t.shape,
                o.dtype,
                ir::dim::shape_to_string(&o.shape)
            )));
        }
    }
    Ok(results.into_iter().map(Info::constant).collect())
}

/// How one family infers the outputs of a node from its inputs.
type InferFn = fn(&NodeCtx, &mut Ctx, In) -> Result<Vec<Info>, ErrorKind>;

/// The function that infers `op`'s outputs, by family; `None` for an op inference does not know.
fn inference_of(op: &str) -> Option<InferFn> {
    Some(match op {
        "Add" | "Sub" | "Mul" | "Div" | "Mod" | "Max" | "Min" | "Sum" | "Mean" => elementwise::arithmetic,
        "Pow" => elementwise::pow,
        "Equal" | "Less" | "LessOrEqual" | "Greater" | "GreaterOrEqual" | "And" | "Or" | "Xor" => elementwise::compare,
        "Where" => elementwise::where_,
        "Not" | "IsNaN" | "IsInf" => elementwise::predicate,
        "Neg" | "Abs" | "Sqrt" | "Reciprocal" | "Exp" | "Log" | "Sin" | "Cos" | "Tanh" | "Erf" | "Sigmoid" | "Relu"
        | "Floor" | "Ceil" | "Round" | "Identity" | "Softmax" | "CumSum" | "Gelu" | "Softplus" | "LogSoftmax"
        | "Hardmax" => elementwise::unary,
        "Cast" => elementwise::cast,
        "CastLike" => elementwise::cast_like,
        "Clip" | "Trilu" => like_first_input,
        "MatMul" => matmul::matmul,
        "MatMulInteger" => matmul::matmul_integer,
        "Gemm" => matmul::gemm,
        "Einsum" => matmul::einsum,
        "ReduceMean" | "ReduceSum" | "ReduceMax" | "ReduceMin" | "ReduceProd" | "ReduceL1" | "ReduceL2"
        | "ReduceSumSquare" | "ReduceLogSum" | "ReduceLogSumExp" => reduce::reduce,
        "ArgMax" | "ArgMin" => reduce::arg_reduce,
        "TopK" => reduce::top_k,
        "NegativeLogLikelihoodLoss" | "SoftmaxCrossEntropyLoss" => reduce::loss,
        "LayerNormalization" | "SimplifiedLayerNormalization" | "RMSNormalization" => normalization::layer_norm,
        "SkipSimplifiedLayerNormalization" => normalization::skip_simplified,
        "Reshape" => shape_ops::reshape,
        "Flatten" => shape_ops::flatten,
        "Transpose" => shape_ops::transpose,
        "Unsqueeze" => shape_ops::unsqueeze,
        "Squeeze" => shape_ops::squeeze,
        "Expand" => shape_ops::expand,
        "Tile" => shape_ops::tile,
        "Concat" => slicing::concat,
        "Split" => slicing::split,
        "Slice" => slicing::slice,
        "Pad" => slicing::pad,
        "Gather" => gather::gather,
        "GatherElements" => gather::gather_elements,
        "GatherND" => gather::gather_nd,
        "ScatterND" | "ScatterElements" => like_first_input,
        "Range" => creation::range,
        "ConstantOfShape" => creation::constant_of_shape,
        "QuantizeLinear" => quant::quantize,
        "DequantizeLinear" => quant::dequantize,
        "DynamicQuantizeLinear" => quant::dynamic_quantize,
        "MatMulNBits" => quant::matmul_nbits,
        "GatherBlockQuantized" => quant::gather_block_quantized,
        "Attention" => attention::attention,
        "GroupQueryAttention" => attention::group_query_attention,
        "RotaryEmbedding" | "MRotaryEmbedding" => like_first_input,
        "LinearAttention" => recurrent::linear_attention,
        "CausalConvWithState" => recurrent::causal_conv,
        "LinearAttentionGate" => recurrent::linear_attention_gate,
        "GatedRMSNorm" | "GatedAdd" | "MoE" | "QMoE" | "LpNormalization" => like_first_input,
        "Shape" | "Size" => unreachable!("folded in dims::fold"),
        "Constant" => unreachable!("Constant nodes are read by the importer"),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::FOLD_LIMIT_ELEMENTS;
    use ir::DType::*;

    #[test]
    fn a_node_of_constants_is_evaluated() {
        // Add broadcasts [1, 2, 3] with [10].
        let out = TestNode::new("add", "Add").run(&[&ints(&[1, 2, 3]), &ints(&[10])]).unwrap();
        assert_eq!(typed(&out[0]), "i64[3]");
        assert_eq!(out[0].as_const().and_then(|t| t.as_i64()), Some(&[11, 12, 13][..]));
    }

    #[test]
    fn a_result_over_the_fold_limit_stays_a_node() {
        assert_eq!(FOLD_LIMIT_ELEMENTS, 256 * 256);
        let zeros = TestNode::new("zeros", "ConstantOfShape");
        let out = zeros.run(&[&ints(&[256, 256])]).unwrap();
        assert_eq!(out[0].as_const().map(|t| t.numel()), Some(256 * 256));
        let out = zeros.run(&[&ints(&[256, 257])]).unwrap();
        assert_eq!((typed(&out[0]), out[0].as_const().is_none()), ("f32[256,257]".into(), true));
    }

    #[test]
    fn an_op_inference_does_not_know_is_refused_by_name() {
        let err = TestNode::new("mystery", "Mystery").refusal(&[&value(F32, &["2"])]);
        assert_eq!(err, "node `mystery` (Mystery): no shape inference for Mystery");
    }

    #[test]
    fn ops_that_keep_their_first_input_keep_its_dtype_and_shape() {
        let x = value(F16, &["batch", "seq", "576"]);
        let (lo, hi) = (value(F16, &[]), value(F16, &[]));
        assert_eq!(TestNode::new("clip", "Clip").types(&[&x, &lo, &hi]), ["f16[batch,seq,576]"]);
        assert_eq!(TestNode::new("causal", "Trilu").types(&[&x]), ["f16[batch,seq,576]"]);
        let (idx, upd) = (value(I64, &["k", "1"]), value(F16, &["k", "seq", "576"]));
        assert_eq!(TestNode::new("scatter", "ScatterND").types(&[&x, &idx, &upd]), ["f16[batch,seq,576]"]);
    }
}

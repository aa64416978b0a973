//! The reference evaluator: simple, obviously correct implementations of every ai.onnx and
//! com.microsoft op in [`crate::op::VOCABULARY`], used as the Rust-side oracle for every later
//! pass. npuc's own fused ops are delegated to [`crate::fused`].
//!
//! Conventions: elementwise float ops compute in f32 per element (f64 for f64 tensors) and round
//! the result to the output dtype; accumulations (sums, means, mean squares, dot products, softmax)
//! and the fused transformer ops compute in f64 and round once; integer ops are exact in i64 with
//! two's-complement wrapping; rounding to integers is round-half-to-even wherever ONNX specifies it.
//! Bad inputs are errors, never panics, and no result beyond 2^31 elements is allocated.
//!
//! Layout of the module: `layout` holds the index arithmetic every op shares (strides,
//! broadcasting, strided gathers); the other files group ops by kind.

use crate::attr::{AttrError, Attrs};
use crate::dtype::DType;
use crate::op::{lookup, Domain, OpRef, MANY};
use crate::tensor::{Data, Tensor, TensorError};

/// An op could not be evaluated on the given inputs.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("node `{node}` ({op}): {msg}")]
pub struct EvalError {
    pub node: String,
    pub op: String,
    pub msg: String,
}

/// Why an op failed, before the node's name is attached.
#[derive(Debug)]
pub(crate) struct Fail(pub(crate) String);

pub(crate) type Res<T> = Result<T, Fail>;

impl From<AttrError> for Fail {
    fn from(e: AttrError) -> Fail {
        Fail(e.to_string())
    }
}

impl From<TensorError> for Fail {
    fn from(e: TensorError) -> Fail {
        Fail(e.to_string())
    }
}

/// Returns early with a formatted [`Fail`].
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err($crate::eval::Fail(format!($($arg)*)))
    };
}

mod attention;
mod einsum;
mod elementwise;
mod gating;
mod layout;
mod linalg;
mod loss;
mod moe;
mod mrope;
mod norm;
mod pad;
mod quant;
mod recurrent;
mod reduce;
mod shape_ops;

/// Evaluates one node. `inputs[i]` is `None` for an omitted optional input; the result holds
/// exactly `num_outputs` tensors.
pub fn eval_op(op: &OpRef, inputs: &[Option<&Tensor>], num_outputs: usize) -> Result<Vec<Tensor>, EvalError> {
    let fail = |msg: String| EvalError { node: op.node.to_string(), op: op.op.to_string(), msg };
    let cx = Ctx { op, inputs, num_outputs };
    let mut outputs = cx.check_signature().and_then(|()| dispatch(&cx)).map_err(|Fail(msg)| fail(msg))?;
    if outputs.len() < num_outputs {
        return Err(fail(format!("{num_outputs} outputs requested, the op produces {}", outputs.len())));
    }
    outputs.truncate(num_outputs);
    Ok(outputs)
}

fn dispatch(cx: &Ctx) -> Res<Vec<Tensor>> {
    match cx.op.domain {
        Domain::Onnx => dispatch_onnx(cx),
        Domain::Microsoft => dispatch_contrib(cx),
        Domain::Npuc => crate::fused::eval(cx.op, cx.inputs, cx.num_outputs).map_err(|e| Fail(e.msg)),
    }
}

fn dispatch_contrib(cx: &Ctx) -> Res<Vec<Tensor>> {
    match cx.op.op {
        "MatMulNBits" => quant::matmul_nbits(cx),
        "GroupQueryAttention" => attention::group_query_attention(cx),
        "SkipSimplifiedLayerNormalization" => norm::skip_simplified_layer_norm(cx),
        "SimplifiedLayerNormalization" => norm::rms_norm(cx),
        "GatherBlockQuantized" => quant::gather_block_quantized(cx),
        "RotaryEmbedding" => attention::rotary_embedding_contrib(cx),
        "QuantizeLinear" => quant::quantize_linear(cx),
        "DequantizeLinear" => quant::dequantize_linear(cx),
        "LinearAttention" => recurrent::linear_attention(cx),
        "LinearAttentionGate" => recurrent::linear_attention_gate(cx),
        "CausalConvWithState" => recurrent::causal_conv_with_state(cx),
        "GatedRMSNorm" => gating::gated_rms_norm(cx),
        "GatedAdd" => gating::gated_add(cx),
        "MRotaryEmbedding" => mrope::m_rotary_embedding(cx),
        "MoE" => moe::moe(cx),
        "QMoE" => moe::qmoe(cx),
        op => bail!("com.microsoft op {op} is not in the vocabulary"),
    }
}

fn dispatch_onnx(cx: &Ctx) -> Res<Vec<Tensor>> {
    use elementwise::{Arith, Compare, Logic};
    use reduce::Normalizer;
    let op = cx.op.op;
    match op {
        "Add" => elementwise::arith(cx, Arith::Add),
        "Sub" => elementwise::arith(cx, Arith::Sub),
        "Mul" => elementwise::arith(cx, Arith::Mul),
        "Div" => elementwise::arith(cx, Arith::Div),
        "Mod" => elementwise::arith(cx, Arith::Mod),
        "Pow" => elementwise::pow(cx),
        "Max" => elementwise::min_max(cx, true),
        "Min" => elementwise::min_max(cx, false),
        "Sum" => elementwise::sum_mean(cx, false),
        "Mean" => elementwise::sum_mean(cx, true),
        "Equal" => elementwise::compare(cx, Compare::Equal),
        "Less" => elementwise::compare(cx, Compare::Less),
        "LessOrEqual" => elementwise::compare(cx, Compare::LessOrEqual),
        "Greater" => elementwise::compare(cx, Compare::Greater),
        "GreaterOrEqual" => elementwise::compare(cx, Compare::GreaterOrEqual),
        "And" => elementwise::logic(cx, Logic::And),
        "Or" => elementwise::logic(cx, Logic::Or),
        "Xor" => elementwise::logic(cx, Logic::Xor),
        "Where" => elementwise::where_op(cx),
        "Neg" | "Abs" | "Sqrt" | "Reciprocal" | "Exp" | "Log" | "Sin" | "Cos" | "Tanh" | "Erf" | "Sigmoid" | "Relu"
        | "Floor" | "Ceil" | "Round" | "Not" | "IsNaN" | "IsInf" | "Gelu" | "Softplus" => elementwise::unary(cx),
        "Identity" => Ok(vec![cx.input(0, "input")?.clone()]),
        "Cast" => elementwise::cast(cx),
        "CastLike" => elementwise::cast_like(cx),
        "Clip" => elementwise::clip(cx),
        "MatMul" => linalg::matmul(cx),
        "Gemm" => linalg::gemm(cx),
        "MatMulInteger" => linalg::matmul_integer(cx),
        "Einsum" => einsum::einsum(cx),
        "Softmax" => reduce::normalize(cx, Normalizer::Softmax),
        "LogSoftmax" => reduce::normalize(cx, Normalizer::LogSoftmax),
        "Hardmax" => reduce::normalize(cx, Normalizer::Hardmax),
        "ReduceMean" | "ReduceSum" | "ReduceMax" | "ReduceMin" | "ReduceProd" | "ReduceL1" | "ReduceL2"
        | "ReduceSumSquare" | "ReduceLogSum" | "ReduceLogSumExp" => reduce::reduce(cx),
        "ArgMax" => reduce::arg_extreme(cx, true),
        "ArgMin" => reduce::arg_extreme(cx, false),
        "TopK" => reduce::top_k(cx),
        "NegativeLogLikelihoodLoss" => loss::negative_log_likelihood(cx),
        "SoftmaxCrossEntropyLoss" => loss::softmax_cross_entropy(cx),
        "CumSum" => reduce::cum_sum(cx),
        "LayerNormalization" => norm::layer_norm(cx),
        "SimplifiedLayerNormalization" => norm::rms_norm(cx),
        "RMSNormalization" => norm::rms_norm(cx),
        "Shape" => shape_ops::shape(cx),
        "Size" => shape_ops::size(cx),
        "Reshape" => shape_ops::reshape(cx),
        "Flatten" => shape_ops::flatten(cx),
        "Transpose" => shape_ops::transpose(cx),
        "Unsqueeze" => shape_ops::unsqueeze(cx),
        "Squeeze" => shape_ops::squeeze(cx),
        "Concat" => shape_ops::concat(cx),
        "Split" => shape_ops::split(cx),
        "Slice" => shape_ops::slice(cx),
        "Gather" => shape_ops::gather(cx),
        "GatherElements" => shape_ops::gather_elements(cx),
        "GatherND" => shape_ops::gather_nd(cx),
        "ScatterND" => shape_ops::scatter_nd(cx),
        "ScatterElements" => shape_ops::scatter_elements(cx),
        "Pad" => pad::pad(cx),
        "Expand" => shape_ops::expand(cx),
        "Tile" => shape_ops::tile(cx),
        "Range" => shape_ops::range(cx),
        "ConstantOfShape" => shape_ops::constant_of_shape(cx),
        "Constant" => shape_ops::constant(cx),
        "Trilu" => shape_ops::trilu(cx),
        "QuantizeLinear" => quant::quantize_linear(cx),
        "DequantizeLinear" => quant::dequantize_linear(cx),
        "DynamicQuantizeLinear" => quant::dynamic_quantize_linear(cx),
        "RotaryEmbedding" => attention::rotary_embedding_onnx(cx),
        "Attention" => attention::attention(cx),
        "LinearAttention" => recurrent::linear_attention(cx),
        "CausalConvWithState" => recurrent::causal_conv_with_state(cx),
        "LpNormalization" => norm::lp_norm(cx),
        _ => bail!("ai.onnx op {op} is not in the vocabulary"),
    }
}

/// One node being evaluated: its op, its inputs and how many outputs it has.
pub(crate) struct Ctx<'a> {
    pub(crate) op: &'a OpRef<'a>,
    inputs: &'a [Option<&'a Tensor>],
    pub(crate) num_outputs: usize,
}

impl<'a> Ctx<'a> {
    pub(crate) fn attrs(&self) -> &'a Attrs {
        self.op.attrs
    }

    pub(crate) fn opset(&self) -> i64 {
        self.op.opset
    }

    /// A required input.
    pub(crate) fn input(&self, index: usize, name: &str) -> Res<&'a Tensor> {
        match self.opt(index) {
            Some(t) => Ok(t),
            None => bail!("required input {index} ({name}) is missing"),
        }
    }

    /// An optional input; `None` when omitted or beyond the given inputs.
    pub(crate) fn opt(&self, index: usize) -> Option<&'a Tensor> {
        self.inputs.get(index).copied().flatten()
    }

    /// The given inputs, in order, skipping omitted ones.
    pub(crate) fn present_inputs(&self) -> impl Iterator<Item = &'a Tensor> + '_ {
        self.inputs.iter().filter_map(|t| *t)
    }

    /// Checks the op is in the vocabulary, input and output counts are within its arity, and every
    /// input's storage agrees with its dtype and shape (the ops rely on that).
    fn check_signature(&self) -> Res<()> {
        let Some(spec) = lookup(self.op.domain, self.op.op) else {
            bail!("{} op {} is not in the vocabulary", self.op.domain, self.op.op);
        };
        if spec.max_inputs != MANY && self.inputs.len() > spec.max_inputs {
            bail!("{} inputs given, the op takes at most {}", self.inputs.len(), spec.max_inputs);
        }
        if self.num_outputs < spec.min_outputs || (spec.max_outputs != MANY && self.num_outputs > spec.max_outputs) {
            bail!("{} outputs requested, the op has {}..={}", self.num_outputs, spec.min_outputs, spec.max_outputs);
        }
        for (i, t) in self.inputs.iter().enumerate() {
            if let Some(t) = t {
                check_storage(t).map_err(|Fail(msg)| Fail(format!("input {i}: {msg}")))?;
            }
        }
        Ok(())
    }
}

/// A tensor's storage must be the one its dtype implies and hold exactly its shape's elements.
pub(crate) fn check_storage(t: &Tensor) -> Res<()> {
    let storage_ok = match &t.data {
        Data::F32(_) => t.dtype.is_float() && t.dtype != DType::F64,
        Data::F64(_) => t.dtype == DType::F64,
        Data::I64(_) => t.dtype.is_int() || t.dtype == DType::Bool,
        Data::Str(_) => t.dtype == DType::Str,
    };
    if !storage_ok {
        bail!("{} tensor has mismatched storage", t.dtype);
    }
    if matches!(t.dtype, DType::F6E2M3 | DType::F6E3M2) {
        bail!("dtype {} is not supported by the evaluator", t.dtype);
    }
    if crate::tensor::numel(&t.shape) != Some(t.numel()) {
        bail!("tensor of shape {:?} holds {} elements", t.shape, t.numel());
    }
    Ok(())
}

/// Normalises an axis in `[-rank, rank)` to `[0, rank)`.
pub(crate) fn norm_axis(axis: i64, rank: usize, what: &str) -> Res<usize> {
    let r = rank as i64;
    if axis < -r || axis >= r {
        bail!("{what} {axis} is out of range for rank {rank}");
    }
    Ok(if axis < 0 { (axis + r) as usize } else { axis as usize })
}

/// The values of an integer (not bool) tensor, e.g. shapes, axes and indices.
pub(crate) fn int_values<'t>(t: &'t Tensor, what: &str) -> Res<&'t [i64]> {
    if !t.dtype.is_int() {
        bail!("{what} must be an integer tensor, got {}", t.dtype);
    }
    match &t.data {
        Data::I64(v) => Ok(v),
        _ => bail!("{what} has non-integer storage"),
    }
}

/// The single value of a one-element integer tensor.
pub(crate) fn int_scalar(t: &Tensor, what: &str) -> Res<i64> {
    match int_values(t, what)? {
        [v] => Ok(*v),
        v => bail!("{what} must hold one value, got {} (shape {:?})", v.len(), t.shape),
    }
}

/// The values of a float tensor, widened to f64.
pub(crate) fn float_values(t: &Tensor, what: &str) -> Res<Vec<f64>> {
    match &t.data {
        Data::F32(v) => Ok(v.iter().map(|&x| x as f64).collect()),
        Data::F64(v) => Ok(v.clone()),
        _ => bail!("{what} must be a float tensor, got {}", t.dtype),
    }
}

/// The values of a numeric tensor as f64 (unsigned 64-bit values read as unsigned).
pub(crate) fn numeric_values(t: &Tensor, what: &str) -> Res<Vec<f64>> {
    match &t.data {
        Data::I64(v) if t.dtype == DType::U64 => Ok(v.iter().map(|&x| x as u64 as f64).collect()),
        Data::I64(v) => Ok(v.iter().map(|&x| x as f64).collect()),
        Data::Str(_) => bail!("{what} must be numeric, got a string tensor"),
        _ => float_values(t, what),
    }
}

/// Rounds an f64 to the nearest value of a float dtype held in f32 storage, in one step for
/// f32/f16/bf16 so no double rounding happens.
pub(crate) fn round_f64(dtype: DType, v: f64) -> f32 {
    match dtype {
        DType::F16 => half::f16::from_f64(v).to_f32(),
        DType::BF16 => half::bf16::from_f64(v).to_f32(),
        DType::F32 | DType::F64 => v as f32,
        _ => crate::tensor::round_to_float(dtype, v as f32),
    }
}

/// A float tensor of `dtype` from f64 results, rounded to the dtype.
pub(crate) fn float_tensor(dtype: DType, shape: Vec<usize>, values: Vec<f64>) -> Tensor {
    debug_assert_eq!(crate::tensor::numel(&shape), Some(values.len()));
    let data = if dtype == DType::F64 {
        Data::F64(values)
    } else {
        Data::F32(values.into_iter().map(|v| round_f64(dtype, v)).collect())
    };
    Tensor { dtype, shape, data }
}

/// The output dtype named by an ONNX type code attribute value.
pub(crate) fn dtype_from_code(code: i64, what: &str) -> Res<DType> {
    match i32::try_from(code).ok().and_then(DType::from_onnx_code) {
        Some(d) => Ok(d),
        None => bail!("{what} {code} is not an ONNX data type"),
    }
}

/// Requires a float dtype the evaluator computes with (everything but the 6-bit floats).
pub(crate) fn require_float(t: &Tensor, what: &str) -> Res<()> {
    if !t.dtype.is_float() {
        bail!("{what} must be a float tensor, got {}", t.dtype);
    }
    Ok(())
}

pub use einsum::{parse_einsum, EinsumError, EinsumSpec};

#[cfg(test)]
mod test_util;

#[cfg(test)]
mod tests {
    use super::test_util::*;
    use super::*;
    use crate::attr::Attr;
    use crate::op::VOCABULARY;

    /// Small, awkward tensors: scalars, empties, bools, strings, huge integers.
    fn samples() -> Vec<Tensor> {
        vec![
            f32t(&[], &[1.5]),
            f32t(&[2, 3], &[1.0, -2.0, 0.5, f32::NAN, 4.0, -0.0]),
            f32t(&[0, 3], &[]),
            f32t(&[1, 2, 2, 4], &pattern(16, 1)),
            i64t(&[2], &[1, -1]),
            i64t(&[3], &[2, 3, 4]),
            i64t(&[2], &[i64::MAX, i64::MIN]),
            typed(DType::I32, &[], &[3]),
            typed(DType::U8, &[2, 2, 8], &byte_pattern(32, 1)),
            booleans(&[2], &[true, false]),
            Tensor { dtype: DType::Str, shape: vec![1], data: Data::Str(vec![b"x".to_vec()]) },
            Tensor::from_f32(DType::F16, vec![1, 4], vec![1.0, 2.0, 3.0, 4.0]),
        ]
    }

    #[test]
    fn malformed_onnx_and_contrib_inputs_give_errors_naming_the_node_never_panics() {
        let typical = attrs(&[
            ("to", Attr::Int(7)),
            ("axis", Attr::Int(-1)),
            ("K", Attr::Int(4)),
            ("N", Attr::Int(2)),
            ("block_size", Attr::Int(16)),
            ("num_heads", Attr::Int(2)),
            ("kv_num_heads", Attr::Int(1)),
            ("q_num_heads", Attr::Int(2)),
            ("value_int", Attr::Int(1)),
            ("perm", Attr::Ints(vec![1, 0])),
            ("is_causal", Attr::Int(1)),
            ("do_rotary", Attr::Int(1)),
            ("equation", Attr::Str("i...j".into())),
            ("mode", Attr::Str("reflect".into())),
            ("reduction", Attr::Str("add".into())),
            ("k", Attr::Int(2)),
        ]);
        let empty = Attrs::default();
        let samples = samples();
        let mut failures = vec![];
        // npuc's fused ops are defined and checked by `crate::fused`.
        for spec in VOCABULARY.iter().filter(|s| s.domain != Domain::Npuc) {
            let arities = [spec.min_inputs, spec.max_inputs.min(spec.min_inputs + 6)];
            let outputs = [spec.min_outputs, spec.max_outputs.min(4)];
            for attrs in [&empty, &typical] {
                for &arity in &arities {
                    for &num_outputs in &outputs {
                        for rotation in 0..samples.len() {
                            for stride in [0, 1, 5] {
                                let inputs: Vec<Option<&Tensor>> = (0..arity)
                                    .map(|i| Some(&samples[(rotation + i * stride) % samples.len()]))
                                    .collect();
                                let op = OpRef { node: "n", domain: spec.domain, op: spec.name, opset: 23, attrs };
                                let outcome = std::panic::catch_unwind(|| eval_op(&op, &inputs, num_outputs));
                                match outcome {
                                    Err(_) => failures.push(format!("{} panicked on {:?}", spec.name, inputs)),
                                    Ok(Ok(out)) => {
                                        let bad =
                                            out.len() != num_outputs || out.iter().any(|t| check_storage(t).is_err());
                                        if bad {
                                            failures.push(format!("{} produced malformed outputs {out:?}", spec.name));
                                        }
                                    }
                                    Ok(Err(e)) => {
                                        if e.node != "n" || e.op != spec.name || e.msg.is_empty() {
                                            failures.push(format!("{} gave an unattributed error {e:?}", spec.name));
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        assert!(failures.is_empty(), "{} failures, first: {:#?}", failures.len(), &failures[..failures.len().min(5)]);
    }

    #[test]
    fn unknown_ops_and_arity_violations_are_errors() {
        let a = Attrs::default();
        let x = f32t(&[1], &[1.0]);
        let op = OpRef { node: "n", domain: Domain::Onnx, op: "Conv", opset: 23, attrs: &a };
        assert!(eval_op(&op, &[Some(&x)], 1).unwrap_err().msg.contains("not in the vocabulary"));
        let op = OpRef { node: "n", domain: Domain::Onnx, op: "Relu", opset: 23, attrs: &a };
        assert!(eval_op(&op, &[Some(&x), Some(&x)], 1).unwrap_err().msg.contains("at most 1"));
        assert!(eval_op(&op, &[Some(&x)], 2).unwrap_err().msg.contains("outputs requested"));
        assert!(eval_op(&op, &[None], 1).unwrap_err().msg.contains("required input 0"));
        let malformed = Tensor { dtype: DType::F32, shape: vec![2], data: Data::I64(vec![1, 2]) };
        assert!(eval_op(&op, &[Some(&malformed)], 1).unwrap_err().msg.contains("mismatched storage"));
        let e = eval_op(&op, &[Some(&x)], 1).map(|v| v.len());
        assert_eq!(e, Ok(1));
    }
}

//! The op vocabulary npuc imports: every op a Llama/Qwen3 decoder exported by torch/optimum,
//! onnxruntime-genai, onnxruntime's quantize_static or AMD Quark contains, and the small ops that
//! sampling, scoring and adapter graphs put around a decoder (TopK, LogSoftmax, Hardmax, Pad,
//! Einsum, ScatterElements, the variadic Sum/Mean, the remaining reductions and the
//! classification losses), each checked
//! against ONNX's backend node tests. An op outside this table is an import error, never a silent
//! skip.

use crate::attr::Attrs;
use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Domain {
    /// `ai.onnx`, spelled "" in files.
    Onnx,
    /// `com.microsoft`, onnxruntime's contrib ops.
    Microsoft,
    /// `npuc`: the fused ops the rewrites produce. Never read from a model file.
    Npuc,
}

impl Domain {
    /// The domain for its spelling in a model file.
    pub fn parse(s: &str) -> Option<Domain> {
        match s {
            "" | "ai.onnx" => Some(Domain::Onnx),
            "com.microsoft" => Some(Domain::Microsoft),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Domain::Onnx => "ai.onnx",
            Domain::Microsoft => "com.microsoft",
            Domain::Npuc => "npuc",
        }
    }
}

impl fmt::Display for Domain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Arity of one op: how many inputs and outputs a node may have (`MANY` for variadic).
#[derive(Clone, Copy, Debug)]
pub struct OpSpec {
    pub domain: Domain,
    pub name: &'static str,
    pub min_inputs: usize,
    pub max_inputs: usize,
    pub min_outputs: usize,
    pub max_outputs: usize,
}

pub const MANY: usize = usize::MAX;

const fn spec(domain: Domain, name: &'static str, inputs: (usize, usize), outputs: (usize, usize)) -> OpSpec {
    OpSpec { domain, name, min_inputs: inputs.0, max_inputs: inputs.1, min_outputs: outputs.0, max_outputs: outputs.1 }
}

use Domain::{Microsoft as MS, Npuc as NP, Onnx as ON};

#[rustfmt::skip]
pub static VOCABULARY: &[OpSpec] = &[
    // Elementwise arithmetic and comparison, numpy broadcasting.
    spec(ON, "Add",            (2, 2), (1, 1)),
    spec(ON, "Sub",            (2, 2), (1, 1)),
    spec(ON, "Mul",            (2, 2), (1, 1)),
    spec(ON, "Div",            (2, 2), (1, 1)),
    spec(ON, "Pow",            (2, 2), (1, 1)),
    spec(ON, "Mod",            (2, 2), (1, 1)),
    spec(ON, "Max",            (1, MANY), (1, 1)),
    spec(ON, "Min",            (1, MANY), (1, 1)),
    spec(ON, "Sum",            (1, MANY), (1, 1)),
    spec(ON, "Mean",           (1, MANY), (1, 1)),
    spec(ON, "Equal",          (2, 2), (1, 1)),
    spec(ON, "Less",           (2, 2), (1, 1)),
    spec(ON, "LessOrEqual",    (2, 2), (1, 1)),
    spec(ON, "Greater",        (2, 2), (1, 1)),
    spec(ON, "GreaterOrEqual", (2, 2), (1, 1)),
    spec(ON, "And",            (2, 2), (1, 1)),
    spec(ON, "Or",             (2, 2), (1, 1)),
    spec(ON, "Xor",            (2, 2), (1, 1)),
    spec(ON, "Where",          (3, 3), (1, 1)),
    // Elementwise unary.
    spec(ON, "Neg",            (1, 1), (1, 1)),
    spec(ON, "Abs",            (1, 1), (1, 1)),
    spec(ON, "Sqrt",           (1, 1), (1, 1)),
    spec(ON, "Reciprocal",     (1, 1), (1, 1)),
    spec(ON, "Exp",            (1, 1), (1, 1)),
    spec(ON, "Log",            (1, 1), (1, 1)),
    spec(ON, "Sin",            (1, 1), (1, 1)),
    spec(ON, "Cos",            (1, 1), (1, 1)),
    spec(ON, "Tanh",           (1, 1), (1, 1)),
    spec(ON, "Erf",            (1, 1), (1, 1)),
    spec(ON, "Sigmoid",        (1, 1), (1, 1)),
    spec(ON, "Gelu",           (1, 1), (1, 1)),
    spec(ON, "Softplus",       (1, 1), (1, 1)),
    spec(ON, "Relu",           (1, 1), (1, 1)),
    spec(ON, "Floor",          (1, 1), (1, 1)),
    spec(ON, "Ceil",           (1, 1), (1, 1)),
    spec(ON, "Round",          (1, 1), (1, 1)),
    spec(ON, "Not",            (1, 1), (1, 1)),
    spec(ON, "IsNaN",          (1, 1), (1, 1)),
    spec(ON, "IsInf",          (1, 1), (1, 1)),
    spec(ON, "Identity",       (1, 1), (1, 1)),
    spec(ON, "Cast",           (1, 1), (1, 1)),
    spec(ON, "CastLike",       (2, 2), (1, 1)),
    spec(ON, "Clip",           (1, 3), (1, 1)),
    // Linear algebra.
    spec(ON, "MatMul",         (2, 2), (1, 1)),
    spec(ON, "Gemm",           (2, 3), (1, 1)),
    spec(ON, "MatMulInteger",  (2, 4), (1, 1)),
    spec(ON, "Einsum",         (1, MANY), (1, 1)),
    // Reductions and normalisations.
    spec(ON, "Softmax",        (1, 1), (1, 1)),
    spec(ON, "LogSoftmax",     (1, 1), (1, 1)),
    spec(ON, "Hardmax",        (1, 1), (1, 1)),
    spec(ON, "ReduceMean",     (1, 2), (1, 1)),
    spec(ON, "ReduceSum",      (1, 2), (1, 1)),
    spec(ON, "ReduceMax",      (1, 2), (1, 1)),
    spec(ON, "ReduceMin",      (1, 2), (1, 1)),
    spec(ON, "ReduceProd",     (1, 2), (1, 1)),
    spec(ON, "ReduceL1",       (1, 2), (1, 1)),
    spec(ON, "ReduceL2",       (1, 2), (1, 1)),
    spec(ON, "ReduceSumSquare", (1, 2), (1, 1)),
    spec(ON, "ReduceLogSum",   (1, 2), (1, 1)),
    spec(ON, "ReduceLogSumExp", (1, 2), (1, 1)),
    spec(ON, "ArgMax",         (1, 1), (1, 1)),
    spec(ON, "ArgMin",         (1, 1), (1, 1)),
    spec(ON, "TopK",           (1, 2), (2, 2)),
    spec(ON, "NegativeLogLikelihoodLoss", (2, 3), (1, 1)),
    spec(ON, "SoftmaxCrossEntropyLoss",   (2, 3), (1, 2)),
    spec(ON, "CumSum",         (2, 2), (1, 1)),
    spec(ON, "LayerNormalization",          (2, 3), (1, 3)),
    spec(ON, "SimplifiedLayerNormalization", (2, 2), (1, 2)),
    spec(ON, "RMSNormalization",            (2, 2), (1, 1)),
    spec(ON, "LpNormalization",             (1, 1), (1, 1)),
    // Shape and data movement.
    spec(ON, "Shape",          (1, 1), (1, 1)),
    spec(ON, "Size",           (1, 1), (1, 1)),
    spec(ON, "Reshape",        (2, 2), (1, 1)),
    spec(ON, "Flatten",        (1, 1), (1, 1)),
    spec(ON, "Transpose",      (1, 1), (1, 1)),
    spec(ON, "Unsqueeze",      (1, 2), (1, 1)),
    spec(ON, "Squeeze",        (1, 2), (1, 1)),
    spec(ON, "Concat",         (1, MANY), (1, 1)),
    spec(ON, "Split",          (1, 2), (1, MANY)),
    spec(ON, "Slice",          (3, 5), (1, 1)),
    spec(ON, "Gather",         (2, 2), (1, 1)),
    spec(ON, "GatherElements", (2, 2), (1, 1)),
    spec(ON, "GatherND",       (2, 2), (1, 1)),
    spec(ON, "ScatterND",      (3, 3), (1, 1)),
    spec(ON, "ScatterElements", (3, 3), (1, 1)),
    spec(ON, "Pad",            (1, 4), (1, 1)),
    spec(ON, "Expand",         (2, 2), (1, 1)),
    spec(ON, "Tile",           (2, 2), (1, 1)),
    spec(ON, "Range",          (3, 3), (1, 1)),
    spec(ON, "ConstantOfShape", (1, 1), (1, 1)),
    spec(ON, "Constant",       (0, 0), (1, 1)),
    spec(ON, "Trilu",          (1, 2), (1, 1)),
    // Quantisation.
    spec(ON, "QuantizeLinear",        (2, 3), (1, 1)),
    spec(ON, "DequantizeLinear",      (2, 3), (1, 1)),
    spec(ON, "DynamicQuantizeLinear", (1, 1), (3, 3)),
    // Fused transformer ops of opset 23.
    spec(ON, "RotaryEmbedding", (3, 4), (1, 1)),
    spec(ON, "Attention",       (3, 7), (1, 4)),
    // Recurrent layers of hybrid decoders, opset 27.
    spec(ON, "LinearAttention",     (3, 6), (1, 2)),
    spec(ON, "CausalConvWithState", (2, 4), (1, 2)),
    // onnxruntime contrib ops.
    spec(MS, "MatMulNBits",                      (3, 6), (1, 1)),
    spec(MS, "GroupQueryAttention",              (7, 12), (1, 4)),
    spec(MS, "SkipSimplifiedLayerNormalization", (3, 4), (1, 4)),
    spec(MS, "SimplifiedLayerNormalization",     (2, 2), (1, 2)),
    spec(MS, "GatherBlockQuantized",             (3, 4), (1, 1)),
    spec(MS, "RotaryEmbedding",                  (4, 4), (1, 1)),
    spec(MS, "QuantizeLinear",                   (2, 3), (1, 1)),
    spec(MS, "DequantizeLinear",                 (2, 3), (1, 1)),
    // Hybrid recurrent layers (Qwen3.5's Gated DeltaNet, LFM2's short convolutions).
    spec(MS, "LinearAttention",                  (3, 6), (1, 2)),
    spec(MS, "LinearAttentionGate",              (3, 4), (1, 2)),
    spec(MS, "CausalConvWithState",              (2, 4), (1, 2)),
    spec(MS, "GatedRMSNorm",                     (3, 3), (1, 1)),
    // Qwen3.5's multimodal rotary embedding, which the builder uses for text too.
    spec(MS, "MRotaryEmbedding",                 (4, 4), (1, 1)),
    // Mixture of experts (gpt-oss, Qwen3.5-MoE, LFM2-MoE).
    spec(MS, "GatedAdd",                         (3, 4), (1, 1)),
    spec(MS, "MoE",                              (5, 8), (1, 1)),
    spec(MS, "QMoE",                             (6, 14), (1, 1)),
    // npuc's fused ops (see `crate::fused` for their exact semantics).
    spec(NP, "RmsNorm",     (2, 2), (1, 1)),
    spec(NP, "SkipRmsNorm", (3, 4), (1, 2)),
    spec(NP, "Silu",        (1, 1), (1, 1)),
    spec(NP, "SwiGlu",      (2, 2), (1, 1)),
    spec(NP, "GeluTanh",    (1, 1), (1, 1)),
    spec(NP, "GeluGate",    (2, 2), (1, 1)),
    spec(NP, "Rope",        (3, 3), (1, 1)),
    spec(NP, "QGemm",       (6, 8), (1, 1)),
    spec(NP, "WGemm",       (3, 5), (1, 1)),
    spec(NP, "Attention",   (3, 6), (1, 3)),
    // Hybrid decoders' recurrent layers (the `delta-net` and `causal-conv` rule families).
    spec(NP, "DeltaNet",    (6, 6), (1, 2)),
    spec(NP, "CausalConv",  (4, 4), (1, 2)),
    // Mixtures of experts (the `moe` rule family).
    spec(NP, "Moe",         (8, 10), (1, 1)),
    // fp16 targets' row-scaled forms (the `fp16-rescale` rule family).
    spec(NP, "RmsNormRowScaled",     (2, 2), (1, 1)),
    spec(NP, "SkipRmsNormRowScaled", (3, 4), (1, 2)),
    spec(NP, "WGemmRowScaled",       (3, 4), (1, 1)),
    spec(NP, "L2NormRowScaled",      (1, 1), (1, 1)),
    spec(NP, "GatedRmsNormRowScaled", (3, 3), (1, 1)),
    // Dynamic symmetric int8 quantisation of activation rows (the xdna array's numerics).
    spec(NP, "QuantizeRows",         (1, 2), (2, 2)),
    // SwiGlu in integers, quantised as QuantizeRows(x, γ)'s products (the xdna gate).
    spec(NP, "QuantizeSwiGlu",       (2, 2), (2, 2)),
    // A norm's 1/rms per row, which the xdna program folds into the row scales.
    spec(NP, "InverseRms",           (1, 1), (1, 1)),
];

/// The vocabulary entry for an op, if npuc knows it.
pub fn lookup(domain: Domain, name: &str) -> Option<&'static OpSpec> {
    VOCABULARY.iter().find(|s| s.domain == domain && s.name == name)
}

/// What the evaluator and shape inference need to know about one node besides its inputs.
#[derive(Clone, Copy, Debug)]
pub struct OpRef<'a> {
    /// The node's name, for error messages.
    pub node: &'a str,
    pub domain: Domain,
    pub op: &'a str,
    /// The opset version of the node's domain imported by the model.
    pub opset: i64,
    pub attrs: &'a Attrs,
}

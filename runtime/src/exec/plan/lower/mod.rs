//! Lowering the program's nodes into the plan's ops, in program order: each op the executor runs
//! has one lowering in [`LOWERINGS`] (aliases aside), which checks the node, gives its outputs
//! places and pushes its [`Op`]. A [`Builder`] holds the plan as it stands.
//!
//! - `float`: f32 ops (gathers, MatMul, layout copies, norms, RoPE, gated products, element-wise
//!   arithmetic, attention);
//! - `quantised`: 4-bit weight-only ops (WGemm, GatherBlockQuantized) and A8W8 ops
//!   (QuantizeLinear, QuantizeRows, DequantizeLinear, QGemm);
//! - `integer`: shape and position arithmetic on small i64 tensors;
//! - `recurrent`: hybrid decoders' recurrent layers (their states in the sequence's slots) and
//!   their gates, norms and M-RoPE.
//!
//! Gather, Add, Mul and Concat exist as f32 and as integer ops: their lowerings here pick one by
//! the node's types.

mod float;
mod integer;
mod moe;
mod quantised;
mod recurrent;
mod router;

use std::collections::HashMap;

use super::weights::{load_packed, Layouts, Stored, WeightLookup};
use super::{AttentionShape, Loc, MoeExperts, NBitsTable, Op, QGemmStore, StateSlot, Uses, WGemmStore, ALIAS_OPS};
use crate::bundle::TensorView;
use crate::exec::error::{node_err, node_fail, ExecError};
use crate::exec::packed::WGemmLayout;
use crate::exec::program::{ElemType, NodeInfo, Program, ValueInfo};

/// The lowering of one node (its index and the node) into the plan being built.
type Lower = fn(&mut Builder<'_, '_>, usize, &NodeInfo) -> Result<(), ExecError>;

/// Every op the executor computes, and its lowering.
const LOWERINGS: [(&str, Lower); 48] = [
    ("ai.onnx::Gather", gather),
    ("ai.onnx::MatMul", float::matmul),
    ("ai.onnx::Transpose", float::transpose),
    ("ai.onnx::Slice", slice),
    ("ai.onnx::Concat", concat),
    ("ai.onnx::Add", add_or_mul),
    ("ai.onnx::Mul", add_or_mul),
    ("ai.onnx::Sub", integer::arithmetic),
    ("ai.onnx::Range", integer::arithmetic),
    ("ai.onnx::Shape", integer::shape),
    ("npuc::RmsNorm", float::rms_norm),
    ("npuc::SkipRmsNorm", float::skip_rms_norm),
    ("npuc::InverseRms", float::inverse_rms),
    ("npuc::Rope", float::rope),
    ("npuc::SwiGlu", float::gate),
    ("npuc::GeluGate", float::gate),
    ("npuc::Attention", float::attention),
    ("npuc::WGemm", quantised::wgemm),
    ("com.microsoft::GatherBlockQuantized", quantised::gather_block_quantized),
    ("ai.onnx::QuantizeLinear", quantised::quantize_linear),
    ("npuc::QuantizeRows", quantised::quantize_rows),
    ("npuc::QuantizeSwiGlu", quantised::quantize_rows),
    ("ai.onnx::DequantizeLinear", quantised::dequantize_linear),
    ("npuc::QGemm", quantised::qgemm),
    ("npuc::CausalConv", recurrent::causal_conv),
    ("npuc::DeltaNet", recurrent::delta_net),
    ("com.microsoft::CausalConvWithState", recurrent::causal_conv),
    ("com.microsoft::LinearAttention", recurrent::linear_attention),
    ("com.microsoft::LinearAttentionGate", recurrent::linear_attention_gate),
    ("com.microsoft::GatedRMSNorm", recurrent::gated_rms_norm),
    ("com.microsoft::GatedAdd", recurrent::gated_add),
    ("com.microsoft::MRotaryEmbedding", recurrent::m_rotary_embedding),
    ("ai.onnx::LpNormalization", recurrent::lp_normalization),
    ("ai.onnx::Sigmoid", recurrent::sigmoid),
    ("npuc::Moe", moe::fused_moe),
    ("com.microsoft::MoE", moe::moe),
    ("com.microsoft::QMoE", moe::qmoe),
    ("ai.onnx::Neg", router::unary),
    ("ai.onnx::Exp", router::unary),
    ("ai.onnx::Reciprocal", router::unary),
    ("ai.onnx::Log", router::unary),
    ("ai.onnx::Clip", router::unary),
    ("ai.onnx::Div", router::div),
    ("ai.onnx::ReduceSum", router::reduce_sum),
    ("ai.onnx::TopK", router::top_k),
    ("ai.onnx::GatherElements", router::elements),
    ("ai.onnx::ScatterElements", router::elements),
    ("ai.onnx::ConstantOfShape", router::constant_of_shape),
];

/// The lowering of `op` (`domain::op`), or `None` for an op the executor does not run.
pub(super) fn lowering(op: &str) -> Option<Lower> {
    if ALIAS_OPS.contains(&op) {
        return Some(alias);
    }
    LOWERINGS.iter().find(|(name, _)| *name == op).map(|&(_, lower)| lower)
}

/// What the lowering reads: the program, the bundle's weights, who uses each value, the packed
/// layouts the bundle holds, the attention geometry and the logits value.
pub(super) struct Context<'p, 'b> {
    pub program: &'p Program,
    pub weight: &'p WeightLookup<'p, 'b>,
    pub uses: &'p Uses,
    pub layouts: &'p Layouts,
    pub attention: Option<AttentionShape>,
    /// The sequence's recurrent state slots (`bind::recurrent_states`).
    pub states: &'p [StateSlot],
    pub logits: usize,
}

/// The plan as the lowering builds it.
pub(super) struct Builder<'p, 'b> {
    cx: Context<'p, 'b>,
    values: &'p [ValueInfo],
    locs: Vec<Loc>,
    weights: Vec<&'b [f32]>,
    views: Vec<TensorView<'b>>,
    consts_f32: Vec<Vec<f32>>,
    consts_i64: Vec<Vec<i64>>,
    ops: Vec<(usize, Op)>,
    /// The next Attention node's layer.
    layer: usize,
    /// Storage roots of buffer-held values (shared by liveness later).
    roots: usize,
    i64_buffers: usize,
    q_buffers: usize,
    packed: Vec<WGemmStore<'b>>,
    /// The [`Builder::packed`] index of weights read in place, by the name they were packed from.
    mapped_index: HashMap<String, usize>,
    nbits_tables: Vec<NBitsTable<'b>>,
    qpacked: Vec<QGemmStore<'b>>,
    /// Codes of QuantizeLinear nodes folded at load, with their signedness.
    folded: Vec<(Vec<u8>, bool)>,
    moe: Vec<MoeExperts<'b>>,
}

/// What the lowering built.
pub(super) struct Lowered<'b> {
    pub locs: Vec<Loc>,
    pub ops: Vec<(usize, Op)>,
    pub weights: Vec<&'b [f32]>,
    pub packed: Vec<WGemmStore<'b>>,
    pub nbits_tables: Vec<NBitsTable<'b>>,
    pub qpacked: Vec<QGemmStore<'b>>,
    pub consts_f32: Vec<Vec<f32>>,
    pub consts_i64: Vec<Vec<i64>>,
    pub roots: usize,
    pub i64_buffers: usize,
    pub q_buffers: usize,
    pub moe: Vec<MoeExperts<'b>>,
}

/// Lowers every node in program order, starting from the weights and constants in `stored`;
/// storage roots below `first_root` are taken (graph inputs the caller fills).
pub(super) fn lower_nodes<'b>(
    cx: Context<'_, 'b>,
    stored: Stored<'b>,
    first_root: usize,
) -> Result<Lowered<'b>, ExecError> {
    let program = cx.program;
    let mut b = Builder {
        values: &program.values,
        cx,
        locs: stored.locs,
        weights: stored.weights,
        views: stored.views,
        consts_f32: stored.consts_f32,
        consts_i64: stored.consts_i64,
        ops: Vec::new(),
        layer: 0,
        roots: first_root,
        i64_buffers: 0,
        q_buffers: 0,
        packed: Vec::new(),
        mapped_index: HashMap::new(),
        nbits_tables: Vec::new(),
        qpacked: Vec::new(),
        folded: Vec::new(),
        moe: Vec::new(),
    };
    for (n, node) in program.nodes.iter().enumerate() {
        let lower = lowering(&node.op)
            .ok_or_else(|| ExecError::UnsupportedOp { node: node.name.clone(), op: node.op.clone() })?;
        lower(&mut b, n, node)?;
    }
    Ok(Lowered {
        locs: b.locs,
        ops: b.ops,
        weights: b.weights,
        packed: b.packed,
        nbits_tables: b.nbits_tables,
        qpacked: b.qpacked,
        consts_f32: b.consts_f32,
        consts_i64: b.consts_i64,
        roots: b.roots,
        i64_buffers: b.i64_buffers,
        q_buffers: b.q_buffers,
        moe: b.moe,
    })
}

impl<'b> Builder<'_, 'b> {
    /// The [`Builder::packed`] index of weights the bundle holds packed as `layout` says, read
    /// in place once however many nodes read them.
    fn mapped_wgemm(&mut self, layout: &WGemmLayout) -> Result<usize, ExecError> {
        if let Some(&i) = self.mapped_index.get(&layout.source) {
            return Ok(i);
        }
        self.packed.push(WGemmStore::Mapped(load_packed(self.cx.weight, layout)?));
        self.mapped_index.insert(layout.source.clone(), self.packed.len() - 1);
        Ok(self.packed.len() - 1)
    }
}

/// Input `slot` of `node`, which must be present.
fn input(node: &NodeInfo, slot: usize) -> Result<usize, ExecError> {
    node.input(slot).ok_or_else(|| node_err(&node.name, &node.op, format!("input {slot} is missing")))
}

/// Output `i` of `node`, which must be present.
fn output(node: &NodeInfo, i: usize) -> Result<usize, ExecError> {
    node.outputs.get(i).copied().ok_or_else(|| node_err(&node.name, &node.op, format!("output {i} is missing")))
}

impl<'b> Builder<'_, 'b> {
    /// Input `slot` of `node` as an f32 tensor the executor holds.
    fn f32_input(&self, node: &NodeInfo, slot: usize) -> Result<usize, ExecError> {
        let fail = node_fail(node);
        let v = input(node, slot)?;
        let values = self.values;
        if values[v].elem != Some(ElemType::F32) {
            return Err(fail(format!(
                "input {slot} (`{}`) has dtype {}; the host executor runs float programs",
                values[v].name, values[v].dtype
            )));
        }
        if matches!(self.locs[v], Loc::Unused | Loc::Cache | Loc::Ids | Loc::Positions | Loc::ConstI64(_)) {
            return Err(fail(format!("input {slot} (`{}`) is not a tensor the executor holds", values[v].name)));
        }
        Ok(v)
    }

    /// `v` gets a buffer of its own (shared by liveness later).
    fn fresh(&mut self, v: usize) {
        self.locs[v] = Loc::Buf(self.roots);
        self.roots += 1;
    }

    /// `v` gets a small i64 buffer.
    fn fresh_i64(&mut self, v: usize) {
        self.locs[v] = Loc::I64Buf(self.i64_buffers);
        self.i64_buffers += 1;
    }

    /// `v` gets a code buffer.
    fn fresh_q(&mut self, v: usize) {
        self.locs[v] = Loc::QBuf(self.q_buffers);
        self.q_buffers += 1;
    }

    fn push(&mut self, n: usize, op: Op) {
        self.ops.push((n, op));
    }

    /// A weight read in place, added for an op to read; its index.
    fn add_weight(&mut self, floats: &'b [f32], view: TensorView<'b>) -> usize {
        self.weights.push(floats);
        self.views.push(view);
        self.weights.len() - 1
    }

    /// Whether only the last row of `o` is needed: it is the logits and nothing reads it.
    fn last_row_only(&self, o: usize) -> bool {
        o == self.cx.logits && self.cx.uses.consumers[o].is_empty()
    }

    /// The fixed sizes of `v`'s shape (`None` for a symbolic one).
    fn dims(&self, v: usize) -> Vec<Option<usize>> {
        self.values[v].shape.iter().map(|d| d.as_const()).collect()
    }
}

/// Reshape, Unsqueeze, Squeeze, Flatten, Identity: the output is the input, in place.
fn alias(b: &mut Builder<'_, '_>, _: usize, node: &NodeInfo) -> Result<(), ExecError> {
    let x = input(node, 0)?;
    b.locs[output(node, 0)?] = b.locs[x];
    Ok(())
}

/// Gather of rows (axis 0): integer data is shape arithmetic, f32 data a table.
fn gather(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    let axis = node.attr_i64("axis").unwrap_or(0);
    if axis != 0 {
        return Err(node_fail(node)(format!("gathers along axis {axis}; the executor gathers rows (axis 0)")));
    }
    if b.values[input(node, 0)?].elem == Some(ElemType::I64) {
        return integer::gather(b, n, node);
    }
    float::gather(b, n, node)
}

/// Add and Mul of f32 tensors (one operand repeating over the other's rows), or of integers.
fn add_or_mul(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    if b.values[output(node, 0)?].elem == Some(ElemType::F32) {
        if node.op == "ai.onnx::Mul" {
            if let Some((x, scale)) = router::row_scale_operands(b, node)? {
                return router::row_scale(b, n, node, x, scale);
            }
        }
        return float::binary(b, n, node);
    }
    integer::arithmetic(b, n, node)
}

/// Slice of an integer vector, or of an f32 tensor.
fn slice(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    if b.values[input(node, 0)?].elem == Some(ElemType::I64) {
        return integer::slice(b, n, node);
    }
    float::slice(b, n, node)
}

/// Concat of integer vectors, or of f32 tensors.
fn concat(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    if b.values[output(node, 0)?].elem == Some(ElemType::I64) {
        return integer::concat(b, n, node);
    }
    float::concat(b, n, node)
}

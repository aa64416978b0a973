//! Loading a program into a plan: where every value lives (a buffer, a weight, a constant, the
//! step's token ids or positions, a small i64 buffer, or the KV cache), one [`Op`] per node that
//! computes something, and buffers shared by values whose lifetimes do not overlap. WGemm weights
//! are read in place when the bundle holds them packed (see `packed.rs`), and packed here from the
//! MatMulNBits layout otherwise; so are QGemm weight codes (packed here from their `[K, N]` codes
//! otherwise); i64 weights (shape operands stored as raw bytes) become constants.
//!
//! [`Plan::load`] runs the stages in order, each refusing what it cannot place with an error that
//! names the node or value:
//!
//! - `weights`: the packed layouts the bundle holds, then a place for every weight and constant;
//! - `bind`: Attention nodes, the graph inputs and the logits bound to the cache and the step,
//!   and the recurrent layers' past/present states to the sequence's state slots;
//! - `lower`: one lowering per op, from a table, in program order (`lower::float`,
//!   `lower::quantised`, `lower::integer`);
//! - `buffers`: buffers shared by liveness.

mod bind;
mod buffers;
mod lower;
mod weights;

use std::borrow::Cow;

use crate::bundle::TensorView;
use crate::kernels::gemm::WeightLayout;
use crate::kernels::qgemm::QGemmWeights;
use crate::kernels::swiglu::GateActivation;
use crate::kernels::wgemm::{MatMulNBits, PackedWGemm, WGemmWeights};
use crate::kvcache::Scoring;

use super::error::{value_err, ExecError};
use super::program::{NodeInfo, Program};

/// Where a value's elements are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loc {
    /// A buffer of the executor (f32).
    Buf(usize),
    /// A weight of the bundle, as stored.
    Weight(usize),
    /// The transpose of a 2-D weight, read in place by MatMul and Gather (never materialised).
    WeightT(usize),
    /// The transpose of a 2-D weight the bundle holds only as f32 GEMM panels (index into
    /// [`Plan::weights`]), read in place by Gather: a tied embedding that is the lm_head's `[K, N]`
    /// weight transposed.
    PanelsT(usize),
    ConstF32(usize),
    ConstI64(usize),
    /// A small integer tensor computed at run time (shape and position arithmetic).
    I64Buf(usize),
    /// Quantised codes (u8, or i8 stored as their bytes) computed at run time: one buffer per
    /// value, never shared.
    QBuf(usize),
    /// Quantised codes folded from weights at load (QuantizeLinear of a weight); read only by
    /// the QGemm packing at load.
    ConstQ(usize),
    /// The step's token ids (`input_ids`).
    Ids,
    /// The step's positions (`position_ids`).
    Positions,
    /// Held by the KV cache: past and present keys and values, the attention mask.
    Cache,
    /// A recurrent state slot of the step's sequence ([`Plan::states`]): the past state input
    /// and the present state output of one CausalConvWithState or LinearAttention node, updated
    /// in place.
    State(usize),
    /// Computed by no op the executor runs and read by none (e.g. a shape operand).
    Unused,
}

/// The activation passes a `QGemm{passes}` reads: the first `read` of the `stacked` passes its
/// activation holds, each output row their sum in pass order, except the last
/// `first_pass_columns` columns, which keep the first pass's product (a weight's residual pass
/// beside the weight it refines).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StackedPasses {
    pub read: usize,
    pub stacked: usize,
    pub first_pass_columns: usize,
}

/// One node that computes something. Values are program value indices.
#[derive(Clone, Debug)]
pub enum Op {
    Gather {
        data: usize,
        ids: usize,
        out: usize,
    },
    /// Rows of a transposed `[K, N]` weight (columns of W), read in place: `table` is the weight
    /// (`KN`) or its panels (`Panels`) in [`Plan::weights`]; each id gives `k` values.
    GatherColumns {
        table: usize,
        layout: WeightLayout,
        k: usize,
        n: usize,
        ids: usize,
        out: usize,
    },
    MatMul {
        a: usize,
        w: usize,
        /// The weight's panels in [`Plan::weights`] when the bundle holds it packed.
        panels: Option<usize>,
        layout: WeightLayout,
        k: usize,
        n: usize,
        out: usize,
        last_row_only: bool,
    },
    Transpose {
        x: usize,
        perm: Vec<usize>,
        out: usize,
    },
    RmsNorm {
        x: usize,
        gamma: usize,
        eps: f32,
        out: usize,
    },
    /// `npuc::InverseRms`: one `1/rms` a row of `d` values.
    InverseRms {
        x: usize,
        d: usize,
        eps: f32,
        squares: crate::kernels::norm::Squares,
        out: usize,
    },
    SkipRmsNorm {
        x: usize,
        skip: usize,
        gamma: usize,
        bias: Option<usize>,
        eps: f32,
        y: usize,
        sum: Option<usize>,
    },
    Rope {
        x: usize,
        cos: usize,
        sin: usize,
        interleaved: bool,
        out: usize,
    },
    /// A gated MLP product `act(gate) · up` (SwiGlu, GeluGate).
    Gate {
        gate: usize,
        up: usize,
        act: GateActivation,
        out: usize,
    },
    /// Float `a + b` (or `a · b` with `mul`) where one operand's values repeat over the other's
    /// rows (a bias `[N]` on a projection's `[.., N]`, the q/k/v biases of Qwen2, Gemma's
    /// embedding scale) or both have the same size.
    BinaryF32 {
        a: usize,
        b: usize,
        mul: bool,
        out: usize,
    },
    Attention {
        q: usize,
        k: usize,
        v: usize,
        layer: usize,
        /// The scale and window; the sinks are value `sinks`'s (one per query head), read at
        /// run time.
        scoring: Scoring<'static>,
        sinks: Option<usize>,
        out: usize,
    },
    /// MatMulNBits: `packed` indexes [`Plan::packed`].
    WGemm {
        a: usize,
        packed: usize,
        bias: Option<usize>,
        k: usize,
        n: usize,
        out: usize,
        last_row_only: bool,
        /// The node asks for int8 activations (`accuracy_level` 4), whatever the executor's
        /// precision otherwise.
        int8_activations: bool,
    },
    /// GatherBlockQuantized along axis 0: `table` indexes [`Plan::nbits_tables`].
    GatherNBits {
        table: usize,
        ids: usize,
        out: usize,
    },
    /// Slice of an f32 tensor; starts, ends, axes and steps are i64 values.
    Slice {
        x: usize,
        starts: usize,
        ends: usize,
        axes: Option<usize>,
        steps: Option<usize>,
        out: usize,
    },
    /// Concat of f32 tensors.
    Concat {
        inputs: Vec<usize>,
        axis: i64,
        out: usize,
    },
    /// QuantizeLinear of f32 activations with a per-tensor scale and zero point, into codes.
    Quantize {
        x: usize,
        scale: f32,
        zero_point: i32,
        signed: bool,
        out: usize,
    },
    /// DequantizeLinear of codes with a per-tensor scale and zero point.
    Dequantize {
        x: usize,
        scale: f32,
        zero_point: i32,
        signed: bool,
        out: usize,
    },
    /// `npuc::QuantizeRows`: f32 rows of `k` values into int8 codes (a [`Loc::QBuf`]) and one
    /// f32 scale per row (the power of two at or above max|row|/127, 1 for a row of zeros); when `stacked`, the codes and
    /// scales of the rounding residual x − codes·s follow the first pass's in the same buffers.
    QuantizeRows {
        x: usize,
        k: usize,
        codes: usize,
        scales: usize,
        stacked: bool,
        /// The values quantised: x's, `x·γ`'s or the integer gate's.
        values: RowValues,
    },
    /// `npuc::QGemm` over activation codes: `packed` indexes [`Plan::qpacked`]; `requant` is the
    /// output scale and zero point when the output is codes (then `out` is a [`Loc::QBuf`]).
    /// With `a_row_scales`, the activations' scale is that value (one per row) and `a_scale` is
    /// unused. With `passes`, the first passes' rows of a stacked activation are one call and
    /// each output row is their sum ([`StackedPasses`]).
    QGemm {
        a: usize,
        passes: Option<StackedPasses>,
        a_signed: bool,
        a_row_scales: Option<usize>,
        a_scale: f32,
        a_zero_point: i32,
        packed: usize,
        k: usize,
        n: usize,
        requant: Option<(f32, i32, bool)>,
        out: usize,
    },
    /// CausalConvWithState over `[1, channels, tokens]`, its `taps - 1` past inputs per channel
    /// held in state slot `state` and updated in place.
    CausalConv {
        x: usize,
        w: usize,
        bias: Option<usize>,
        state: usize,
        channels: usize,
        taps: usize,
        silu: bool,
        out: usize,
    },
    /// LinearAttention's recurrence over the tokens, its `[kv_heads, dk, dv]` state in slot
    /// `state`, updated in place.
    LinearAttention {
        q: usize,
        k: usize,
        v: usize,
        decay: Option<usize>,
        beta: Option<usize>,
        /// q and k divided per head by √(Σx² + ε) before the recurrence (DeltaNet's
        /// `qk_l2norm_eps`), into the executor's scratch.
        qk_l2norm_eps: Option<f32>,
        state: usize,
        heads: LinearHeads,
        scale: f32,
        out: usize,
    },
    /// LinearAttentionGate's decay, `scale[h] · softplus(a + bias[h])`.
    DecayGate {
        a: usize,
        bias: usize,
        scale: usize,
        out: usize,
    },
    /// Element-wise logistic sigmoid.
    Sigmoid {
        x: usize,
        out: usize,
    },
    /// GatedRMSNorm: rows of `γ`'s length normalised, scaled by `γ` and by `act(gate)`.
    GatedRmsNorm {
        x: usize,
        gamma: usize,
        gate: usize,
        eps: f32,
        silu: bool,
        out: usize,
    },
    /// LpNormalization with p = 2 over rows of `width` values.
    L2Norm {
        x: usize,
        width: usize,
        out: usize,
    },
    /// GatedAdd: `x + y · gate[row]`, one gate value per row.
    GatedAdd {
        x: usize,
        y: usize,
        gate: usize,
        out: usize,
    },
    /// MRotaryEmbedding of a text-only step: the three position streams are the step's
    /// positions, so every section reads the same cos/sin row (rotate-half over `2·half` of each
    /// head's `head` values).
    MRope {
        x: usize,
        cos: usize,
        sin: usize,
        heads: usize,
        head: usize,
        half: usize,
        out: usize,
    },
    /// MoE and QMoE: each token row routed to its top `k` experts ([`Plan::moe`]`[experts]`),
    /// only those computed, the tokens grouped per expert; npuc's Moe may add a shared expert's
    /// output rows gated by the sigmoid of their logits (`shared`: output, logits).
    Moe {
        x: usize,
        router: usize,
        experts: usize,
        mixing: MoeMixing,
        shared: Option<(usize, usize)>,
        out: usize,
    },
    /// An element-wise f32 function.
    Unary {
        x: usize,
        kind: UnaryKind,
        out: usize,
    },
    /// `a / b`, `b` repeating over `a`'s rows (or the same size).
    Div {
        a: usize,
        b: usize,
        out: usize,
    },
    /// `x · scale[row]`: Mul by one value per row (a `[.., 1]` operand).
    RowScale {
        x: usize,
        scale: usize,
        out: usize,
    },
    /// The sum of each row of `width` values.
    ReduceLast {
        x: usize,
        width: usize,
        out: usize,
    },
    /// The indices of each row's `k` largest values, largest first (ties to the lower index),
    /// into an [`Loc::I64Buf`].
    TopK {
        x: usize,
        width: usize,
        k: usize,
        out: usize,
    },
    /// GatherElements (no `updates`) or ScatterElements along the last axis, rows of `width`.
    Elements {
        data: usize,
        idx: usize,
        updates: Option<usize>,
        width: usize,
        out: usize,
    },
    /// ConstantOfShape: every element `value`.
    Fill {
        value: f32,
        out: usize,
    },
    /// Integer arithmetic on small i64 tensors, evaluated exactly into an [`Loc::I64Buf`].
    Int {
        kind: IntKind,
        inputs: Vec<usize>,
        out: usize,
    },
}

impl Op {
    /// The f32 buffer written by an op whose one output is plain f32 values sized by its shape
    /// (most ops; not the GEMMs with a last-row mode, the quantised and integer ops, or the
    /// norm that also writes its sum).
    pub(crate) fn float_output(&self) -> Option<&usize> {
        match self {
            Op::Gather { out, .. }
            | Op::GatherColumns { out, .. }
            | Op::Transpose { out, .. }
            | Op::RmsNorm { out, .. }
            | Op::InverseRms { out, .. }
            | Op::Rope { out, .. }
            | Op::Gate { out, .. }
            | Op::BinaryF32 { out, .. }
            | Op::CausalConv { out, .. }
            | Op::LinearAttention { out, .. }
            | Op::DecayGate { out, .. }
            | Op::Sigmoid { out, .. }
            | Op::GatedRmsNorm { out, .. }
            | Op::L2Norm { out, .. }
            | Op::GatedAdd { out, .. }
            | Op::MRope { out, .. }
            | Op::Moe { out, .. }
            | Op::Unary { out, .. }
            | Op::Div { out, .. }
            | Op::RowScale { out, .. }
            | Op::ReduceLast { out, .. }
            | Op::Elements { out, .. }
            | Op::Fill { out, .. }
            | Op::Attention { out, .. } => Some(out),
            Op::MatMul { .. }
            | Op::SkipRmsNorm { .. }
            | Op::WGemm { .. }
            | Op::GatherNBits { .. }
            | Op::Slice { .. }
            | Op::Concat { .. }
            | Op::Quantize { .. }
            | Op::Dequantize { .. }
            | Op::QuantizeRows { .. }
            | Op::QGemm { .. }
            | Op::TopK { .. }
            | Op::Int { .. } => None,
        }
    }
}

/// What a [`Op::QuantizeRows`] quantises of its f32 rows `x`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowValues {
    /// The rows themselves.
    X,
    /// The exact products `x·γ` (γ the value index, `k` values).
    TimesGamma(usize),
    /// SwiGlu in integers of the gate `x` and the up rows (the value index), exact.
    IntegerGate(usize),
}

/// The element-wise f32 functions of [`Op::Unary`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum UnaryKind {
    Neg,
    Exp,
    Reciprocal,
    Log,
    Clip { min: f32, max: f32 },
}

/// The integer ops of shape and position arithmetic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntKind {
    /// `start`/`end` attributes of Shape (end exclusive; `None` = the rank).
    Shape {
        start: i64,
        end: Option<i64>,
    },
    /// Gather along axis 0.
    Gather,
    Add,
    Sub,
    Mul,
    Range,
    /// Concat of rank-1 (or scalar) tensors.
    Concat,
    /// Slice of a rank-1 tensor: inputs data, starts, ends (one value each, axis 0, step 1).
    Slice,
}

/// A LinearAttention node's heads: query, key and state (value) heads, their sizes, and the
/// forms of decay and beta.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinearHeads {
    pub q_heads: usize,
    pub k_heads: usize,
    pub kv_heads: usize,
    pub dk: usize,
    pub dv: usize,
    /// Decay per key dimension (`[.., kv_heads·dk]`) rather than per head.
    pub decay_per_key: bool,
    /// One beta per token (`[.., 1]`) rather than per head.
    pub beta_shared: bool,
}

impl LinearHeads {
    pub fn out_heads(&self) -> usize {
        self.q_heads.max(self.kv_heads)
    }

    /// The query head and the state head output head `o` reads (grouped query heads, or the
    /// inverse grouping com.microsoft's op allows).
    pub fn heads_of_output(&self, o: usize) -> (usize, usize) {
        if self.q_heads >= self.kv_heads {
            (o, o / (self.q_heads / self.kv_heads))
        } else {
            (o / (self.kv_heads / self.q_heads), o)
        }
    }

    pub fn key_head_of(&self, h: usize) -> usize {
        h / (self.kv_heads / self.k_heads)
    }
}

/// What an expert applies between its projections.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ExpertActivation {
    Relu,
    /// The tanh approximation.
    Gelu,
    Silu,
    Identity,
    /// `G · sigmoid(α·G) · (L + β)` on fc1's gate/up rows (interleaved `[g0, l0, ..]` or
    /// `[g | l]`), with `G = min(g, limit)`, `L = clamp(l, −limit, limit)`.
    SwiGlu {
        interleaved: bool,
        alpha: f32,
        beta: f32,
        limit: f32,
    },
}

impl ExpertActivation {
    /// fc1 rows per intermediate unit.
    pub fn fusion(self) -> usize {
        if matches!(self, ExpertActivation::SwiGlu { .. }) {
            2
        } else {
            1
        }
    }
}

/// How a MoE node mixes its experts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeMixing {
    pub act: ExpertActivation,
    pub k: usize,
    /// The k routing weights divided by their sum.
    pub normalize: bool,
    /// GEMM inputs quantised to int8 per block of this size first (QMoE's int8 kernels).
    pub int8_block: Option<usize>,
}

/// One projection of every expert, `[experts, n, k]`: f32, `bits`-bit codes packed along k
/// (low bits first) with a scale per `block` of k and the default zero point 2^(bits−1), or
/// those codes as one WGemm weight of `experts·n` columns (`n` a whole number of panels, so
/// each expert is a run of panels) in [`Plan::packed`].
#[derive(Clone, Copy, Debug)]
pub enum ExpertWeights<'b> {
    F32(&'b [f32]),
    Codes { codes: &'b [u8], scales: &'b [f32], bits: usize, block: usize },
    Packed { store: usize, bytes: usize },
}

/// The experts of a MoE node, read in place from the bundle.
#[derive(Clone, Copy, Debug)]
pub struct MoeExperts<'b> {
    pub count: usize,
    pub hidden: usize,
    pub inter: usize,
    /// `[E, fusion·inter, hidden]`.
    pub fc1: ExpertWeights<'b>,
    pub b1: Option<&'b [f32]>,
    /// `[E, hidden, inter]`.
    pub fc2: ExpertWeights<'b>,
    pub b2: Option<&'b [f32]>,
}

impl ExpertWeights<'_> {
    /// Bytes of the projection of all experts as the kernels read them (codes and scales).
    pub fn bytes(&self) -> usize {
        match self {
            ExpertWeights::F32(w) => 4 * w.len(),
            ExpertWeights::Codes { codes, scales, .. } => codes.len() + 4 * scales.len(),
            ExpertWeights::Packed { bytes, .. } => *bytes,
        }
    }
}

impl MoeExperts<'_> {
    /// Bytes of one expert's weights and biases: what computing it reads.
    pub fn expert_bytes(&self) -> usize {
        let biases = 4 * (self.b1.map_or(0, <[f32]>::len) + self.b2.map_or(0, <[f32]>::len));
        (self.fc1.bytes() + self.fc2.bytes() + biases) / self.count
    }
}

/// Where one recurrent state lives in a sequence's state vector (f32 elements).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateSlot {
    pub offset: usize,
    pub len: usize,
}

/// The attention geometry every Attention node of the program shares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionShape {
    pub layers: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

pub struct Plan<'b> {
    pub program: Program,
    pub locs: Vec<Loc>,
    pub ops: Vec<(usize, Op)>,
    /// f32 weights read in place (empty for weights of other dtypes; see `views`).
    pub weights: Vec<&'b [f32]>,
    /// WGemm weights: read in place, or packed at load from a MatMulNBits layout.
    pub packed: Vec<WGemmStore<'b>>,
    /// GatherBlockQuantized tables, read in place (MatMulNBits layout or packed).
    pub nbits_tables: Vec<NBitsTable<'b>>,
    /// Number of [`Loc::I64Buf`] buffers.
    pub i64_buffers: usize,
    /// QGemm weights: codes read in place, or packed at load.
    pub qpacked: Vec<QGemmStore<'b>>,
    /// Number of [`Loc::QBuf`] buffers.
    pub q_buffers: usize,
    pub consts_f32: Vec<Vec<f32>>,
    pub consts_i64: Vec<Vec<i64>>,
    pub buffers: usize,
    pub attention: AttentionShape,
    /// The experts of the MoE nodes.
    pub moe: Vec<MoeExperts<'b>>,
    /// The recurrent state slots of a sequence, in program order (empty for a pure decoder).
    pub states: Vec<StateSlot>,
    /// f32 elements of one sequence's recurrent state (the slots' total).
    pub state_floats: usize,
    /// The logits value (the graph output the cache does not hold).
    pub logits: usize,
    /// Per op: whether only the hidden states output reads what it computes (a decoder whose
    /// MTP head reads a final norm the logits do not), so a step may skip it.
    pub hidden_only: Vec<bool>,
    /// An MTP head's `hidden_states` input: rows the caller gives each step (buffer 0).
    pub hidden_in: Option<usize>,
    /// The hidden states output beside the logits (a decoder's for its MTP head, or the head's
    /// own), every row of the step.
    pub hidden_out: Option<usize>,
}

/// Where a WGemm node's packed weights are.
#[derive(Clone, Debug)]
pub enum WGemmStore<'b> {
    /// Packed at compile time, read in place from the bundle's map.
    Mapped(WGemmWeights<'b>),
    /// Packed at load from the MatMulNBits layout (a copy the executor holds).
    PackedAtLoad(PackedWGemm),
}

impl WGemmStore<'_> {
    pub fn weights(&self) -> WGemmWeights<'_> {
        match self {
            WGemmStore::Mapped(w) => *w,
            WGemmStore::PackedAtLoad(p) => p.weights(),
        }
    }
}

/// A QGemm node's packed weights: codes and column sums read in place from the bundle's map
/// (packed at compile time) or packed at load, and the per-column zero points and scales of the
/// node.
#[derive(Clone, Debug)]
pub struct QGemmStore<'b> {
    k: usize,
    n: usize,
    codes: Cow<'b, [i8]>,
    col_sums: Cow<'b, [i32]>,
    zero_points: Vec<i32>,
    scales: Vec<f32>,
}

impl<'b> QGemmStore<'b> {
    /// Checks the parts' lengths once, so that [`QGemmStore::weights`] cannot fail.
    fn new(
        k: usize,
        n: usize,
        codes: Cow<'b, [i8]>,
        col_sums: Cow<'b, [i32]>,
        (zero_points, scales): (Vec<i32>, Vec<f32>),
    ) -> Result<QGemmStore<'b>, String> {
        QGemmWeights::from_parts(k, n, &codes, &col_sums, &zero_points, &scales).map_err(|e| e.to_string())?;
        Ok(QGemmStore { k, n, codes, col_sums, zero_points, scales })
    }
    pub fn weights(&self) -> QGemmWeights<'_> {
        QGemmWeights::from_parts(self.k, self.n, &self.codes, &self.col_sums, &self.zero_points, &self.scales)
            .expect("lengths checked when the store was made")
    }
    /// Bytes of codes and column sums the executor packed at load (0 when read in place).
    pub fn bytes_packed_at_load(&self) -> usize {
        match (&self.codes, &self.col_sums) {
            (Cow::Owned(c), Cow::Owned(s)) => c.len() + 4 * s.len(),
            _ => 0,
        }
    }
}

/// A GatherBlockQuantized table.
#[derive(Clone, Copy, Debug)]
pub enum NBitsTable<'b> {
    /// MatMulNBits layout.
    Source(MatMulNBits<'b>),
    /// The packed form of a tied lm_head's weights (row t = output column t).
    Packed(WGemmWeights<'b>),
}

impl NBitsTable<'_> {
    pub fn rows(&self) -> usize {
        match self {
            NBitsTable::Source(t) => t.n,
            NBitsTable::Packed(w) => w.n(),
        }
    }
    pub fn width(&self) -> usize {
        match self {
            NBitsTable::Source(t) => t.k,
            NBitsTable::Packed(w) => w.k(),
        }
    }
}

/// Ops whose output is their first input, unchanged (no copy).
const ALIAS_OPS: [&str; 5] =
    ["ai.onnx::Reshape", "ai.onnx::Unsqueeze", "ai.onnx::Squeeze", "ai.onnx::Flatten", "ai.onnx::Identity"];

/// Who reads and who writes each value: the (node, input slot) pairs reading it and the node
/// computing it.
struct Uses {
    consumers: Vec<Vec<(usize, usize)>>,
    producer: Vec<Option<usize>>,
}

impl Uses {
    fn of(program: &Program) -> Uses {
        let mut consumers: Vec<Vec<(usize, usize)>> = vec![Vec::new(); program.values.len()];
        let mut producer: Vec<Option<usize>> = vec![None; program.values.len()];
        for (n, node) in program.nodes.iter().enumerate() {
            for (slot, input) in node.inputs.iter().enumerate() {
                if let Some(v) = input {
                    consumers[*v].push((n, slot));
                }
            }
            for &o in &node.outputs {
                producer[o] = Some(n);
            }
        }
        Uses { consumers, producer }
    }
}

impl<'b> Plan<'b> {
    /// Builds the plan of `program`, looking weights up with `weight`. Refuses, naming the node or
    /// value: ops the executor does not run, MatMuls whose right operand is not a (transposed)
    /// weight, Attention inputs the cache cannot stand for, graph inputs it cannot supply,
    /// non-f32 weights.
    pub fn load(program: Program, weight: impl Fn(&str) -> Option<TensorView<'b>>) -> Result<Plan<'b>, ExecError> {
        // Ops first: an op the executor lacks is the first thing to say about a program.
        if let Some(node) = program.nodes.iter().find(|n| lower::lowering(&n.op).is_none()) {
            return Err(ExecError::UnsupportedOp { node: node.name.clone(), op: node.op.clone() });
        }
        let uses = Uses::of(&program);
        let layouts = weights::Layouts::find(&program, &weight)?;
        let mut stored = weights::place(&program, &uses, &weight, &layouts.sources)?;
        let attention = bind::attention(&program, &uses, &mut stored.locs)?;
        let states = bind::recurrent_states(&program, &uses, &mut stored.locs)?;
        let hidden_in = bind::graph_inputs(&program, &uses, &mut stored.locs)?;
        bind::check_cache_readers(&program, &uses, &stored.locs)?;
        let (logits, hidden_out) = bind::outputs(&program, &stored.locs)?;
        let context = lower::Context {
            program: &program,
            weight: &weight,
            uses: &uses,
            layouts: &layouts,
            attention,
            states: &states,
            logits,
        };
        let mut lowered = lower::lower_nodes(context, stored, usize::from(hidden_in.is_some()))?;
        bind::check_folded_readers(&program, &uses, &lowered.locs)?;
        let attention = attention.ok_or_else(|| {
            value_err(
                &program.values[logits].name,
                "the program has no Attention node; the executor runs decoders over a KV cache",
            )
        })?;
        let returned: Vec<usize> = [logits].into_iter().chain(hidden_out).collect();
        let buffers = buffers::assign_buffers(&program, &mut lowered.locs, lowered.roots, &returned, hidden_in);
        let hidden_only = hidden_only_ops(&program, &lowered.locs, &lowered.ops, logits);
        Ok(Plan {
            hidden_only,
            program,
            locs: lowered.locs,
            ops: lowered.ops,
            weights: lowered.weights,
            packed: lowered.packed,
            nbits_tables: lowered.nbits_tables,
            i64_buffers: lowered.i64_buffers,
            qpacked: lowered.qpacked,
            q_buffers: lowered.q_buffers,
            consts_f32: lowered.consts_f32,
            consts_i64: lowered.consts_i64,
            buffers,
            attention,
            moe: lowered.moe,
            state_floats: states.iter().map(|s| s.len).sum(),
            states,
            logits,
            hidden_in,
            hidden_out,
        })
    }

    /// Op `index` and the node it runs.
    pub fn node_op(&self, index: usize) -> (&NodeInfo, &Op) {
        let (node, op) = &self.ops[index];
        (&self.program.nodes[*node], op)
    }
}

/// Whether codes of `dtype` are signed (`i8`) or not (`u8`); `None` for other types.
fn code_signedness(dtype: &str) -> Option<bool> {
    match dtype {
        "u8" => Some(false),
        "i8" => Some(true),
        _ => None,
    }
}

/// Per op of `ops`: true when neither the logits nor the cache or a recurrent state depend on
/// what it computes (walking the program's nodes backwards, aliases included).
fn hidden_only_ops(program: &Program, locs: &[Loc], ops: &[(usize, Op)], logits: usize) -> Vec<bool> {
    let mut needed_value = vec![false; program.values.len()];
    needed_value[logits] = true;
    let mut needed_node = vec![false; program.nodes.len()];
    let keeps = |v: usize| matches!(locs[v], Loc::Cache | Loc::State(_));
    for (n, node) in program.nodes.iter().enumerate().rev() {
        let effect = node.outputs.iter().chain(node.inputs.iter().flatten()).any(|&v| keeps(v));
        if effect || node.outputs.iter().any(|&v| needed_value[v]) {
            needed_node[n] = true;
            for &v in node.inputs.iter().flatten() {
                needed_value[v] = true;
            }
        }
    }
    ops.iter().map(|(n, _)| !needed_node[*n]).collect()
}

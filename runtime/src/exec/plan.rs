//! Loading a program into a plan: where every value lives (a buffer, a weight, a constant, the
//! step's token ids or positions, a small i64 buffer, or the KV cache), one [`Op`] per node that
//! computes something, and buffers shared by values whose lifetimes do not overlap. WGemm weights
//! are read in place when the bundle holds them packed (see `packed.rs`), and packed here from the
//! MatMulNBits layout otherwise; so are QGemm weight codes (packed here from their `[K, N]` codes
//! otherwise); i64 weights (shape operands stored as raw bytes) become constants.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::num::NonZeroUsize;

use crate::bundle::{Dtype, TensorView};
use crate::kernels::gemm::{f32_panels_len, WeightLayout};
use crate::kernels::layout::MAX_TRANSPOSE_RANK;
use crate::kernels::qgemm::{pack_qgemm_codes, qgemm_columns, QGemmWeights, QWeightCodes};
use crate::kernels::quantize::quantize;
use crate::kernels::swiglu::GateActivation;
use crate::kernels::wgemm::{pack_wgemm, MatMulNBits, NBitsZeroPoints, PackedWGemm, WGemmWeights};
use crate::kvcache::Scoring;

use super::error::{node_err, value_err, ExecError};
use super::packed::{
    gemm_panels_name, mapped_qgemm, mapped_weights, packed_names, parse_gemm_layout, parse_layout, parse_qgemm_layout,
    qgemm_packed_names, GemmLayout, PackedLayout, QGemmLayout,
};
use super::program::{ElemType, NodeInfo, Program, ValueDef};

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
    /// Computed by no op the executor runs and read by none (e.g. a shape operand).
    Unused,
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
        scoring: Scoring,
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
    /// f32 scale per row (max|row|/127, 1 for a row of zeros).
    QuantizeRows {
        x: usize,
        k: usize,
        codes: usize,
        scales: usize,
    },
    /// `npuc::QGemm` over activation codes: `packed` indexes [`Plan::qpacked`]; `requant` is the
    /// output scale and zero point when the output is codes (then `out` is a [`Loc::QBuf`]).
    /// With `a_row_scales`, the activations' scale is that value (one per row) and `a_scale` is
    /// unused.
    QGemm {
        a: usize,
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
    /// Integer arithmetic on small i64 tensors, evaluated exactly into an [`Loc::I64Buf`].
    Int {
        kind: IntKind,
        inputs: Vec<usize>,
        out: usize,
    },
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
    /// The logits value (the graph output the cache does not hold).
    pub logits: usize,
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

/// Ops that compute (every other supported op is an alias).
const COMPUTED_OPS: [&str; 22] = [
    "ai.onnx::QuantizeLinear",
    "npuc::QuantizeRows",
    "ai.onnx::DequantizeLinear",
    "npuc::QGemm",
    "ai.onnx::Gather",
    "ai.onnx::MatMul",
    "ai.onnx::Transpose",
    "ai.onnx::Slice",
    "ai.onnx::Concat",
    "ai.onnx::Shape",
    "ai.onnx::Add",
    "ai.onnx::Sub",
    "ai.onnx::Mul",
    "ai.onnx::Range",
    "npuc::WGemm",
    "com.microsoft::GatherBlockQuantized",
    "npuc::RmsNorm",
    "npuc::SkipRmsNorm",
    "npuc::Rope",
    "npuc::SwiGlu",
    "npuc::GeluGate",
    "npuc::Attention",
];

const ALIAS_OPS: [&str; 5] =
    ["ai.onnx::Reshape", "ai.onnx::Unsqueeze", "ai.onnx::Squeeze", "ai.onnx::Flatten", "ai.onnx::Identity"];

impl<'b> Plan<'b> {
    /// Builds the plan of `program`, looking weights up with `weight`. Refuses, naming the node or
    /// value: ops the executor does not run, MatMuls whose right operand is not a (transposed)
    /// weight, Attention inputs the cache cannot stand for, graph inputs it cannot supply,
    /// non-f32 weights.
    pub fn load(program: Program, weight: impl Fn(&str) -> Option<TensorView<'b>>) -> Result<Plan<'b>, ExecError> {
        // Ops first: an op the executor lacks is the first thing to say about a program.
        if let Some(node) =
            program.nodes.iter().find(|n| !ALIAS_OPS.contains(&n.op.as_str()) && !COMPUTED_OPS.contains(&n.op.as_str()))
        {
            return Err(ExecError::UnsupportedOp { node: node.name.clone(), op: node.op.clone() });
        }
        let values = &program.values;
        let mut locs = vec![Loc::Unused; values.len()];
        let mut consumers: Vec<Vec<(usize, usize)>> = vec![Vec::new(); values.len()];
        let mut producer: Vec<Option<usize>> = vec![None; values.len()];
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

        // WGemm weights the bundle holds packed, by the name of their MatMulNBits codes weight;
        // the MatMulNBits tensors they were packed from may be absent.
        let mut packed_layouts: HashMap<String, PackedLayout> = HashMap::new();
        let mut packed_sources: HashSet<String> = HashSet::new();
        for node in program.nodes.iter().filter(|n| n.op == "npuc::WGemm") {
            let Some(source) = weight_name(&program, node, 1) else { continue };
            if packed_layouts.contains_key(source) {
                continue;
            }
            let Some(codes) = weight(&packed_names(source).codes) else { continue };
            let layout = parse_layout(codes.metadata).map_err(|p| value_err(codes.name, p))?;
            if layout.source != source {
                return Err(value_err(codes.name, format!("is packed from `{}`, not `{source}`", layout.source)));
            }
            packed_sources.extend([layout.source.clone(), layout.scales.clone()]);
            packed_sources.extend(layout.zero_points.clone());
            packed_layouts.insert(source.to_string(), layout);
        }
        // QGemm weight codes the bundle holds packed, by the name of the codes weight.
        let mut qgemm_layouts: HashMap<String, QGemmLayout> = HashMap::new();
        for node in program.nodes.iter().filter(|n| n.op == "npuc::QGemm") {
            let Some(source) = weight_name(&program, node, 3) else { continue };
            let Some(codes) = weight(&qgemm_packed_names(source).0) else { continue };
            let layout = parse_qgemm_layout(codes.metadata).map_err(|p| value_err(codes.name, p))?;
            if layout.source != source {
                return Err(value_err(codes.name, format!("is packed from `{}`, not `{source}`", layout.source)));
            }
            packed_sources.insert(layout.source.clone());
            qgemm_layouts.insert(source.to_string(), layout);
        }
        // Float MatMul weights the bundle holds as panels, by the name of the weight.
        let mut gemm_layouts: HashMap<String, GemmLayout> = HashMap::new();
        for node in program.nodes.iter().filter(|n| n.op == "ai.onnx::MatMul") {
            let Some(source) = weight_name(&program, node, 1) else { continue };
            let Some(panels) = weight(&gemm_panels_name(source)) else { continue };
            let layout = parse_gemm_layout(panels.metadata).map_err(|p| value_err(panels.name, p))?;
            if layout.source != source {
                return Err(value_err(panels.name, format!("is packed from `{}`, not `{source}`", layout.source)));
            }
            packed_sources.insert(layout.source.clone());
            gemm_layouts.insert(source.to_string(), layout);
        }
        let load_packed = |layout: &PackedLayout| -> Result<WGemmWeights<'b>, ExecError> {
            let names = packed_names(&layout.source);
            let get = |name: &str| {
                weight(name)
                    .ok_or_else(|| value_err(&layout.source, format!("packed tensor `{name}` is not in the bundle")))
            };
            let zero_points = match layout.zero_points {
                Some(_) => Some(get(&names.zero_points)?),
                None => None,
            };
            mapped_weights(layout, get(&names.codes)?, get(&names.scales)?, zero_points)
                .map_err(|p| value_err(&layout.source, p))
        };

        let mut weights = Vec::new();
        let mut views = Vec::new();
        let mut weight_index: HashMap<String, usize> = HashMap::new();
        let mut consts_f32 = Vec::new();
        let mut consts_i64 = Vec::new();
        for (v, info) in values.iter().enumerate() {
            locs[v] = match &info.def {
                ValueDef::Weight(name) => {
                    if consumers[v].is_empty() {
                        continue;
                    }
                    let view = match weight(name) {
                        Some(view) => view,
                        // Read only through its packed form (checked by the ops that read it).
                        None if packed_sources.contains(name) => continue,
                        None => return Err(value_err(&info.name, format!("weight `{name}` is not in the bundle"))),
                    };
                    if info.dtype == "i64" {
                        // Shape operands (stored as raw little-endian bytes): small constants.
                        consts_i64.push(i64_weight(&info.name, view)?);
                        locs[v] = Loc::ConstI64(consts_i64.len() - 1);
                        continue;
                    }
                    let index = match weight_index.get(name) {
                        Some(&i) => i,
                        None => {
                            // Only f32 weights are read as floats; others (u8 codes) are read by
                            // the ops that take them, which check their dtype.
                            let floats =
                                if info.elem == Some(ElemType::F32) { f32_weight(&info.name, view)? } else { &[] };
                            weights.push(floats);
                            views.push(view);
                            weight_index.insert(name.clone(), weights.len() - 1);
                            weights.len() - 1
                        }
                    };
                    Loc::Weight(index)
                }
                ValueDef::ConstF32(data) => {
                    consts_f32.push(data.clone());
                    Loc::ConstF32(consts_f32.len() - 1)
                }
                ValueDef::ConstI64(data) => {
                    consts_i64.push(data.clone());
                    Loc::ConstI64(consts_i64.len() - 1)
                }
                ValueDef::Input | ValueDef::Node => Loc::Unused,
            };
        }

        // Attention nodes bind their past/mask inputs and present outputs to the cache.
        let mut attention: Option<AttentionShape> = None;
        let mut layers = 0;
        for node in program.nodes.iter().filter(|n| n.op == "npuc::Attention") {
            let shape = attention_shape(&program, node)?;
            match attention {
                None => attention = Some(shape),
                Some(a) if (a.q_heads, a.kv_heads, a.head_dim) == (shape.q_heads, shape.kv_heads, shape.head_dim) => {}
                Some(_) => {
                    return Err(node_err(
                        &node.name,
                        &node.op,
                        "heads or head size differ from the first Attention node",
                    ))
                }
            }
            layers += 1;
            for slot in 3..6 {
                if let Some(v) = node.input(slot) {
                    if !matches!(values[v].def, ValueDef::Input) {
                        return Err(node_err(
                            &node.name,
                            &node.op,
                            format!(
                                "input {slot} (`{}`) must be a graph input: the KV cache holds the past and the mask",
                                values[v].name
                            ),
                        ));
                    }
                    locs[v] = Loc::Cache;
                }
            }
            for &v in node.outputs.iter().skip(1) {
                if let Some(&(n, _)) = consumers[v].first() {
                    let reader = &program.nodes[n];
                    return Err(node_err(
                        &reader.name,
                        &reader.op,
                        format!("reads `{}`, a present key/value the KV cache holds", values[v].name),
                    ));
                }
                locs[v] = Loc::Cache;
            }
        }
        let attention = attention.map(|a| AttentionShape { layers, ..a });

        for &v in &program.inputs {
            let info = &values[v];
            match info.name.as_str() {
                "input_ids" => locs[v] = Loc::Ids,
                "position_ids" => locs[v] = Loc::Positions,
                _ if locs[v] == Loc::Cache => {}
                _ if consumers[v].is_empty() => {}
                _ => return Err(value_err(&info.name, "is a graph input the host executor cannot supply (it supplies input_ids, position_ids, and the past and mask of Attention nodes)")),
            }
            if matches!(locs[v], Loc::Ids | Loc::Positions) && info.elem != Some(ElemType::I64) {
                return Err(value_err(&info.name, format!("has dtype {}, expected i64", info.dtype)));
            }
        }
        // A graph input bound to the cache may only be read by Attention nodes.
        for (v, loc) in locs.iter().enumerate() {
            if *loc == Loc::Cache {
                if let Some(&(n, _)) = consumers[v]
                    .iter()
                    .find(|(n, _)| !matches!(program.nodes[*n].op.as_str(), "npuc::Attention" | "ai.onnx::Shape"))
                {
                    let reader = &program.nodes[n];
                    return Err(node_err(
                        &reader.name,
                        &reader.op,
                        format!("reads `{}`, which the KV cache stands for", values[v].name),
                    ));
                }
            }
        }

        let logits = logits_value(&program, &locs)?;
        let mut ops = Vec::new();
        let mut layer = 0;
        let mut next_root = 0;
        let mut fresh = |locs: &mut Vec<Loc>, v: usize| {
            locs[v] = Loc::Buf(next_root);
            next_root += 1;
        };
        let mut i64_buffers = 0;
        let mut fresh_i64 = |locs: &mut Vec<Loc>, v: usize| {
            locs[v] = Loc::I64Buf(i64_buffers);
            i64_buffers += 1;
        };
        let mut packed = Vec::new();
        let mut mapped_index: HashMap<String, usize> = HashMap::new();
        let mut nbits_tables = Vec::new();
        let mut qpacked = Vec::new();
        let mut q_buffers = 0;
        let mut fresh_q = |locs: &mut Vec<Loc>, v: usize| {
            locs[v] = Loc::QBuf(q_buffers);
            q_buffers += 1;
        };
        // Codes of QuantizeLinear nodes folded at load, with their signedness.
        let mut folded: Vec<(Vec<u8>, bool)> = Vec::new();
        // The load-time parameters of a node (scales, zero points) as the plan stands so far.
        macro_rules! params {
            () => {
                Params {
                    locs: &locs,
                    weights: &weights,
                    views: &views,
                    values,
                    consts_f32: &consts_f32,
                    consts_i64: &consts_i64,
                }
            };
        }
        for (n, node) in program.nodes.iter().enumerate() {
            let fail = |problem: String| node_err(&node.name, &node.op, problem);
            let input = |slot: usize| node.input(slot).ok_or_else(|| fail(format!("input {slot} is missing")));
            let f32_input = |slot: usize, locs: &Vec<Loc>| -> Result<usize, ExecError> {
                let v = input(slot)?;
                if values[v].elem != Some(ElemType::F32) {
                    return Err(fail(format!(
                        "input {slot} (`{}`) has dtype {}; the host executor runs float programs",
                        values[v].name, values[v].dtype
                    )));
                }
                if matches!(locs[v], Loc::Unused | Loc::Cache | Loc::Ids | Loc::Positions | Loc::ConstI64(_)) {
                    return Err(fail(format!(
                        "input {slot} (`{}`) is not a tensor the executor holds",
                        values[v].name
                    )));
                }
                Ok(v)
            };
            let out = |i: usize| node.outputs.get(i).copied().ok_or_else(|| fail(format!("output {i} is missing")));
            match node.op.as_str() {
                op if ALIAS_OPS.contains(&op) => {
                    let x = input(0)?;
                    locs[out(0)?] = locs[x];
                }
                "ai.onnx::Gather" => {
                    let axis = node.attr_i64("axis").unwrap_or(0);
                    if axis != 0 {
                        return Err(fail(format!("gathers along axis {axis}; the executor gathers rows (axis 0)")));
                    }
                    if values[input(0)?].elem == Some(ElemType::I64) {
                        let ins = int_inputs(node, &locs, 2, values)?;
                        let o = out(0)?;
                        fresh_i64(&mut locs, o);
                        ops.push((n, Op::Int { kind: IntKind::Gather, inputs: ins, out: o }));
                        continue;
                    }
                    let ids = input(1)?;
                    if !matches!(locs[ids], Loc::Ids | Loc::Positions | Loc::ConstI64(_) | Loc::I64Buf(_)) {
                        return Err(fail(format!(
                            "indices `{}` are not token ids, positions or a constant",
                            values[ids].name
                        )));
                    }
                    let data = input(0)?;
                    let o = out(0)?;
                    let (table, layout) = match locs[data] {
                        Loc::WeightT(i) => (i, WeightLayout::KN),
                        Loc::PanelsT(i) => (i, WeightLayout::Panels),
                        _ => {
                            let data = f32_input(0, &locs)?;
                            fresh(&mut locs, o);
                            ops.push((n, Op::Gather { data, ids, out: o }));
                            continue;
                        }
                    };
                    // The transpose of W [K, N]: its rows are W's columns.
                    let [Some(n_rows), Some(k)] =
                        values[data].shape.iter().map(|d| d.as_const()).collect::<Vec<_>>()[..]
                    else {
                        return Err(fail(format!("`{}` is not a 2-D table of fixed sizes", values[data].name)));
                    };
                    fresh(&mut locs, o);
                    ops.push((n, Op::GatherColumns { table, layout, k, n: n_rows, ids, out: o }));
                }
                "ai.onnx::MatMul" if weight_name(&program, node, 1).is_some_and(|s| gemm_layouts.contains_key(s)) => {
                    let a = f32_input(0, &locs)?;
                    let w = input(1)?;
                    let layout = &gemm_layouts[weight_name(&program, node, 1).expect("checked by the guard")];
                    let dims: Vec<Option<usize>> = values[w].shape.iter().map(|d| d.as_const()).collect();
                    if dims[..] != [Some(layout.k), Some(layout.n)] {
                        return Err(fail(format!(
                            "the panels of `{}` are K={} N={}, the node's weight is {:?}",
                            layout.source, layout.k, layout.n, dims
                        )));
                    }
                    let (view, panels) = panels_view(&weight, layout, &values[w].name)?;
                    weights.push(panels);
                    views.push(view);
                    let o = out(0)?;
                    fresh(&mut locs, o);
                    let last_row_only = o == logits && consumers[o].is_empty();
                    ops.push((
                        n,
                        Op::MatMul {
                            a,
                            w,
                            panels: Some(weights.len() - 1),
                            layout: WeightLayout::Panels,
                            k: layout.k,
                            n: layout.n,
                            out: o,
                            last_row_only,
                        },
                    ));
                }
                "ai.onnx::MatMul" => {
                    let a = f32_input(0, &locs)?;
                    let w = f32_input(1, &locs)?;
                    let layout = match locs[w] {
                        Loc::Weight(_) => WeightLayout::KN,
                        Loc::WeightT(_) => WeightLayout::NK,
                        _ => {
                            return Err(fail(format!(
                                "the right operand `{}` is computed; the executor multiplies by weights",
                                values[w].name
                            )))
                        }
                    };
                    let wshape = &values[w].shape;
                    let (k, n_cols) = match (
                        wshape.len(),
                        wshape.first().and_then(|d| d.as_const()),
                        wshape.get(1).and_then(|d| d.as_const()),
                    ) {
                        (2, Some(k), Some(n)) => (k, n),
                        _ => {
                            return Err(fail(format!(
                                "the weight operand `{}` is not 2-D with fixed sizes",
                                values[w].name
                            )))
                        }
                    };
                    let (Loc::Weight(i) | Loc::WeightT(i)) = locs[w] else { unreachable!("matched above") };
                    if weights[i].len() != k * n_cols {
                        return Err(fail(format!(
                            "the weight `{}` holds {} values, not {k}×{n_cols}",
                            values[w].name,
                            weights[i].len()
                        )));
                    }
                    let o = out(0)?;
                    fresh(&mut locs, o);
                    let last_row_only = o == logits && consumers[o].is_empty();
                    ops.push((n, Op::MatMul { a, w, panels: None, layout, k, n: n_cols, out: o, last_row_only }));
                }
                "ai.onnx::Transpose" => {
                    let x = input(0)?;
                    let rank = values[x].shape.len();
                    if rank > MAX_TRANSPOSE_RANK {
                        return Err(fail(format!(
                            "rank {rank} is above the {MAX_TRANSPOSE_RANK} axes the executor transposes"
                        )));
                    }
                    let perm: Vec<usize> = match node.attr_ints("perm") {
                        Some(p) => p.into_iter().map(|d| d as usize).collect(),
                        None => (0..rank).rev().collect(),
                    };
                    let mut sorted = perm.clone();
                    sorted.sort_unstable();
                    if sorted != (0..rank).collect::<Vec<_>>() {
                        return Err(fail(format!("perm {perm:?} is not a permutation of {rank} axes")));
                    }
                    let o = out(0)?;
                    // Read in place by MatMul and Gather, or quantised at load (QuantizeLinear of
                    // a weight).
                    let read_in_place = |gather_only: bool| {
                        !consumers[o].is_empty()
                            && consumers[o].iter().all(|&(c, slot)| {
                                let node = &program.nodes[c];
                                let gather = node.op == "ai.onnx::Gather"
                                    && slot == 0
                                    && node.attr_i64("axis").unwrap_or(0) == 0;
                                gather
                                    || !gather_only
                                        && ((node.op == "ai.onnx::MatMul" && slot == 1)
                                            || (node.op == "ai.onnx::QuantizeLinear" && slot == 0))
                            })
                    };
                    let panels_only = match &values[x].def {
                        ValueDef::Weight(name) if locs[x] == Loc::Unused => gemm_layouts.get(name),
                        _ => None,
                    };
                    match (locs[x], panels_only) {
                        (Loc::Weight(i), _) if perm == [1, 0] && read_in_place(false) => locs[o] = Loc::WeightT(i),
                        (_, Some(layout)) if perm == [1, 0] && read_in_place(true) => {
                            let (view, panels) = panels_view(&weight, layout, &values[x].name)?;
                            weights.push(panels);
                            views.push(view);
                            locs[o] = Loc::PanelsT(weights.len() - 1);
                        }
                        _ => {
                            let x = f32_input(0, &locs)?;
                            fresh(&mut locs, o);
                            ops.push((n, Op::Transpose { x, perm, out: o }));
                        }
                    }
                }
                "npuc::RmsNorm" => {
                    let (x, gamma) = (f32_input(0, &locs)?, f32_input(1, &locs)?);
                    let o = out(0)?;
                    fresh(&mut locs, o);
                    ops.push((n, Op::RmsNorm { x, gamma, eps: node.attr_f32("epsilon").unwrap_or(1e-5), out: o }));
                }
                "npuc::SkipRmsNorm" => {
                    let (x, skip, gamma) = (f32_input(0, &locs)?, f32_input(1, &locs)?, f32_input(2, &locs)?);
                    let bias = match node.input(3) {
                        Some(_) => Some(f32_input(3, &locs)?),
                        None => None,
                    };
                    let y = out(0)?;
                    fresh(&mut locs, y);
                    let sum = node.outputs.get(1).copied();
                    if let Some(s) = sum {
                        fresh(&mut locs, s);
                    }
                    let eps = node.attr_f32("epsilon").unwrap_or(1e-5);
                    ops.push((n, Op::SkipRmsNorm { x, skip, gamma, bias, eps, y, sum }));
                }
                "npuc::Rope" => {
                    let (x, cos, sin) = (f32_input(0, &locs)?, f32_input(1, &locs)?, f32_input(2, &locs)?);
                    let o = out(0)?;
                    fresh(&mut locs, o);
                    ops.push((
                        n,
                        Op::Rope { x, cos, sin, interleaved: node.attr_i64("interleaved").unwrap_or(0) != 0, out: o },
                    ));
                }
                op @ ("npuc::SwiGlu" | "npuc::GeluGate") => {
                    let (gate, up) = (f32_input(0, &locs)?, f32_input(1, &locs)?);
                    let act = if op == "npuc::SwiGlu" { GateActivation::Silu } else { GateActivation::GeluTanh };
                    let o = out(0)?;
                    fresh(&mut locs, o);
                    ops.push((n, Op::Gate { gate, up, act, out: o }));
                }
                "npuc::Attention" => {
                    let (q, k, v) = (f32_input(0, &locs)?, f32_input(1, &locs)?, f32_input(2, &locs)?);
                    let head_dim = attention.map_or(1, |a| a.head_dim);
                    let scale = node.attr_f32("scale").unwrap_or(1.0 / (head_dim as f32).sqrt());
                    let window = match node.attr_i64("window").unwrap_or(0) {
                        w if w < 0 => return Err(fail(format!("window {w} is negative"))),
                        w => NonZeroUsize::new(w as usize),
                    };
                    let o = out(0)?;
                    fresh(&mut locs, o);
                    ops.push((n, Op::Attention { q, k, v, layer, scoring: Scoring { scale, window }, out: o }));
                    layer += 1;
                }
                "ai.onnx::Shape" => {
                    let start = node.attr_i64("start").unwrap_or(0);
                    let end = node.attr_i64("end");
                    let x = input(0)?;
                    let o = out(0)?;
                    fresh_i64(&mut locs, o);
                    ops.push((n, Op::Int { kind: IntKind::Shape { start, end }, inputs: vec![x], out: o }));
                }
                op @ ("ai.onnx::Add" | "ai.onnx::Mul") if values[out(0)?].elem == Some(ElemType::F32) => {
                    let (a, b) = (f32_input(0, &locs)?, f32_input(1, &locs)?);
                    let o = out(0)?;
                    // One operand is the output's shape; the other that shape or a suffix of it
                    // (leading 1s aside): the only broadcast the row-wise add computes.
                    let trailing = |v: usize| {
                        let s = &values[v].shape;
                        let s = &s[s.iter().take_while(|d| d.as_const() == Some(1)).count()..];
                        values[o].shape.ends_with(s)
                    };
                    let full = |v: usize| values[v].shape == values[o].shape;
                    if !(full(a) && trailing(b) || full(b) && trailing(a)) {
                        return Err(fail(format!(
                            "combines `{}` and `{}` with a broadcast other than a trailing one",
                            values[a].name, values[b].name
                        )));
                    }
                    fresh(&mut locs, o);
                    ops.push((n, Op::BinaryF32 { a, b, mul: op == "ai.onnx::Mul", out: o }));
                }
                "ai.onnx::Add" | "ai.onnx::Sub" | "ai.onnx::Mul" | "ai.onnx::Range" => {
                    let (kind, arity) = match node.op.as_str() {
                        "ai.onnx::Add" => (IntKind::Add, 2),
                        "ai.onnx::Sub" => (IntKind::Sub, 2),
                        "ai.onnx::Mul" => (IntKind::Mul, 2),
                        _ => (IntKind::Range, 3),
                    };
                    let ins = int_inputs(node, &locs, arity, values)?;
                    let o = out(0)?;
                    fresh_i64(&mut locs, o);
                    ops.push((n, Op::Int { kind, inputs: ins, out: o }));
                }
                "ai.onnx::Concat" => {
                    let axis = node.attr_i64("axis").unwrap_or(0);
                    let o = out(0)?;
                    if values[o].elem == Some(ElemType::I64) {
                        let arity = node.inputs.len();
                        let ins = int_inputs(node, &locs, arity, values)?;
                        if values[o].shape.len() != 1 {
                            return Err(fail("concatenates integer tensors of rank other than 1".to_string()));
                        }
                        fresh_i64(&mut locs, o);
                        ops.push((n, Op::Int { kind: IntKind::Concat, inputs: ins, out: o }));
                        continue;
                    }
                    let rank = values[o].shape.len();
                    if rank > MAX_TRANSPOSE_RANK || rank == 0 || axis < -(rank as i64) || axis >= rank as i64 {
                        return Err(fail(format!("axis {axis} of rank {rank} is not one the executor concatenates")));
                    }
                    let ins = (0..node.inputs.len()).map(|s| f32_input(s, &locs)).collect::<Result<Vec<_>, _>>()?;
                    fresh(&mut locs, o);
                    ops.push((n, Op::Concat { inputs: ins, axis, out: o }));
                }
                "ai.onnx::Slice" => {
                    let x = f32_input(0, &locs)?;
                    if values[x].shape.len() > MAX_TRANSPOSE_RANK {
                        return Err(fail(format!("rank above the {MAX_TRANSPOSE_RANK} axes the executor slices")));
                    }
                    let int = |slot: usize| -> Result<Option<usize>, ExecError> {
                        match node.input(slot) {
                            None => Ok(None),
                            Some(v)
                                if values[v].elem == Some(ElemType::I64)
                                    && matches!(locs[v], Loc::ConstI64(_) | Loc::I64Buf(_)) =>
                            {
                                Ok(Some(v))
                            }
                            Some(v) => Err(fail(format!(
                                "input {slot} (`{}`) is not an integer tensor the executor holds",
                                values[v].name
                            ))),
                        }
                    };
                    let (starts, ends) = match (int(1)?, int(2)?) {
                        (Some(s), Some(e)) => (s, e),
                        _ => return Err(fail("starts and ends are required".to_string())),
                    };
                    let (axes, steps) = (int(3)?, int(4)?);
                    let o = out(0)?;
                    fresh(&mut locs, o);
                    ops.push((n, Op::Slice { x, starts, ends, axes, steps, out: o }));
                }
                "npuc::WGemm" => {
                    let a = f32_input(0, &locs)?;
                    let attr = |name: &str| -> Result<usize, ExecError> {
                        node.attr_i64(name)
                            .and_then(|v| usize::try_from(v).ok())
                            .ok_or_else(|| fail(format!("attribute {name} is missing or negative")))
                    };
                    let (k, n_cols, bits, block_size) = (attr("K")?, attr("N")?, attr("bits")?, attr("block_size")?);
                    if node.input(4).is_some() {
                        return Err(fail("g_idx (act-order block indices) is not supported".to_string()));
                    }
                    let bias = match node.input(5) {
                        Some(_) => Some(f32_input(5, &locs)?),
                        None => None,
                    };
                    let source = weight_name(&program, node, 1);
                    let index = match source.and_then(|s| packed_layouts.get(s)) {
                        Some(layout) => {
                            check_packed_layout(&program, node, layout, (k, n_cols, bits, block_size)).map_err(fail)?;
                            match mapped_index.get(&layout.source) {
                                Some(&i) => i,
                                None => {
                                    packed.push(WGemmStore::Mapped(load_packed(layout)?));
                                    mapped_index.insert(layout.source.clone(), packed.len() - 1);
                                    packed.len() - 1
                                }
                            }
                        }
                        None => {
                            let codes = u8_weight(node, &locs, &views, values, 1)?;
                            let scales = f32_weight_input(node, &locs, &weights, values, 2)?;
                            let zero_points = match node.input(3) {
                                None => NBitsZeroPoints::Default,
                                Some(v) if values[v].dtype == "u8" => {
                                    NBitsZeroPoints::Packed(u8_weight(node, &locs, &views, values, 3)?)
                                }
                                Some(_) => NBitsZeroPoints::Float(f32_weight_input(node, &locs, &weights, values, 3)?),
                            };
                            let src = MatMulNBits { k, n: n_cols, bits, block_size, b: codes, scales, zero_points };
                            packed.push(WGemmStore::PackedAtLoad(pack_wgemm(&src).map_err(|e| fail(e.to_string()))?));
                            packed.len() - 1
                        }
                    };
                    let o = out(0)?;
                    fresh(&mut locs, o);
                    let last_row_only = o == logits && consumers[o].is_empty();
                    // accuracy_level 4 asks for int8 activations per block (onnxruntime's int8
                    // kernel, 4-bit codes without float zero points); the kernels compute it so.
                    let float_zero_points = node.input(3).is_some_and(|v| values[v].dtype != "u8");
                    let int8_activations =
                        node.attr_i64("accuracy_level") == Some(4) && bits == 4 && !float_zero_points;
                    ops.push((
                        n,
                        Op::WGemm { a, packed: index, bias, k, n: n_cols, out: o, last_row_only, int8_activations },
                    ));
                }
                "com.microsoft::GatherBlockQuantized" => {
                    let gather_axis = node.attr_i64("gather_axis").unwrap_or(0);
                    let quantize_axis = node.attr_i64("quantize_axis").unwrap_or(1);
                    let bits = node.attr_i64("bits").unwrap_or(4) as usize;
                    let block_size = node.attr_i64("block_size").unwrap_or(128) as usize;
                    let data = input(0)?;
                    let dshape: Vec<Option<usize>> = values[data].shape.iter().map(|d| d.as_const()).collect();
                    let (rows, row_bytes) = match dshape[..] {
                        [Some(r), Some(b)] => (r, b),
                        _ => return Err(fail(format!("data `{}` is not 2-D with fixed sizes", values[data].name))),
                    };
                    if gather_axis != 0 || !(quantize_axis == 1 || quantize_axis == -1) {
                        return Err(fail(format!(
                            "gather_axis {gather_axis} and quantize_axis {quantize_axis}; the executor gathers rows quantised along them"
                        )));
                    }
                    if !(bits == 4 || bits == 8) {
                        return Err(fail(format!("{bits}-bit codes (4 and 8 are supported)")));
                    }
                    let k = row_bytes * 8 / bits;
                    if block_size == 0 || !k.is_multiple_of(block_size) {
                        return Err(fail(format!("rows of {k} are not whole blocks of {block_size}")));
                    }
                    let root = weight_root(&program, &producer, data);
                    let tied = root.and_then(|r| packed_layouts.get(r)).filter(|_| locs[data] == Loc::Unused);
                    let table = match tied {
                        // A tied table stored only packed for the lm_head: the same codes, scales
                        // and zero points, so its rows are the packed weights' columns.
                        Some(layout) => {
                            let same_inputs = weight_name(&program, node, 2) == Some(layout.scales.as_str())
                                && weight_name(&program, node, 3) == layout.zero_points.as_deref();
                            if !same_inputs
                                || (layout.n, layout.k, layout.bits, layout.block_size) != (rows, k, bits, block_size)
                            {
                                return Err(fail(format!(
                                    "data `{}` is stored only packed for WGemm, and this table is not the one packed (scales, zero points, or {rows}×{k} {bits}-bit in blocks of {block_size} differ)",
                                    layout.source
                                )));
                            }
                            NBitsTable::Packed(load_packed(layout)?)
                        }
                        None => {
                            let codes = u8_weight(node, &locs, &views, values, 0)?;
                            let scales = f32_weight_input(node, &locs, &weights, values, 2)?;
                            let zero_points = match node.input(3) {
                                None => NBitsZeroPoints::Default,
                                Some(_) => NBitsZeroPoints::Packed(u8_weight(node, &locs, &views, values, 3)?),
                            };
                            let table = MatMulNBits { k, n: rows, bits, block_size, b: codes, scales, zero_points };
                            // Checks the buffers against the table's size (no ids: nothing is gathered).
                            crate::kernels::embed::embed_nbits(&table, &[], &mut [])
                                .map_err(|e| fail(e.to_string()))?;
                            NBitsTable::Source(table)
                        }
                    };
                    let ids = input(1)?;
                    if !matches!(locs[ids], Loc::Ids | Loc::Positions | Loc::ConstI64(_) | Loc::I64Buf(_)) {
                        return Err(fail(format!(
                            "indices `{}` are not token ids or an integer tensor",
                            values[ids].name
                        )));
                    }
                    nbits_tables.push(table);
                    let o = out(0)?;
                    fresh(&mut locs, o);
                    ops.push((n, Op::GatherNBits { table: nbits_tables.len() - 1, ids, out: o }));
                }
                "ai.onnx::QuantizeLinear" => {
                    let o = out(0)?;
                    let signed = code_signedness(&values[o].dtype).ok_or_else(|| {
                        fail(format!("quantises to {}; the executor holds u8 and i8 codes", values[o].dtype))
                    })?;
                    let x = input(0)?;
                    let params = params!();
                    let scale = params.f32s(node, 1)?;
                    let zero_point = match node.input(2) {
                        Some(_) => params.ints(node, 2)?,
                        None => vec![0; scale.len()],
                    };
                    if zero_point.len() != scale.len() {
                        return Err(fail("the zero point and the scale differ in size".to_string()));
                    }
                    if let Loc::Weight(i) | Loc::WeightT(i) = locs[x] {
                        // A weight quantised by the program (a tied lm_head): folded here, once.
                        let dims: Vec<Option<usize>> = values[x].shape.iter().map(|d| d.as_const()).collect();
                        let [Some(rows), Some(cols)] = dims[..] else {
                            return Err(fail(format!("quantises `{}`, not a 2-D weight", values[x].name)));
                        };
                        let axis = node.attr_i64("axis").unwrap_or(1);
                        let per_column = match (scale.len(), axis) {
                            (1, _) => None,
                            (len, 1 | -1) if len == cols => Some(true),
                            (len, 0 | -2) if len == rows => Some(false),
                            (len, _) => {
                                return Err(fail(format!(
                                    "{len} scales along axis {axis} of a [{rows}, {cols}] weight"
                                )))
                            }
                        };
                        let data = weights[i];
                        let transposed = matches!(locs[x], Loc::WeightT(_));
                        let mut codes = Vec::with_capacity(rows * cols);
                        for r in 0..rows {
                            for c in 0..cols {
                                let v = if transposed { data[c * rows + r] } else { data[r * cols + c] };
                                let p = match per_column {
                                    None => 0,
                                    Some(true) => c,
                                    Some(false) => r,
                                };
                                codes.push(quantize(v, scale[p], zero_point[p], signed));
                            }
                        }
                        folded.push((codes, signed));
                        locs[o] = Loc::ConstQ(folded.len() - 1);
                        continue;
                    }
                    let x = f32_input(0, &locs)?;
                    let [scale] = scale[..] else {
                        return Err(fail(
                            "quantises activations with several scales; the executor takes one per tensor".to_string(),
                        ));
                    };
                    fresh_q(&mut locs, o);
                    ops.push((n, Op::Quantize { x, scale, zero_point: zero_point[0], signed, out: o }));
                }
                "npuc::QuantizeRows" => {
                    let x = f32_input(0, &locs)?;
                    let k = values[x].shape.last().and_then(|d| d.as_const()).filter(|&k| k > 0).ok_or_else(|| {
                        fail(format!("`{}` has no fixed last axis to quantise along", values[x].name))
                    })?;
                    let (codes, scales) = (out(0)?, out(1)?);
                    if values[codes].dtype != "i8" || values[scales].elem != Some(ElemType::F32) {
                        return Err(fail("QuantizeRows gives i8 codes and f32 scales".to_string()));
                    }
                    fresh_q(&mut locs, codes);
                    fresh(&mut locs, scales);
                    ops.push((n, Op::QuantizeRows { x, k, codes, scales }));
                }
                "ai.onnx::DequantizeLinear" => {
                    let x = input(0)?;
                    if !matches!(locs[x], Loc::QBuf(_)) {
                        return Err(fail(format!(
                            "`{}` is not quantised activations the executor computes",
                            values[x].name
                        )));
                    }
                    let signed = code_signedness(&values[x].dtype).expect("QBuf values are u8 or i8");
                    let params = params!();
                    let (scale, zero_point) = params.per_tensor(node, 1, 2)?;
                    if values[out(0)?].elem != Some(ElemType::F32) {
                        return Err(fail("dequantises to a type other than f32".to_string()));
                    }
                    let o = out(0)?;
                    fresh(&mut locs, o);
                    ops.push((n, Op::Dequantize { x, scale, zero_point, signed, out: o }));
                }
                "npuc::QGemm" => {
                    let a = input(0)?;
                    if !matches!(locs[a], Loc::QBuf(_)) {
                        return Err(fail(format!(
                            "the activation `{}` is not codes the executor computes",
                            values[a].name
                        )));
                    }
                    let a_signed = code_signedness(&values[a].dtype).expect("QBuf values are u8 or i8");
                    let params = params!();
                    // Scales computed per row by the program (QuantizeRows), or constants per tensor.
                    let (a_scale, a_zero_point, a_row_scales) = match locs[input(1)?] {
                        Loc::Buf(_) => match params.ints(node, 2)?[..] {
                            [z] => (1.0, z, Some(input(1)?)),
                            _ => return Err(fail("per-row activation scales need one zero point".to_string())),
                        },
                        _ => {
                            let (s, z) = params.per_tensor(node, 1, 2)?;
                            (s, z, None)
                        }
                    };
                    let w = input(3)?;
                    let dims: Vec<Option<usize>> = values[w].shape.iter().map(|d| d.as_const()).collect();
                    let [Some(k), Some(n_cols)] = dims[..] else {
                        return Err(fail(format!("the weight `{}` is not 2-D with fixed sizes", values[w].name)));
                    };
                    let w_scale = params.f32s(node, 4)?;
                    let w_zero_point = params.ints(node, 5)?;
                    let layout = weight_name(&program, node, 3).and_then(|s| qgemm_layouts.get(s));
                    let store = match layout {
                        Some(layout) => {
                            let unsigned = match values[w].dtype.as_str() {
                                "u8" => true,
                                "i8" => false,
                                other => {
                                    return Err(fail(format!(
                                        "the weight `{}` is {other}, not u8 or i8 codes",
                                        values[w].name
                                    )))
                                }
                            };
                            if (layout.k, layout.n, layout.unsigned) != (k, n_cols, unsigned) {
                                return Err(fail(format!(
                                    "packed weights of `{}` are K={} N={} {} codes, the node reads K={k} N={n_cols} {}",
                                    layout.source,
                                    layout.k,
                                    layout.n,
                                    if layout.unsigned { "u8" } else { "i8" },
                                    values[w].dtype
                                )));
                            }
                            let (codes_name, sums_name) = qgemm_packed_names(&layout.source);
                            let get = |name: &str| {
                                weight(name).ok_or_else(|| {
                                    value_err(&layout.source, format!("packed tensor `{name}` is not in the bundle"))
                                })
                            };
                            let (codes, sums) = mapped_qgemm(get(&codes_name)?, get(&sums_name)?)
                                .map_err(|p| value_err(&layout.source, p))?;
                            let columns = qgemm_columns(n_cols, unsigned, &w_scale, &w_zero_point)
                                .map_err(|e| fail(e.to_string()))?;
                            QGemmStore::new(k, n_cols, Cow::Borrowed(codes), Cow::Borrowed(sums), columns)
                                .map_err(fail)?
                        }
                        None => {
                            let codes = match locs[w] {
                                Loc::ConstQ(i) => {
                                    let (bytes, signed) = &folded[i];
                                    if *signed {
                                        QWeightCodes::I8(as_i8(bytes))
                                    } else {
                                        QWeightCodes::U8(bytes)
                                    }
                                }
                                Loc::Weight(i) if views[i].dtype == Dtype::I8 && values[w].dtype == "i8" => {
                                    QWeightCodes::I8(as_i8(views[i].bytes))
                                }
                                Loc::Weight(i) if views[i].dtype == Dtype::U8 && values[w].dtype == "u8" => {
                                    QWeightCodes::U8(views[i].bytes)
                                }
                                _ => {
                                    return Err(fail(format!("the weight `{}` is not u8 or i8 codes", values[w].name)))
                                }
                            };
                            let unsigned = matches!(codes, QWeightCodes::U8(_));
                            let (packed_codes, sums) =
                                pack_qgemm_codes(k, n_cols, codes).map_err(|e| fail(e.to_string()))?;
                            let columns = qgemm_columns(n_cols, unsigned, &w_scale, &w_zero_point)
                                .map_err(|e| fail(e.to_string()))?;
                            QGemmStore::new(k, n_cols, Cow::Owned(packed_codes), Cow::Owned(sums), columns)
                                .map_err(fail)?
                        }
                    };
                    qpacked.push(store);
                    let o = out(0)?;
                    let requant = match node.input(6) {
                        Some(_) => {
                            let (s_y, z_y) = params.per_tensor(node, 6, 7)?;
                            let signed = code_signedness(&values[o].dtype).ok_or_else(|| {
                                fail(format!("requantises to {}; the executor holds u8 and i8 codes", values[o].dtype))
                            })?;
                            Some((s_y, z_y, signed))
                        }
                        None => None,
                    };
                    if requant.is_some() {
                        fresh_q(&mut locs, o);
                    } else {
                        fresh(&mut locs, o);
                    }
                    ops.push((
                        n,
                        Op::QGemm {
                            a,
                            a_signed,
                            a_row_scales,
                            a_scale,
                            a_zero_point,
                            packed: qpacked.len() - 1,
                            k,
                            n: n_cols,
                            requant,
                            out: o,
                        },
                    ));
                }
                _ => return Err(ExecError::UnsupportedOp { node: node.name.clone(), op: node.op.clone() }),
            }
        }
        // Folded codes are read by QGemm packing only.
        for (v, loc) in locs.iter().enumerate() {
            if let Loc::ConstQ(_) = loc {
                if let Some(&(c, slot)) =
                    consumers[v].iter().find(|&&(c, slot)| !(program.nodes[c].op == "npuc::QGemm" && slot == 3))
                {
                    let reader = &program.nodes[c];
                    return Err(node_err(&reader.name, &reader.op, format!("input {slot} (`{}`) is a weight quantised by the program; the executor folds those for QGemm weights only", values[v].name)));
                }
            }
        }

        let attention = attention.ok_or_else(|| {
            value_err(
                &values[logits].name,
                "the program has no Attention node; the executor runs decoders over a KV cache",
            )
        })?;
        let buffers = assign_buffers(&program, &mut locs, next_root, logits);
        Ok(Plan {
            program,
            locs,
            ops,
            weights,
            packed,
            nbits_tables,
            i64_buffers,
            qpacked,
            q_buffers,
            consts_f32,
            consts_i64,
            buffers,
            attention,
            logits,
        })
    }

    /// Op `index` and the node it runs.
    pub fn node_op(&self, index: usize) -> (&NodeInfo, &Op) {
        let (node, op) = &self.ops[index];
        (&self.program.nodes[*node], op)
    }
}

/// Checks an Attention node's q [batch, q_heads, seq, head_dim] and k, v [batch, kv_heads, seq,
/// head_dim] against its attributes.
fn attention_shape(program: &Program, node: &NodeInfo) -> Result<AttentionShape, ExecError> {
    let fail = |problem: String| node_err(&node.name, &node.op, problem);
    let shape_of = |slot: usize| -> Result<Vec<Option<usize>>, ExecError> {
        let v = node.input(slot).ok_or_else(|| fail(format!("input {slot} is missing")))?;
        Ok(program.values[v].shape.iter().map(|d| d.as_const()).collect())
    };
    let (q, k, v) = (shape_of(0)?, shape_of(1)?, shape_of(2)?);
    let q_heads = node.attr_i64("q_heads").map(|h| h as usize).or_else(|| q.get(1).copied().flatten());
    let kv_heads = node.attr_i64("kv_heads").map(|h| h as usize).or_else(|| k.get(1).copied().flatten());
    let fits = |s: &[Option<usize>], heads: Option<usize>| {
        s.len() == 4 && s[1].is_some() && s[1] == heads && s[3].is_some() && s[3] == q[3]
    };
    match (q_heads, kv_heads) {
        (Some(qh), Some(kh)) if kh > 0 && qh % kh == 0 && fits(&q, q_heads) && fits(&k, kv_heads) && fits(&v, kv_heads) => {
            Ok(AttentionShape { layers: 0, q_heads: qh, kv_heads: kh, head_dim: q[3].unwrap_or(0) })
        }
        _ => Err(fail(format!("q {q:?}, k {k:?}, v {v:?} are not [batch, heads, seq, head_dim] with fixed heads ({q_heads:?} query, {kv_heads:?} KV) and head size"))),
    }
}

fn logits_value(program: &Program, locs: &[Loc]) -> Result<usize, ExecError> {
    let mut candidates = program.outputs.iter().copied().filter(|&v| locs[v] != Loc::Cache);
    let logits =
        candidates.next().ok_or_else(|| value_err("logits", "the program has no output besides the KV cache"))?;
    let info = &program.values[logits];
    if info.elem != Some(ElemType::F32) || info.shape.last().and_then(|d| d.as_const()).is_none() {
        return Err(value_err(&info.name, "the logits must be f32 with a fixed vocabulary axis"));
    }
    if let Some(extra) = candidates.next() {
        return Err(value_err(
            &program.values[extra].name,
            "is a second graph output; the executor returns the logits only",
        ));
    }
    Ok(logits)
}

/// Gives every buffer-held value one of as few buffers as liveness allows: a buffer is reused
/// once every value stored in it has been read for the last time. Returns the number of
/// buffers; `locs` then names buffers instead of storage roots.
fn assign_buffers(program: &Program, locs: &mut [Loc], roots: usize, logits: usize) -> usize {
    const FOREVER: usize = usize::MAX;
    let mut last_use = vec![0usize; roots];
    let mut defined_at = vec![FOREVER; roots];
    for (n, node) in program.nodes.iter().enumerate() {
        for &v in &node.outputs {
            if let Loc::Buf(r) = locs[v] {
                defined_at[r] = defined_at[r].min(n);
                last_use[r] = last_use[r].max(n);
            }
        }
        for v in node.inputs.iter().flatten() {
            if let Loc::Buf(r) = locs[*v] {
                last_use[r] = last_use[r].max(n);
            }
        }
    }
    if let Loc::Buf(r) = locs[logits] {
        last_use[r] = FOREVER;
    }
    let mut buffer_of = vec![usize::MAX; roots];
    let mut free: Vec<usize> = Vec::new();
    let mut buffers = 0;
    for (n, node) in program.nodes.iter().enumerate() {
        for &v in &node.outputs {
            if let Loc::Buf(r) = locs[v] {
                if defined_at[r] == n && buffer_of[r] == usize::MAX {
                    buffer_of[r] = free.pop().unwrap_or_else(|| {
                        buffers += 1;
                        buffers - 1
                    });
                }
            }
        }
        // Released after this node's outputs took theirs, so no output shares an input's buffer.
        let mut released: Vec<usize> = node
            .inputs
            .iter()
            .flatten()
            .chain(&node.outputs)
            .filter_map(|&v| match locs[v] {
                Loc::Buf(r) if last_use[r] == n => Some(r),
                _ => None,
            })
            .collect();
        released.sort_unstable();
        released.dedup();
        free.extend(released.into_iter().map(|r| buffer_of[r]));
    }
    for loc in locs.iter_mut() {
        if let Loc::Buf(r) = loc {
            *loc = Loc::Buf(buffer_of[*r]);
        }
    }
    buffers
}

/// The i64 inputs of an integer op: constants or values computed by integer ops.
fn int_inputs(
    node: &NodeInfo,
    locs: &[Loc],
    arity: usize,
    values: &[super::program::ValueInfo],
) -> Result<Vec<usize>, ExecError> {
    (0..arity)
        .map(|slot| {
            let v =
                node.input(slot).ok_or_else(|| node_err(&node.name, &node.op, format!("input {slot} is missing")))?;
            if values[v].elem != Some(ElemType::I64)
                || !matches!(locs[v], Loc::ConstI64(_) | Loc::I64Buf(_) | Loc::Ids | Loc::Positions)
            {
                return Err(node_err(
                    &node.name,
                    &node.op,
                    format!(
                        "input {slot} (`{}`, {}) is not an integer tensor the executor holds",
                        values[v].name, values[v].dtype
                    ),
                ));
            }
            Ok(v)
        })
        .collect()
}

/// The name of the weight `node` reads directly at `slot`.
fn weight_name<'p>(program: &'p Program, node: &NodeInfo, slot: usize) -> Option<&'p str> {
    match &program.values[node.input(slot)?].def {
        ValueDef::Weight(name) => Some(name),
        _ => None,
    }
}

/// The weight `v` is, through aliases (Reshape, Unsqueeze, ...).
fn weight_root<'p>(program: &'p Program, producer: &[Option<usize>], mut v: usize) -> Option<&'p str> {
    loop {
        match &program.values[v].def {
            ValueDef::Weight(name) => return Some(name),
            ValueDef::Node => {
                let node = &program.nodes[producer[v]?];
                if !ALIAS_OPS.contains(&node.op.as_str()) {
                    return None;
                }
                v = node.input(0)?;
            }
            _ => return None,
        }
    }
}

/// Checks a WGemm node against the layout description of the packed weights it reads: the same
/// K, N, bits and block size, packed from the node's own scale and zero-point weights.
fn check_packed_layout(
    program: &Program,
    node: &NodeInfo,
    layout: &PackedLayout,
    (k, n, bits, block_size): (usize, usize, usize, usize),
) -> Result<(), String> {
    if (layout.k, layout.n, layout.bits, layout.block_size) != (k, n, bits, block_size) {
        return Err(format!(
            "packed weights of `{}` are K={} N={} {}-bit in blocks of {}, the node says K={k} N={n} {bits}-bit in blocks of {block_size}",
            layout.source, layout.k, layout.n, layout.bits, layout.block_size
        ));
    }
    if weight_name(program, node, 2) != Some(layout.scales.as_str())
        || weight_name(program, node, 3) != layout.zero_points.as_deref()
    {
        return Err(format!(
            "packed weights of `{}` were packed with scales `{}` and zero points {:?}, not the node's",
            layout.source, layout.scales, layout.zero_points
        ));
    }
    Ok(())
}

/// The u8 bytes of a weight read by `node` at `slot`.
fn u8_weight<'b>(
    node: &NodeInfo,
    locs: &[Loc],
    views: &[TensorView<'b>],
    values: &[super::program::ValueInfo],
    slot: usize,
) -> Result<&'b [u8], ExecError> {
    let fail = |problem: String| node_err(&node.name, &node.op, problem);
    let v = node.input(slot).ok_or_else(|| fail(format!("input {slot} is missing")))?;
    match locs[v] {
        Loc::Weight(i) if views[i].dtype == Dtype::U8 && values[v].dtype == "u8" => Ok(views[i].bytes),
        _ => Err(fail(format!("input {slot} (`{}`) is not a u8 weight", values[v].name))),
    }
}

/// The f32 GEMM panels of `layout`'s weight (read for `value`), checked against its sizes.
fn panels_view<'b>(
    weight: &impl Fn(&str) -> Option<TensorView<'b>>,
    layout: &GemmLayout,
    value: &str,
) -> Result<(TensorView<'b>, &'b [f32]), ExecError> {
    let name = gemm_panels_name(&layout.source);
    let view = weight(&name)
        .ok_or_else(|| value_err(&layout.source, format!("packed tensor `{name}` is not in the bundle")))?;
    let panels = f32_weight(value, view)?;
    if panels.len() != f32_panels_len(layout.k, layout.n) {
        return Err(value_err(
            &name,
            format!("holds {} values, not the panels of {}×{}", panels.len(), layout.k, layout.n),
        ));
    }
    Ok((view, panels))
}

/// The f32 elements of a weight read by `node` at `slot`.
fn f32_weight_input<'b>(
    node: &NodeInfo,
    locs: &[Loc],
    weights: &[&'b [f32]],
    values: &[super::program::ValueInfo],
    slot: usize,
) -> Result<&'b [f32], ExecError> {
    let fail = |problem: String| node_err(&node.name, &node.op, problem);
    let v = node.input(slot).ok_or_else(|| fail(format!("input {slot} is missing")))?;
    match locs[v] {
        Loc::Weight(i) if values[v].elem == Some(ElemType::F32) => Ok(weights[i]),
        _ => Err(fail(format!("input {slot} (`{}`) is not an f32 weight", values[v].name))),
    }
}

/// A stored i64 weight (raw little-endian bytes) as constants.
fn i64_weight(value: &str, view: TensorView<'_>) -> Result<Vec<i64>, ExecError> {
    if !matches!(view.dtype, Dtype::U8 | Dtype::I8) || !view.bytes.len().is_multiple_of(8) {
        return Err(value_err(value, format!("weight `{}` ({}) is not i64 bytes", view.name, view.dtype)));
    }
    Ok(view.bytes.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes"))).collect())
}

/// The f32 elements of a stored weight, read in place.
fn f32_weight<'b>(value: &str, view: TensorView<'b>) -> Result<&'b [f32], ExecError> {
    if view.dtype != Dtype::F32 {
        return Err(value_err(
            value,
            format!("weight `{}` is stored as {}; the host executor runs float programs", view.name, view.dtype),
        ));
    }
    if !cfg!(target_endian = "little") || view.bytes.as_ptr().align_offset(align_of::<f32>()) != 0 {
        return Err(value_err(value, format!("weight `{}` is not 4-byte aligned little-endian f32", view.name)));
    }
    // SAFETY: the bytes are aligned for f32 (checked), live as long as the bundle's map ('b), and
    // every bit pattern is a valid f32.
    Ok(unsafe { std::slice::from_raw_parts(view.bytes.as_ptr().cast::<f32>(), view.bytes.len() / 4) })
}

/// Whether codes of `dtype` are signed (`i8`) or not (`u8`); `None` for other types.
pub(crate) fn code_signedness(dtype: &str) -> Option<bool> {
    match dtype {
        "u8" => Some(false),
        "i8" => Some(true),
        _ => None,
    }
}

fn as_i8(bytes: &[u8]) -> &[i8] {
    // SAFETY: u8 and i8 have the same size and alignment, and every bit pattern is valid.
    unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<i8>(), bytes.len()) }
}

/// Scales and zero points of the quantisation ops: weights or constants.
struct Params<'a, 'b> {
    locs: &'a [Loc],
    weights: &'a [&'b [f32]],
    views: &'a [TensorView<'b>],
    values: &'a [super::program::ValueInfo],
    consts_f32: &'a [Vec<f32>],
    consts_i64: &'a [Vec<i64>],
}

impl Params<'_, '_> {
    fn value(&self, node: &NodeInfo, slot: usize) -> Result<usize, ExecError> {
        node.input(slot).ok_or_else(|| node_err(&node.name, &node.op, format!("input {slot} is missing")))
    }

    fn f32s(&self, node: &NodeInfo, slot: usize) -> Result<Vec<f32>, ExecError> {
        let v = self.value(node, slot)?;
        match self.locs[v] {
            Loc::Weight(i) if self.values[v].elem == Some(ElemType::F32) => Ok(self.weights[i].to_vec()),
            Loc::ConstF32(i) => Ok(self.consts_f32[i].clone()),
            _ => Err(node_err(
                &node.name,
                &node.op,
                format!("input {slot} (`{}`) is not an f32 weight or constant", self.values[v].name),
            )),
        }
    }

    fn ints(&self, node: &NodeInfo, slot: usize) -> Result<Vec<i32>, ExecError> {
        let v = self.value(node, slot)?;
        let info = &self.values[v];
        match (self.locs[v], code_signedness(&info.dtype)) {
            (Loc::Weight(i), Some(signed)) => Ok(self.views[i]
                .bytes
                .iter()
                .map(|&b| if signed { i32::from(b as i8) } else { i32::from(b) })
                .collect()),
            (Loc::ConstI64(i), Some(_)) => Ok(self.consts_i64[i].iter().map(|&x| x as i32).collect()),
            _ => Err(node_err(
                &node.name,
                &node.op,
                format!("input {slot} (`{}`, {}) is not a u8 or i8 weight or constant", info.name, info.dtype),
            )),
        }
    }

    /// One scale and one zero point (0 when the zero point is absent).
    fn per_tensor(&self, node: &NodeInfo, scale_slot: usize, zero_slot: usize) -> Result<(f32, i32), ExecError> {
        let scale = self.f32s(node, scale_slot)?;
        let zero = match node.input(zero_slot) {
            Some(_) => self.ints(node, zero_slot)?,
            None => vec![0],
        };
        match (&scale[..], &zero[..]) {
            ([s], [z]) => Ok((*s, *z)),
            _ => Err(node_err(
                &node.name,
                &node.op,
                format!(
                    "{} scales and {} zero points; the executor takes one per tensor here",
                    scale.len(),
                    zero.len()
                ),
            )),
        }
    }
}

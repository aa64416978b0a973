//! Code generation for Intel NPUs: weightless OpenVINO IR v11 segments cut at attention, static
//! token-block shapes, symmetric int4/int8 decompression subgraphs, and one shared weights file.
//!
//! [`compile`] takes the program the `intel-npu` pipeline extracted and produces:
//!
//! - **Segments.** The program is cut at every `npuc::Attention`: segment `i` runs from the end of
//!   attention `i−1` up to attention `i` and outputs that attention's q and new k/v (BNSH, after
//!   RoPE) and whatever later segments read (the residual stream). The host computes attention over
//!   its paged KV cache and feeds the result to segment `i+1`. The `lm_head` GEMM that produces the
//!   logits is its own segment, run on the last token row only.
//! - **Static shapes.** One network per token block size (`blocks`, default 1 and 64) per segment;
//!   batch is 1. Every network of every block size reads the same constants at the same offsets of
//!   one weights file (`weights.bin`): the `.xml` files hold no weight bytes.
//! - **RoPE tables.** cos/sin are segment inputs of role `rope` (`rope_cos`, `rope_sin`, and
//!   `rope_cos_1`, ... when layers rotate with different tables, as Gemma 3's local and global
//!   layers do; `[1, 1, T, head_dim]` f32): the program's own cos/sin computation is evaluated
//!   here for positions `0..rope_positions` and stored in the weights file (`rope.tables` of the
//!   plan); the host gathers the rows of the block's positions.
//! - **Public opset only.** RmsNorm, SkipRmsNorm, Rope, SwiGlu, GeluGate are decomposed (OpenVINO re-fuses
//!   them; interleaved RoPE swaps its pairs through a `[.., d/2, 2]` view); the row-scaled forms
//!   of the `fp16-rescale` family are decomposed with their rescaling (c = 2^⌊log₂ max|x|⌋ per
//!   row); a weight-only GEMM is `Const i4/i8 [N, G, group]` → `Convert f16` → `Multiply` by
//!   `Const f16 [N, G, 1]` → `Reshape [N, K]` → `Convert f32` → `MatMul (transpose_b)`, the
//!   decompression pattern OpenVINO keeps compressed.
//! - **QDQ (A8W8) programs.** `QuantizeLinear` of an activation is `FakeQuantize`, a QGemm's
//!   int8 weights are `Const i8|u8 [N, K]` → `Convert` → `Subtract` → `Multiply`, and the QGemm a
//!   MatMul of the two followed by its output's FakeQuantize (see [`qdq`]); the lm_head segment is
//!   the last `QuantizeLinear → QGemm → DequantizeLinear`.
//! - **Float models.** Their projections are compressed ([`float::compress`]: symmetric int4 by
//!   default, int8 or f16 on request) in the program both the IR and the host executor run.
//! - **Symmetric weights, one model for both backends.** [`symmetric::symmetrize`] re-quantises
//!   asymmetric weights symmetrically (or refuses them) and rounds scales to f16, reporting the error
//!   per weight; the same transformed program, with the row-scaled ops in their plain f32 forms
//!   ([`symmetric::host_forms`]), is the bundle's host program, so the host executor and OpenVINO
//!   run the very same weight values.
//! - **Plan.** [`IntelIr::plan`] (`npuc-intel/1` JSON) lists the segments with their files,
//!   inputs and outputs per block size, the attentions between them, the schedule, and the RoPE
//!   tables' location in the weights file.

pub mod float;
mod qdq;
pub mod symmetric;
pub mod xml;

use ir::graph::{Graph, NodeId, ValueDef, ValueId};
use ir::{DType, Domain, Node, OpRef, Tensor};
use serde_json::{json, Value as Json};
use std::collections::{BTreeMap, HashMap, HashSet};
use symmetric::{Asymmetric, WeightError};
use xml::{Bin, Et, Net, Port};

#[derive(Debug, thiserror::Error)]
pub enum IntelError {
    #[error("node `{node}`: {msg}")]
    Unsupported { node: String, msg: String },
    #[error("node `{node}` reads weight `{weight}` with asymmetric zero points, which the NPU does not support (re-quantise symmetrically instead of rejecting to compile it)")]
    Asymmetric { node: String, weight: String },
    #[error("value `{value}`: {msg}")]
    Shape { value: String, msg: String },
    #[error("the program has {0}")]
    Structure(String),
}

/// Compile options.
#[derive(Clone, Debug)]
pub struct Options {
    /// Token block sizes, one network per segment each.
    pub blocks: Vec<usize>,
    pub asymmetric: Asymmetric,
    /// Positions the RoPE tables cover (the longest context the bundle can run on this target).
    pub rope_positions: usize,
    /// How float projection weights are stored (see [`float::compress`]).
    pub weights: float::FloatWeights,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            blocks: vec![1, 64],
            asymmetric: Asymmetric::Requantize,
            rope_positions: 4096,
            weights: float::FloatWeights::Int4,
        }
    }
}

/// What [`compile`] produces.
pub struct IntelIr {
    /// `(file name, IR text)`, e.g. `("seg00_t1.xml", ...)`.
    pub xml: Vec<(String, String)>,
    /// The shared weights file.
    pub weights: Vec<u8>,
    /// The `npuc-intel/1` plan.
    pub plan: Json,
    /// The cost of making the weights symmetric, per weight.
    pub requantized: Vec<WeightError>,
    /// The program the host executor runs: symmetric weights, plain (not row-scaled) forms.
    pub host_program: Graph,
    /// The program the IR was written from (symmetric weights, row-scaled forms, float
    /// activations into every WGemm).
    pub device_program: Graph,
}

pub const WEIGHTS_FILE: &str = "weights.bin";
pub const PLAN_FILE: &str = "plan.json";

/// Symmetrises the weights and writes the IR segments of `program` (see the crate doc).
pub fn compile(program: &Graph, o: &Options) -> Result<IntelIr, IntelError> {
    if o.blocks.is_empty() || o.blocks.contains(&0) {
        return Err(IntelError::Structure(format!("invalid token block sizes {:?}", o.blocks)));
    }
    let (device, mut requantized) = symmetric::symmetrize(program, o.asymmetric)?;
    let (device, f16_weights, compressed) = float::compress(&device, o.weights)?;
    let device = symmetric::float_activations(device);
    requantized.extend(compressed);
    let parts = partition(&device)?;
    let mut bin = Bin::default();
    let rope = rope_tables(&device, &parts, o.rope_positions)?;
    let (width, rope_positions) = (rope.width, rope.positions);
    let mut table_json = serde_json::Map::new();
    for (name, values) in &rope.tables {
        let at = bin.keyed(name, || values.iter().flat_map(|v| v.to_le_bytes()).collect());
        table_json.insert(name.clone(), json!({"offset": at.0, "size": at.1}));
    }
    let mut xml = Vec::new();
    let mut segments = Vec::new();
    let mut blocks = o.blocks.clone();
    blocks.sort_unstable();
    blocks.dedup();
    for (si, seg) in parts.segments.iter().enumerate() {
        let seg_blocks: Vec<usize> = if seg.last_row_only { vec![1] } else { blocks.clone() };
        let mut files = BTreeMap::new();
        let mut inputs: Vec<Json> = Vec::new();
        let mut outputs: Vec<Json> = Vec::new();
        for &t in &seg_blocks {
            let name = format!("{}_t{t}", seg.name);
            let mut lower = Lower {
                g: &device,
                bin: &mut bin,
                net: Net::new(&name),
                vals: HashMap::new(),
                t,
                width,
                rope_names: &rope.names,
                f16_weights: &f16_weights,
                quantized: HashMap::new(),
            };
            let (ins, outs) = lower.segment(seg)?;
            let file = format!("{name}.xml");
            xml.push((file.clone(), lower.net.to_xml()));
            files.insert(t.to_string(), json!(file));
            if inputs.is_empty() {
                inputs = ins
                    .iter()
                    .map(|(n, role, et, _)| json!({"name": n, "role": role, "dtype": et.name(), "shape": {}}))
                    .collect();
                outputs = outs.iter().map(|(n, _)| json!({"name": n, "shape": {}})).collect();
            }
            for (i, (_, _, _, shape)) in ins.iter().enumerate() {
                inputs[i]["shape"][t.to_string()] = json!(shape);
            }
            for (i, (_, shape)) in outs.iter().enumerate() {
                outputs[i]["shape"][t.to_string()] = json!(shape);
            }
        }
        segments.push(json!({
            "name": seg.name, "index": si, "files": files, "last_row_only": seg.last_row_only,
            "inputs": inputs, "outputs": outputs,
        }));
    }
    let attention: Vec<Json> = parts
        .attentions
        .iter()
        .enumerate()
        .map(|(layer, &a)| {
            let n = device.node(a);
            let name = |i: usize| n.inputs[i].map(|v| device.value(v).name.clone());
            let head_dim =
                n.inputs[0].and_then(|v| device.value(v).shape.last().and_then(|d| d.as_known())).unwrap_or(0);
            let scale = n.attrs.float("scale").ok().flatten().unwrap_or(1.0 / (head_dim as f32).sqrt());
            json!({
                "layer": layer, "node": n.name, "q": name(0), "k": name(1), "v": name(2),
                "y": device.value(n.outputs[0]).name,
                "q_heads": n.attrs.int("q_heads").ok().flatten(), "kv_heads": n.attrs.int("kv_heads").ok().flatten(),
                "head_dim": head_dim, "scale": scale,
                "window": n.attrs.int("window").ok().flatten().filter(|&w| w > 0),
            })
        })
        .collect();
    let mut schedule = Vec::new();
    for (si, seg) in parts.segments.iter().enumerate() {
        schedule.push(json!({"segment": si}));
        for (ai, &stage) in parts.attention_stage.iter().enumerate() {
            if Some(stage) == seg.stage {
                schedule.push(json!({"attention": ai}));
            }
        }
    }
    let plan = json!({
        "format": "npuc-intel/1",
        "weights_file": WEIGHTS_FILE,
        "weights_bytes": bin.bytes.len(),
        "blocks": blocks,
        "logits": device.value(device.outputs[0]).name,
        "rope": {"positions": rope_positions, "width": width, "tables": table_json},
        "segments": segments,
        "attention": attention,
        "schedule": schedule,
    });
    let host_program = symmetric::host_forms(&device);
    Ok(IntelIr { xml, weights: bin.bytes, plan, requantized, host_program, device_program: device })
}

struct Segment {
    name: String,
    /// The attention stage the segment computes (`None` for the lm_head).
    stage: Option<usize>,
    nodes: Vec<NodeId>,
    last_row_only: bool,
    inputs: Vec<ValueId>,
    outputs: Vec<ValueId>,
}

struct Parts {
    segments: Vec<Segment>,
    attentions: Vec<NodeId>,
    attention_stage: Vec<usize>,
    /// Rope cos and sin values (computed on the host).
    cos: HashSet<ValueId>,
    sin: HashSet<ValueId>,
    /// Nodes that compute the RoPE tables.
    table_nodes: Vec<NodeId>,
}

fn producer(g: &Graph, v: ValueId) -> Option<NodeId> {
    match g.value(v).def {
        ValueDef::Node { node, .. } => Some(node),
        _ => None,
    }
}

fn is_op(n: &Node, op: &str) -> bool {
    n.domain == Domain::Npuc && n.op == op
}

fn partition(g: &Graph) -> Result<Parts, IntelError> {
    let (mut cos, mut sin) = (HashSet::new(), HashSet::new());
    for n in g.nodes.iter().filter(|n| is_op(n, "Rope")) {
        cos.extend(n.inputs.get(1).copied().flatten());
        sin.extend(n.inputs.get(2).copied().flatten());
    }
    // The table computation: ancestors of cos/sin, stopping at Shape nodes (a shape is static).
    let mut table = vec![false; g.nodes.len()];
    let mut stack: Vec<ValueId> = cos.iter().chain(sin.iter()).copied().collect();
    while let Some(v) = stack.pop() {
        let Some(p) = producer(g, v) else { continue };
        if table[p.0 as usize] {
            continue;
        }
        table[p.0 as usize] = true;
        if g.node(p).op != "Shape" {
            stack.extend(g.node(p).inputs.iter().flatten().copied());
        }
    }
    let logits = *g.outputs.first().ok_or_else(|| IntelError::Structure("no outputs".into()))?;
    // Device nodes: what the logits need, stopping at the tables and at attention (whose q/k/v the
    // segments produce).
    let mut needed = vec![false; g.nodes.len()];
    let mut stack = vec![logits];
    let mut seen = HashSet::new();
    while let Some(v) = stack.pop() {
        if !seen.insert(v) || cos.contains(&v) || sin.contains(&v) {
            continue;
        }
        let Some(p) = producer(g, v) else { continue };
        let node = g.node(p);
        needed[p.0 as usize] = true;
        if is_op(node, "Attention") {
            // A mask input is the model's attention mask over the sequence: the host runs one
            // unpadded sequence, where it is all ones and attention is causal only.
            stack.extend(node.inputs.iter().take(3).flatten().copied());
        } else {
            if table[p.0 as usize] {
                return Err(IntelError::Unsupported {
                    node: node.name.clone(),
                    msg: "a value of the RoPE table computation is also used by the model".into(),
                });
            }
            stack.extend(node.inputs.iter().flatten().copied());
        }
    }
    let mut stage_of_value: HashMap<ValueId, usize> = HashMap::new();
    let mut node_stage = vec![0usize; g.nodes.len()];
    let mut attentions = Vec::new();
    let mut attention_stage = Vec::new();
    for (ni, n) in g.nodes.iter().enumerate() {
        if !needed[ni] {
            continue;
        }
        let inputs: &[Option<ValueId>] = if is_op(n, "Attention") { &n.inputs[..3] } else { &n.inputs };
        let s = inputs.iter().flatten().map(|v| stage_of_value.get(v).copied().unwrap_or(0)).max().unwrap_or(0);
        node_stage[ni] = s;
        let out_stage = if is_op(n, "Attention") {
            attentions.push(NodeId(ni as u32));
            attention_stage.push(s);
            s + 1
        } else {
            s
        };
        for &o in &n.outputs {
            stage_of_value.insert(o, out_stage);
        }
    }
    if attentions.is_empty() {
        return Err(IntelError::Structure("no npuc::Attention to cut segments at".into()));
    }
    let last_stage = attention_stage.iter().max().copied().unwrap_or(0) + 1;
    let head = lm_head(g, logits);
    let mut segments: Vec<Segment> = (0..=last_stage)
        .map(|s| Segment {
            name: format!("seg{s:02}"),
            stage: Some(s),
            nodes: vec![],
            last_row_only: false,
            inputs: vec![],
            outputs: vec![],
        })
        .collect();
    if !head.is_empty() {
        segments.push(Segment {
            name: "lm_head".into(),
            stage: None,
            nodes: head.clone(),
            last_row_only: true,
            inputs: vec![],
            outputs: vec![],
        });
    }
    // Nodes computed from weights and constants only are lowered where they are read.
    let compile_time = g.compile_time_nodes();
    let mut seg_of_node: HashMap<NodeId, usize> = HashMap::new();
    for (ni, n) in g.nodes.iter().enumerate() {
        let id = NodeId(ni as u32);
        if compile_time[ni] {
            continue;
        }
        if !needed[ni] || is_op(n, "Attention") || head.contains(&id) {
            if head.contains(&id) {
                seg_of_node.insert(id, segments.len() - 1);
            }
            continue;
        }
        segments[node_stage[ni]].nodes.push(id);
        seg_of_node.insert(id, node_stage[ni]);
    }
    // Boundary values.
    let mut readers: HashMap<ValueId, HashSet<Option<usize>>> = HashMap::new();
    for (ni, n) in g.nodes.iter().enumerate() {
        if !needed[ni] {
            continue;
        }
        let id = NodeId(ni as u32);
        let reader = if is_op(n, "Attention") { None } else { seg_of_node.get(&id).copied() };
        let inputs: &[Option<ValueId>] = if is_op(n, "Attention") { &n.inputs[..3] } else { &n.inputs };
        for &v in inputs.iter().flatten() {
            readers.entry(v).or_default().insert(reader);
        }
    }
    readers.entry(logits).or_default().insert(None);
    for (si, seg) in segments.iter_mut().enumerate() {
        let mine: HashSet<NodeId> = seg.nodes.iter().copied().collect();
        let mut ins = Vec::new();
        let mut outs = Vec::new();
        for &ni in &seg.nodes {
            let n = g.node(ni);
            for &v in n.inputs.iter().flatten() {
                let external = match g.value(v).def {
                    ValueDef::Input => true,
                    ValueDef::Node { node, .. } => !mine.contains(&node) && !compile_time[node.0 as usize],
                    _ => false,
                };
                if external && !ins.contains(&v) {
                    ins.push(v);
                }
            }
            for &o in &n.outputs {
                let r = readers.get(&o);
                if r.is_some_and(|r| r.iter().any(|&x| x != Some(si))) && !outs.contains(&o) {
                    outs.push(o);
                }
            }
        }
        seg.inputs = ins;
        seg.outputs = outs;
    }
    segments.retain(|s| !s.nodes.is_empty());
    let table_nodes = (0..g.nodes.len()).filter(|&i| table[i]).map(|i| NodeId(i as u32)).collect();
    Ok(Parts { segments, attentions, attention_stage, cos, sin, table_nodes })
}

/// The nodes of the lm_head segment, in program order: the GEMM that produces the logits — a
/// WGemm or MatMul, or in a QDQ program `QuantizeLinear → QGemm → DequantizeLinear` (the
/// QuantizeLinear when only that QGemm reads its codes) — or none.
fn lm_head(g: &Graph, logits: ValueId) -> Vec<NodeId> {
    let Some(p) = producer(g, logits) else { return vec![] };
    let n = g.node(p);
    if matches!((n.domain, n.op), (Domain::Npuc, "WGemm" | "WGemmRowScaled") | (Domain::Onnx, "MatMul")) {
        return vec![p];
    }
    if (n.domain, n.op) != (Domain::Onnx, "DequantizeLinear") {
        return vec![];
    }
    let Some(q) = n.inputs[0].and_then(|v| producer(g, v)).filter(|&q| is_op(g.node(q), "QGemm")) else {
        return vec![];
    };
    let mut nodes = vec![q, p];
    let a = g.node(q).inputs[0];
    if let Some(qa) = a.and_then(|v| producer(g, v)) {
        let readers = g.nodes.iter().filter(|r| r.inputs.contains(&a)).count();
        if g.node(qa).op == "QuantizeLinear" && readers == 1 {
            nodes.insert(0, qa);
        }
    }
    nodes
}

/// The RoPE tables the host feeds: each distinct cos or sin table (`rope_cos`, `rope_sin`, then
/// `rope_cos_1`, ... for models whose layers rotate differently, as Gemma 3's local and global
/// layers do), `[positions, width]` row-major, and the table each Rope input reads.
struct RopeTables {
    tables: Vec<(String, Vec<f32>)>,
    names: HashMap<ValueId, String>,
    width: usize,
    positions: usize,
}

/// Evaluates the program's cos/sin computation for positions `0..positions` (batch 1, no past)
/// with the reference evaluator (see [`RopeTables`]).
fn rope_tables(g: &Graph, parts: &Parts, positions: usize) -> Result<RopeTables, IntelError> {
    let mut out = RopeTables { tables: vec![], names: HashMap::new(), width: 0, positions: 0 };
    if parts.cos.is_empty() {
        return Ok(out);
    }
    // A table gathered from a cache covers at most the cache's rows: a first evaluation for one
    // position finds them.
    let (_, rows) = eval_tables(g, parts, 1)?;
    out.positions = positions.min(rows);
    let (vals, _) = eval_tables(g, parts, out.positions)?;
    for (set, what) in [(&parts.cos, "cos"), (&parts.sin, "sin")] {
        let mut set: Vec<ValueId> = set.iter().copied().collect();
        set.sort_unstable();
        // This set's tables, as indices into `out.tables`.
        let mut distinct: Vec<usize> = Vec::new();
        for v in set {
            let t = vals
                .get(&v)
                .ok_or_else(|| IntelError::Structure(format!("a RoPE {what} table that is not computed")))?;
            let width = *t.shape.last().unwrap_or(&0);
            let data = t.to_f32_vec();
            if width == 0 || data.len() != out.positions * width || (out.width != 0 && width != out.width) {
                let msg = format!("RoPE {what} of shape {:?}", t.shape);
                return Err(IntelError::Shape { value: g.value(v).name.clone(), msg });
            }
            out.width = width;
            let k = distinct.iter().position(|&i| out.tables[i].1 == data).unwrap_or(distinct.len());
            let name = if k == 0 { format!("rope_{what}") } else { format!("rope_{what}_{k}") };
            if k == distinct.len() {
                distinct.push(out.tables.len());
                out.tables.push((name.clone(), data));
            }
            out.names.insert(v, name);
        }
    }
    Ok(out)
}

/// The table computation's values for `positions` positions, and the fewest rows a Gather in it
/// reads from.
fn eval_tables(g: &Graph, parts: &Parts, positions: usize) -> Result<(HashMap<ValueId, Tensor>, usize), IntelError> {
    let dims = |name: &str| match name {
        "batch_size" | "batch" => Some(1),
        "past_sequence_length" => Some(0),
        "sequence_length" | "total_sequence_length" => Some(positions as i64),
        _ => None,
    };
    let static_shape = |v: ValueId| -> Result<Vec<usize>, IntelError> {
        g.value(v).shape.iter().map(|d| d.eval(&dims).map(|x| x as usize)).collect::<Option<Vec<_>>>().ok_or_else(
            || IntelError::Shape {
                value: g.value(v).name.clone(),
                msg: "has a size the RoPE tables cannot bind".into(),
            },
        )
    };
    let mut rows = usize::MAX;
    let mut vals: HashMap<ValueId, Tensor> = HashMap::new();
    for &ni in &parts.table_nodes {
        let n = g.node(ni);
        let fail = |msg: String| IntelError::Unsupported { node: n.name.clone(), msg };
        if n.op == "Shape" {
            let v = n.inputs[0].ok_or_else(|| fail("Shape without input".into()))?;
            let s: Vec<i64> = static_shape(v)?.iter().map(|&d| d as i64).collect();
            vals.insert(n.outputs[0], Tensor::from_i64(DType::I64, vec![s.len()], s));
            continue;
        }
        let mut inputs: Vec<Option<Tensor>> = Vec::new();
        for i in &n.inputs {
            inputs.push(match i {
                None => None,
                Some(v) => Some(match &g.value(*v).def {
                    ValueDef::Const(t) => t.clone(),
                    ValueDef::Weight(w) => g.weights.get(*w).to_tensor().map_err(|e| fail(e.to_string()))?,
                    ValueDef::Node { .. } => vals
                        .get(v)
                        .cloned()
                        .ok_or_else(|| fail("reads a value outside the table computation".into()))?,
                    ValueDef::Input => {
                        let name = &g.value(*v).name;
                        let shape = static_shape(*v)?;
                        let count: usize = shape.iter().product();
                        if name.contains("position") {
                            Tensor::from_i64(g.value(*v).dtype, shape, (0..count as i64).collect())
                        } else if name.contains("mask") {
                            Tensor::from_i64(g.value(*v).dtype, shape, vec![1; count])
                        } else {
                            return Err(fail(format!("the RoPE tables depend on model input `{name}`")));
                        }
                    }
                }),
            });
        }
        let refs: Vec<Option<&Tensor>> = inputs.iter().map(|t| t.as_ref()).collect();
        // A cache is a table of rows (a Gather of a shape vector is not).
        if n.op == "Gather" && n.inputs[0].is_some_and(|v| !matches!(g.value(v).def, ValueDef::Node { .. })) {
            if let Some(Some(d)) = refs.first().filter(|d| d.is_some_and(|d| d.rank() >= 2)) {
                rows = rows.min(d.shape[0]);
            }
        }
        let op = OpRef { node: &n.name, domain: n.domain, op: n.op, opset: n.opset, attrs: &n.attrs };
        let out = ir::eval::eval_op(&op, &refs, n.outputs.len()).map_err(|e| fail(e.to_string()))?;
        for (o, t) in n.outputs.iter().zip(out) {
            vals.insert(*o, t);
        }
    }
    Ok((vals, rows))
}

struct Lower<'a> {
    g: &'a Graph,
    bin: &'a mut Bin,
    net: Net,
    vals: HashMap<ValueId, Port>,
    t: usize,
    width: usize,
    /// The host-fed RoPE table each Rope cos/sin input reads.
    rope_names: &'a HashMap<ValueId, String>,
    /// f32 weights that hold f16 values, stored as f16.
    f16_weights: &'a HashSet<ir::WeightId>,
    /// Quantised values, represented by their dequantised ports (see [`qdq`]).
    quantized: HashMap<ValueId, qdq::QParams>,
}

impl Lower<'_> {
    fn shape(&self, v: ValueId) -> Result<Vec<usize>, IntelError> {
        let t = self.t as i64;
        let dims = |name: &str| match name {
            "batch_size" | "batch" => Some(1),
            "sequence_length" => Some(t),
            _ => None,
        };
        let val = self.g.value(v);
        val.shape.iter().map(|d| d.eval(&dims).map(|x| x as usize)).collect::<Option<Vec<_>>>().ok_or_else(|| {
            IntelError::Shape {
                value: val.name.clone(),
                msg: format!("shape {:?} is not static in a token block", val.shape),
            }
        })
    }

    /// Lowers one segment: returns its inputs (name, role, type, shape) and outputs (name, shape).
    #[allow(clippy::type_complexity)]
    fn segment(
        &mut self,
        seg: &Segment,
    ) -> Result<(Vec<(String, String, Et, Vec<usize>)>, Vec<(String, Vec<usize>)>), IntelError> {
        let mut ins = Vec::new();
        let mut rope: HashMap<String, Port> = HashMap::new();
        for &v in &seg.inputs {
            let val = self.g.value(v);
            let mut shape = self.shape(v)?;
            if seg.last_row_only {
                if let Some(s) = shape.iter_mut().rev().nth(1) {
                    *s = 1;
                }
            }
            let (role, name) = if let Some(table) = self.rope_names.get(&v) {
                ("rope".to_string(), table.clone())
            } else if matches!(val.def, ValueDef::Input) {
                ("input".to_string(), val.name.clone())
            } else {
                ("value".to_string(), val.name.clone())
            };
            let et = match val.dtype {
                DType::F32 => Et::F32,
                DType::I64 => Et::I64,
                other => {
                    return Err(IntelError::Shape {
                        value: val.name.clone(),
                        msg: format!("segment input of type {other}"),
                    })
                }
            };
            let port = if role == "rope" {
                let canonical = [1, 1, self.t, self.width];
                let p = match rope.get(&name) {
                    Some(p) => p.clone(),
                    None => {
                        let p = self.net.parameter(&name, Et::F32, &canonical);
                        ins.push((name.clone(), role.clone(), Et::F32, canonical.to_vec()));
                        rope.insert(name.clone(), p.clone());
                        p
                    }
                };
                if p.shape != shape {
                    self.net.reshape(self.bin, &p, &shape)
                } else {
                    p
                }
            } else {
                let p = self.net.parameter(&name, et, &shape);
                ins.push((name, role, et, shape));
                p
            };
            self.vals.insert(v, port);
        }
        for &ni in &seg.nodes {
            self.node(self.g.node(ni))?;
        }
        let mut outs = Vec::new();
        for &o in &seg.outputs {
            let p = self.vals[&o].clone();
            let name = self.g.value(o).name.clone();
            self.net.result(&p, &name);
            outs.push((name, p.shape.clone()));
        }
        Ok((ins, outs))
    }

    /// The port of a value: lowered already, or a constant.
    fn port(&mut self, v: ValueId) -> Result<Port, IntelError> {
        if let Some(p) = self.vals.get(&v) {
            return Ok(p.clone());
        }
        let val = self.g.value(v);
        let p = match &val.def {
            ValueDef::Weight(id) if self.f16_weights.contains(id) => {
                let g = self.g;
                let w = g.weights.get(*id);
                let r = self.bin.keyed(&format!("f16w:{}", w.name), || {
                    w.bytes
                        .chunks_exact(4)
                        .flat_map(|c| half::f16::from_f32(f32::from_le_bytes([c[0], c[1], c[2], c[3]])).to_le_bytes())
                        .collect()
                });
                let c = self.net.constant(Et::F16, &w.shape, r);
                self.net.convert(&c, Et::F32)
            }
            ValueDef::Weight(w) => {
                let w = self.g.weights.get(*w);
                let et = match w.dtype {
                    DType::F32 => Et::F32,
                    DType::F16 => Et::F16,
                    DType::I64 => Et::I64,
                    DType::I32 => Et::I32,
                    DType::I8 => Et::I8,
                    DType::U8 => Et::U8,
                    other => {
                        return Err(IntelError::Shape { value: w.name.clone(), msg: format!("weight of type {other}") })
                    }
                };
                let bytes = w.bytes.clone();
                let r = self.bin.keyed(&format!("raw:{}", w.name), || bytes.to_vec());
                self.net.constant(et, &w.shape, r)
            }
            ValueDef::Const(t) => match t.dtype {
                DType::F32 | DType::F64 | DType::F16 => self.net.const_f32(self.bin, &t.to_f32_vec(), &t.shape),
                DType::I64 | DType::I32 => self.net.const_i64(self.bin, t.as_i64().unwrap_or(&[]), &t.shape),
                other => {
                    return Err(IntelError::Shape { value: val.name.clone(), msg: format!("constant of type {other}") })
                }
            },
            ValueDef::Node { node, .. } if self.g.compile_time_nodes()[node.0 as usize] => {
                self.node(self.g.node(*node))?;
                return Ok(self.vals[&v].clone());
            }
            _ => {
                return Err(IntelError::Shape {
                    value: val.name.clone(),
                    msg: "is read before it is computed in its segment".into(),
                })
            }
        };
        self.vals.insert(v, p.clone());
        Ok(p)
    }

    fn const_ints(&self, v: Option<ValueId>) -> Option<Vec<i64>> {
        match &self.g.value(v?).def {
            ValueDef::Const(t) => t.as_i64().map(|s| s.to_vec()),
            ValueDef::Weight(w) => self.g.weights.get(*w).to_tensor().ok()?.as_i64().map(|s| s.to_vec()),
            _ => None,
        }
    }

    /// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))` in public ops.
    fn gelu_tanh(&mut self, x: &Port) -> Result<Port, String> {
        let (c, k, one, half) = (self.scalar(0.797_884_6), self.scalar(0.044715), self.scalar(1.0), self.scalar(0.5));
        let x2 = self.net.binary("Multiply", x, x)?;
        let x3 = self.net.binary("Multiply", &x2, x)?;
        let kx3 = self.net.binary("Multiply", &k, &x3)?;
        let inner = self.net.binary("Add", x, &kx3)?;
        let scaled = self.net.binary("Multiply", &c, &inner)?;
        let t = self.net.unary("Tanh", &scaled);
        let onept = self.net.binary("Add", &one, &t)?;
        let xt = self.net.binary("Multiply", x, &onept)?;
        self.net.binary("Multiply", &half, &xt)
    }

    fn scalar(&mut self, v: f32) -> Port {
        self.net.const_f32(self.bin, &[v], &[])
    }

    /// c = 2^⌊log₂ max|x|⌋ per row (last axis), as `row_scale` defines it (tiny rows use 2⁻¹²⁶).
    fn row_scale(&mut self, x: &Port) -> Result<Port, String> {
        let abs = self.net.unary("Abs", x);
        let max = self.net.reduce_last(self.bin, "ReduceMax", &abs);
        let tiny = self.scalar(f32::MIN_POSITIVE);
        let max = self.net.binary("Maximum", &max, &tiny)?;
        let log = self.net.unary("Log", &max);
        let ln2 = self.scalar(std::f32::consts::LN_2);
        let l2 = self.net.binary("Divide", &log, &ln2)?;
        let e = self.net.unary("Floor", &l2);
        let two = self.scalar(2.0);
        self.net.binary("Power", &two, &e)
    }

    /// x / √(mean(x²) + eps) · γ, or the row-scaled form: u = x/c, m = mean(u²), e = (√eps/c)².
    fn rms_norm(&mut self, x: &Port, gamma: &Port, eps: f32, row_scaled: bool) -> Result<Port, String> {
        let two = self.scalar(2.0);
        let (u, e) = if row_scaled {
            let c = self.row_scale(x)?;
            let u = self.net.binary("Divide", x, &c)?;
            let root = self.scalar(eps.sqrt());
            let t = self.net.binary("Divide", &root, &c)?;
            let e = self.net.binary("Multiply", &t, &t)?;
            (u, e)
        } else {
            (x.clone(), self.scalar(eps))
        };
        let sq = self.net.binary("Power", &u, &two)?;
        let m = self.net.reduce_last(self.bin, "ReduceMean", &sq);
        let me = self.net.binary("Add", &m, &e)?;
        let r = self.net.unary("Sqrt", &me);
        let y = self.net.binary("Divide", &u, &r)?;
        self.net.binary("Multiply", &y, gamma)
    }

    /// The symmetric weight of a WGemm as `i4`/`i8` [N, G, group] → f16 → × f16 scale [N, G, 1] →
    /// [N, K] → f32.
    fn wgemm_weight(&mut self, n: &Node) -> Result<Port, String> {
        let attr = |k: &str| n.attrs.int(k).ok().flatten().unwrap_or(0).max(0) as usize;
        let (k, nn, bits, block) = (attr("K"), attr("N"), attr("bits"), attr("block_size"));
        if n.inputs.get(3).copied().flatten().is_some() {
            return Err("zero points remain after symmetrisation".into());
        }
        let (Some(wv), Some(sv)) = (n.inputs[1], n.inputs[2]) else { return Err("missing weights".into()) };
        let (Some(wid), Some(sid)) = (symmetric::weight_of(self.g, wv), symmetric::weight_of(self.g, sv)) else {
            return Err("weights must be model weights".into());
        };
        let groups = k.div_ceil(block);
        let w = self.g.weights.get(wid);
        let s = self.g.weights.get(sid);
        let wbytes = w.bytes.clone();
        let (et, flip) = if bits == 4 { (Et::I4, 0x88u8) } else { (Et::I8, 0x80u8) };
        let wr = self.bin.keyed(&format!("sym:{}", w.name), || wbytes.iter().map(|b| b ^ flip).collect());
        let codes = self.net.constant(et, &[nn, groups, block], wr);
        let sdata = s.to_tensor().map_err(|e| e.to_string())?.to_f32_vec();
        let sr = self.bin.keyed(&format!("f16:{}", s.name), || {
            sdata.iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect()
        });
        let scale = self.net.constant(Et::F16, &[nn, groups, 1], sr);
        let wf = self.net.convert(&codes, Et::F16);
        let ws = self.net.binary("Multiply", &wf, &scale)?;
        let mut w2 = self.net.reshape(self.bin, &ws, &[nn, groups * block]);
        if groups * block != k {
            w2 = self.net.slice(self.bin, &w2, 1, 0, k);
        }
        Ok(self.net.convert(&w2, Et::F32))
    }

    fn node(&mut self, n: &Node) -> Result<(), IntelError> {
        let fail = |msg: String| IntelError::Unsupported { node: n.name.clone(), msg };
        // Codes are read by what dequantises them, or passed on by what only moves elements.
        let codes_in = n.inputs.iter().flatten().find(|v| self.quantized.contains_key(v)).copied();
        let passes_codes = qdq::moves_elements(n) && n.inputs[0].is_some_and(|v| self.quantized.contains_key(&v));
        if let Some(c) = codes_in {
            let reads_codes = matches!((n.domain, n.op), (Domain::Onnx, "DequantizeLinear") | (Domain::Npuc, "QGemm"));
            if !reads_codes && !passes_codes {
                return Err(fail(format!(
                    "{}::{} reads the quantised codes `{}` (only DequantizeLinear, QGemm and ops that move elements may)",
                    n.domain,
                    n.op,
                    self.g.value(c).name
                )));
            }
        }
        let r = self.node_inner(n).map_err(fail)?;
        if passes_codes {
            let q = self.quantized[&n.inputs[0].unwrap()];
            for &o in &n.outputs {
                self.quantized.insert(o, q);
            }
        }
        for (o, p) in n.outputs.iter().zip(r) {
            let want = self.shape(*o)?;
            let got_rows = if want.len() >= 2 && p.shape.len() == want.len() { p.shape[want.len() - 2] } else { 0 };
            // The lm_head segment runs on one row whatever the block.
            if p.shape != want && !(got_rows == 1 && p.shape.last() == want.last()) {
                return Err(IntelError::Unsupported {
                    node: n.name.clone(),
                    msg: format!("lowered to shape {:?}, the program says {:?}", p.shape, want),
                });
            }
            self.vals.insert(*o, p);
        }
        Ok(())
    }

    fn node_inner(&mut self, n: &Node) -> Result<Vec<Port>, String> {
        let input = |i: usize| n.inputs.get(i).copied().flatten().ok_or_else(|| format!("input {i} is missing"));
        let eps = n.attrs.float_or("epsilon", 1e-5).map_err(|e| e.to_string())?;
        let out_shape = |s: &Self, i: usize| s.shape(n.outputs[i]).map_err(|e| e.to_string());
        let one = |p: Port| Ok(vec![p]);
        match (n.domain, n.op) {
            (Domain::Onnx, "Reshape" | "Unsqueeze" | "Squeeze" | "Flatten" | "Identity") => {
                let x = self.port(input(0)?).map_err(|e| e.to_string())?;
                let mut shape = out_shape(self, 0)?;
                if shape.iter().product::<usize>() != x.shape.iter().product::<usize>() {
                    // Only in the one-row lm_head segment: keep the row count of the input.
                    let rows = x.shape.iter().rev().skip(1).product::<usize>();
                    let l = shape.len();
                    shape[..l - 1].iter_mut().for_each(|d| *d = 1);
                    if l >= 2 {
                        shape[l - 2] = rows;
                    }
                }
                one(self.net.reshape(self.bin, &x, &shape))
            }
            (Domain::Onnx, "Transpose") => {
                let x = self.port(input(0)?).map_err(|e| e.to_string())?;
                let perm: Vec<usize> = match n.attrs.ints("perm").map_err(|e| e.to_string())? {
                    Some(p) => p.iter().map(|&d| d as usize).collect(),
                    None => (0..x.shape.len()).rev().collect(),
                };
                one(self.net.transpose(self.bin, &x, &perm))
            }
            (Domain::Onnx, "Slice") => {
                let mut x = self.port(input(0)?).map_err(|e| e.to_string())?;
                let starts = self.const_ints(n.inputs.get(1).copied().flatten()).ok_or("non-constant starts")?;
                let ends = self.const_ints(n.inputs.get(2).copied().flatten()).ok_or("non-constant ends")?;
                let rank = x.shape.len() as i64;
                let axes = match n.inputs.get(3).copied().flatten() {
                    Some(a) => self.const_ints(Some(a)).ok_or("non-constant axes")?,
                    None => (0..starts.len() as i64).collect(),
                };
                if let Some(st) = n.inputs.get(4).copied().flatten() {
                    if self.const_ints(Some(st)).ok_or("non-constant steps")?.iter().any(|&s| s != 1) {
                        return Err("Slice with a step other than 1".into());
                    }
                }
                for ((&s, &e), &a) in starts.iter().zip(&ends).zip(&axes) {
                    let axis = if a < 0 { a + rank } else { a } as usize;
                    let dim = x.shape[axis] as i64;
                    let norm = |v: i64| (if v < 0 { v + dim } else { v }).clamp(0, dim) as usize;
                    let (b, e) = (norm(s), norm(e).max(norm(s)));
                    x = self.net.slice(self.bin, &x, axis, b, e);
                }
                one(x)
            }
            (Domain::Onnx, "Concat") => {
                let mut ports = Vec::new();
                for v in n.inputs.iter().flatten() {
                    ports.push(self.port(*v).map_err(|e| e.to_string())?);
                }
                let rank = ports[0].shape.len() as i64;
                let a = n.attrs.int_or("axis", 0).map_err(|e| e.to_string())?;
                let refs: Vec<&Port> = ports.iter().collect();
                one(self.net.concat(&refs, if a < 0 { a + rank } else { a } as usize))
            }
            (Domain::Onnx, "Gather") => {
                if n.attrs.int_or("axis", 0).map_err(|e| e.to_string())? != 0 {
                    return Err("Gather on an axis other than 0".into());
                }
                let data = self.port(input(0)?).map_err(|e| e.to_string())?;
                let idx = self.port(input(1)?).map_err(|e| e.to_string())?;
                one(self.net.gather0(self.bin, &data, &idx))
            }
            (Domain::Microsoft, "GatherBlockQuantized") => self.gather_block_quantized(n).map(|p| vec![p]),
            (Domain::Onnx, op @ ("Add" | "Sub" | "Mul" | "Div" | "Pow")) => {
                let a = self.port(input(0)?).map_err(|e| e.to_string())?;
                let b = self.port(input(1)?).map_err(|e| e.to_string())?;
                let ty = match op {
                    "Add" => "Add",
                    "Sub" => "Subtract",
                    "Mul" => "Multiply",
                    "Div" => "Divide",
                    _ => "Power",
                };
                one(self.net.binary(ty, &a, &b)?)
            }
            (Domain::Onnx, op @ ("Sqrt" | "Neg" | "Sigmoid" | "Exp" | "Tanh" | "Abs")) => {
                let x = self.port(input(0)?).map_err(|e| e.to_string())?;
                one(self.net.unary(if op == "Neg" { "Negative" } else { op }, &x))
            }
            (Domain::Onnx, "MatMul") => {
                let a = self.port(input(0)?).map_err(|e| e.to_string())?;
                let b = self.port(input(1)?).map_err(|e| e.to_string())?;
                one(self.net.matmul(&a, &b, false)?)
            }
            (Domain::Npuc, op @ ("RmsNorm" | "RmsNormRowScaled")) => {
                let x = self.port(input(0)?).map_err(|e| e.to_string())?;
                let g = self.port(input(1)?).map_err(|e| e.to_string())?;
                one(self.rms_norm(&x, &g, eps, op == "RmsNormRowScaled")?)
            }
            (Domain::Npuc, op @ ("SkipRmsNorm" | "SkipRmsNormRowScaled")) => {
                let x = self.port(input(0)?).map_err(|e| e.to_string())?;
                let skip = self.port(input(1)?).map_err(|e| e.to_string())?;
                let g = self.port(input(2)?).map_err(|e| e.to_string())?;
                let mut s = self.net.binary("Add", &x, &skip)?;
                if let Some(b) = n.inputs.get(3).copied().flatten() {
                    let b = self.port(b).map_err(|e| e.to_string())?;
                    s = self.net.binary("Add", &s, &b)?;
                }
                let y = self.rms_norm(&s, &g, eps, op == "SkipRmsNormRowScaled")?;
                Ok(vec![y, s])
            }
            (Domain::Npuc, "Rope") => {
                let interleaved = n.attrs.int_or("interleaved", 0).map_err(|e| e.to_string())? != 0;
                let x = self.port(input(0)?).map_err(|e| e.to_string())?;
                let c = self.port(input(1)?).map_err(|e| e.to_string())?;
                let s = self.port(input(2)?).map_err(|e| e.to_string())?;
                let axis = x.shape.len() - 1;
                let d = x.shape[axis];
                if d % 2 != 0 {
                    return Err(format!("rotary width {d} is odd"));
                }
                let rot = if interleaved {
                    // Pairs (2i, 2i+1) → (−x[2i+1], x[2i]): view [.., d/2, 2], swap and negate, back.
                    let mut pairs = x.shape.clone();
                    pairs[axis] = d / 2;
                    pairs.push(2);
                    let xp = self.net.reshape(self.bin, &x, &pairs);
                    let even = self.net.slice(self.bin, &xp, axis + 1, 0, 1);
                    let odd = self.net.slice(self.bin, &xp, axis + 1, 1, 2);
                    let nodd = self.net.unary("Negative", &odd);
                    let swapped = self.net.concat(&[&nodd, &even], axis + 1);
                    self.net.reshape(self.bin, &swapped, &x.shape)
                } else {
                    let x1 = self.net.slice(self.bin, &x, axis, 0, d / 2);
                    let x2 = self.net.slice(self.bin, &x, axis, d / 2, d);
                    let nx2 = self.net.unary("Negative", &x2);
                    self.net.concat(&[&nx2, &x1], axis)
                };
                let xc = self.net.binary("Multiply", &x, &c)?;
                let rs = self.net.binary("Multiply", &rot, &s)?;
                one(self.net.binary("Add", &xc, &rs)?)
            }
            (Domain::Npuc, "Silu") => {
                let x = self.port(input(0)?).map_err(|e| e.to_string())?;
                let sg = self.net.unary("Sigmoid", &x);
                one(self.net.binary("Multiply", &x, &sg)?)
            }
            (Domain::Npuc, "SwiGlu") => {
                let g = self.port(input(0)?).map_err(|e| e.to_string())?;
                let u = self.port(input(1)?).map_err(|e| e.to_string())?;
                let sg = self.net.unary("Sigmoid", &g);
                let silu = self.net.binary("Multiply", &g, &sg)?;
                one(self.net.binary("Multiply", &silu, &u)?)
            }
            (Domain::Npuc, "GeluTanh") => {
                let x = self.port(input(0)?).map_err(|e| e.to_string())?;
                one(self.gelu_tanh(&x)?)
            }
            (Domain::Npuc, "GeluGate") => {
                let g = self.port(input(0)?).map_err(|e| e.to_string())?;
                let u = self.port(input(1)?).map_err(|e| e.to_string())?;
                let gelu = self.gelu_tanh(&g)?;
                one(self.net.binary("Multiply", &gelu, &u)?)
            }
            (Domain::Npuc, op @ ("WGemm" | "WGemmRowScaled")) => {
                let a = self.port(input(0)?).map_err(|e| e.to_string())?;
                let w = self.wgemm_weight(n)?;
                let y = if op == "WGemmRowScaled" {
                    let c = self.row_scale(&a)?;
                    let u = self.net.binary("Divide", &a, &c)?;
                    let y = self.net.matmul(&u, &w, true)?;
                    self.net.binary("Multiply", &y, &c)?
                } else {
                    let mut y = self.net.matmul(&a, &w, true)?;
                    if let Some(b) = n.inputs.get(4).copied().flatten() {
                        let b = self.port(b).map_err(|e| e.to_string())?;
                        y = self.net.binary("Add", &y, &b)?;
                    }
                    y
                };
                one(y)
            }
            (Domain::Onnx, "QuantizeLinear") => one(self.quantize_linear(n)?),
            (Domain::Onnx, "DequantizeLinear") => one(self.dequantize_linear(n)?),
            (Domain::Npuc, "QGemm") => one(self.qgemm(n)?),
            (d, op) => Err(format!("{d}::{op} has no OpenVINO lowering")),
        }
    }

    /// A quantised embedding: Gather of the symmetric codes and of the f16 scales, multiplied.
    fn gather_block_quantized(&mut self, n: &Node) -> Result<Port, String> {
        let bits = n.attrs.int_or("bits", 4).map_err(|e| e.to_string())?;
        let block = n.attrs.int_or("block_size", 128).map_err(|e| e.to_string())? as usize;
        if n.attrs.int_or("gather_axis", 0).map_err(|e| e.to_string())? != 0
            || n.attrs.int_or("quantize_axis", 1).map_err(|e| e.to_string())? != 1
        {
            return Err("GatherBlockQuantized other than gather_axis 0, quantize_axis 1".into());
        }
        if n.inputs.get(3).copied().flatten().is_some() {
            return Err("GatherBlockQuantized with zero points".into());
        }
        // The data may be a Reshape of the weight (a tied lm_head's [N, G, group] codes).
        let mut data = n.inputs[0].ok_or("no data")?;
        if let Some(p) = producer(self.g, data) {
            let pn = self.g.node(p);
            if pn.op == "Reshape" {
                data = pn.inputs[0].ok_or("no data")?;
            }
        }
        let wid = symmetric::weight_of(self.g, data).ok_or("embedding codes must be a model weight")?;
        let sid =
            symmetric::weight_of(self.g, n.inputs[2].ok_or("no scales")?).ok_or("scales must be a model weight")?;
        let w = self.g.weights.get(wid);
        let s = self.g.weights.get(sid);
        let rows = w.shape[0];
        let width: usize = w.shape[1..].iter().product::<usize>() * if bits == 4 { 2 } else { 1 };
        let groups = width.div_ceil(block);
        if groups * block != width || w.dtype != DType::U8 || !(bits == 4 || bits == 8) {
            return Err(format!(
                "embedding `{}` of {} {:?} with {bits}-bit blocks of {block}",
                w.name, w.dtype, w.shape
            ));
        }
        let (et, flip) = if bits == 4 { (Et::I4, 0x88u8) } else { (Et::I8, 0x80u8) };
        let wbytes = w.bytes.clone();
        let wr = self.bin.keyed(&format!("sym:{}", w.name), || wbytes.iter().map(|b| b ^ flip).collect());
        let codes = self.net.constant(et, &[rows, groups, block], wr);
        let sdata = s.to_tensor().map_err(|e| e.to_string())?.to_f32_vec();
        let sr = self.bin.keyed(&format!("f16:{}", s.name), || {
            sdata.iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect()
        });
        let scale = self.net.constant(Et::F16, &[rows, groups, 1], sr);
        let idx = self.port(n.inputs[1].ok_or("no indices")?).map_err(|e| e.to_string())?;
        let gc = self.net.gather0(self.bin, &codes, &idx);
        let gs = self.net.gather0(self.bin, &scale, &idx);
        let cf = self.net.convert(&gc, Et::F32);
        let sf = self.net.convert(&gs, Et::F32);
        let v = self.net.binary("Multiply", &cf, &sf)?;
        let mut shape = idx.shape.clone();
        shape.push(width);
        Ok(self.net.reshape(self.bin, &v, &shape))
    }
}

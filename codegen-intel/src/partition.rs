//! Cutting the program into segments at the nodes the host computes — attention, and in hybrid
//! decoders the recurrent layers and the mixtures of experts ([`host_node`]) — which nodes run on
//! the device in which segment, what each segment reads and writes, and which nodes compute the
//! RoPE tables.

use crate::IntelError;
use ir::graph::{Graph, NodeId, ValueDef, ValueId};
use ir::{Domain, Node};
use std::collections::{HashMap, HashSet};

#[derive(Clone)]
pub(crate) struct Segment {
    pub name: String,
    /// The attention stage the segment computes (`None` for the lm_head).
    pub stage: Option<usize>,
    pub nodes: Vec<NodeId>,
    pub last_row_only: bool,
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
}

pub(crate) struct Parts {
    pub segments: Vec<Segment>,
    pub attentions: Vec<NodeId>,
    pub attention_stage: Vec<usize>,
    /// The other nodes the host computes ([`host_node`]), in program order, and their stages.
    pub host: Vec<NodeId>,
    pub host_stage: Vec<usize>,
    /// Rope cos and sin values (computed on the host).
    pub cos: HashSet<ValueId>,
    pub sin: HashSet<ValueId>,
    /// Nodes that compute the RoPE tables.
    pub table_nodes: Vec<NodeId>,
}

pub(crate) fn producer(g: &Graph, v: ValueId) -> Option<NodeId> {
    match g.value(v).def {
        ValueDef::Node { node, .. } => Some(node),
        _ => None,
    }
}

pub(crate) fn is_op(n: &Node, op: &str) -> bool {
    n.domain == Domain::Npuc && n.op == op
}

/// A node the host computes between segments other than attention: a recurrent layer, whose
/// state lives on the host, or a mixture of experts, which the host routes.
pub(crate) fn host_node(n: &Node) -> bool {
    matches!(
        (n.domain, n.op),
        (Domain::Microsoft | Domain::Onnx, "CausalConvWithState" | "LinearAttention")
            | (Domain::Npuc, "CausalConv" | "DeltaNet" | "Moe")
            | (Domain::Microsoft, "MoE" | "QMoE")
    )
}

/// A node segments are cut at: attention or a [`host_node`].
pub(crate) fn is_cut(n: &Node) -> bool {
    is_op(n, "Attention") || host_node(n)
}

/// Cuts `g` into segments at its attentions and host nodes (see the crate doc).
pub(crate) fn partition(g: &Graph) -> Result<Parts, IntelError> {
    let (mut cos, mut sin) = (HashSet::new(), HashSet::new());
    for n in g.nodes.iter().filter(|n| is_op(n, "Rope")) {
        cos.extend(n.inputs.get(1).copied().flatten());
        sin.extend(n.inputs.get(2).copied().flatten());
    }
    let table = table_computation(g, &cos, &sin);
    let logits = *g.outputs.first().ok_or_else(|| IntelError::Structure("no outputs".into()))?;
    let needed = device_nodes(g, logits, &cos, &sin, &table)?;
    let stages = stages(g, &needed)?;
    let head = lm_head(g, logits);
    let last_stage = stages.attention_stage.iter().chain(&stages.host_stage).max().copied().unwrap_or(0) + 1;
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
    let seg_of_node = assign_nodes(g, &mut segments, &needed, &stages.node_stage, &head, &compile_time);
    let readers = readers(g, &needed, &seg_of_node, logits);
    for (si, seg) in segments.iter_mut().enumerate() {
        set_boundary(g, si, seg, &readers, &compile_time);
    }
    segments.retain(|s| !s.nodes.is_empty());
    let table_nodes = (0..g.nodes.len()).filter(|&i| table[i]).map(|i| NodeId(i as u32)).collect();
    let Stages { attentions, attention_stage, host, host_stage, .. } = stages;
    Ok(Parts { segments, attentions, attention_stage, host, host_stage, cos, sin, table_nodes })
}

/// The table computation: ancestors of cos/sin, stopping at Shape nodes (a shape is static).
fn table_computation(g: &Graph, cos: &HashSet<ValueId>, sin: &HashSet<ValueId>) -> Vec<bool> {
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
    table
}

/// Device nodes: what the logits need, stopping at the tables and at attention (whose q/k/v the
/// segments produce).
fn device_nodes(
    g: &Graph,
    logits: ValueId,
    cos: &HashSet<ValueId>,
    sin: &HashSet<ValueId>,
    table: &[bool],
) -> Result<Vec<bool>, IntelError> {
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
        if is_cut(node) || node.op == "MRotaryEmbedding" {
            stack.extend(device_inputs(node));
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
    Ok(needed)
}

/// The attention stage of every device node (how many attentions precede it), and the
/// attentions in program order with their own stages.
struct Stages {
    node_stage: Vec<usize>,
    attentions: Vec<NodeId>,
    attention_stage: Vec<usize>,
    host: Vec<NodeId>,
    host_stage: Vec<usize>,
}

/// The inputs of `n` that the device computes: an attention's q, k and v only (a mask input is
/// the model's attention mask over the sequence: the host runs one unpadded sequence, where it is
/// all ones and attention is causal only); a recurrent layer's activations, not its state; a
/// mixture of experts' input and router logits, not its experts; M-RoPE's input, not the
/// positions (the host feeds its cos/sin rows, see `rope`).
pub(crate) fn device_inputs(n: &Node) -> Vec<ValueId> {
    let slots: &[usize] = match (n.domain, n.op) {
        (Domain::Npuc, "Attention") => &[0, 1, 2],
        (_, "CausalConvWithState" | "CausalConv") => &[0],
        (_, "LinearAttention" | "DeltaNet") => &[0, 1, 2, 4, 5],
        (Domain::Microsoft, "MoE" | "QMoE") | (Domain::Npuc, "Moe") => &[0, 1],
        (Domain::Microsoft, "MRotaryEmbedding") => &[0],
        _ => return n.inputs.iter().flatten().copied().collect(),
    };
    slots.iter().filter_map(|&i| n.inputs.get(i).copied().flatten()).collect()
}

fn stages(g: &Graph, needed: &[bool]) -> Result<Stages, IntelError> {
    let mut stage_of_value: HashMap<ValueId, usize> = HashMap::new();
    let mut out = Stages {
        node_stage: vec![0; g.nodes.len()],
        attentions: vec![],
        attention_stage: vec![],
        host: vec![],
        host_stage: vec![],
    };
    for (ni, n) in g.nodes.iter().enumerate() {
        if !needed[ni] {
            continue;
        }
        let inputs = device_inputs(n);
        let s = inputs.iter().map(|v| stage_of_value.get(v).copied().unwrap_or(0)).max().unwrap_or(0);
        out.node_stage[ni] = s;
        let out_stage = if is_op(n, "Attention") {
            out.attentions.push(NodeId(ni as u32));
            out.attention_stage.push(s);
            s + 1
        } else if host_node(n) {
            out.host.push(NodeId(ni as u32));
            out.host_stage.push(s);
            s + 1
        } else {
            s
        };
        for &o in &n.outputs {
            stage_of_value.insert(o, out_stage);
        }
    }
    if out.attentions.is_empty() {
        return Err(IntelError::Structure("no npuc::Attention to cut segments at".into()));
    }
    Ok(out)
}

/// Puts every device node that runs at run time into the segment of its stage (the lm_head's
/// into the last segment); returns each node's segment.
fn assign_nodes(
    g: &Graph,
    segments: &mut [Segment],
    needed: &[bool],
    node_stage: &[usize],
    head: &[NodeId],
    compile_time: &[bool],
) -> HashMap<NodeId, usize> {
    let mut seg_of_node: HashMap<NodeId, usize> = HashMap::new();
    for (ni, n) in g.nodes.iter().enumerate() {
        let id = NodeId(ni as u32);
        if compile_time[ni] {
            continue;
        }
        if !needed[ni] || is_cut(n) || head.contains(&id) {
            if head.contains(&id) {
                seg_of_node.insert(id, segments.len() - 1);
            }
            continue;
        }
        segments[node_stage[ni]].nodes.push(id);
        seg_of_node.insert(id, node_stage[ni]);
    }
    seg_of_node
}

/// The segments that read each value (`None`: the host, for attention and the logits).
fn readers(
    g: &Graph,
    needed: &[bool],
    seg_of_node: &HashMap<NodeId, usize>,
    logits: ValueId,
) -> HashMap<ValueId, HashSet<Option<usize>>> {
    let mut readers: HashMap<ValueId, HashSet<Option<usize>>> = HashMap::new();
    for (ni, n) in g.nodes.iter().enumerate() {
        if !needed[ni] {
            continue;
        }
        let id = NodeId(ni as u32);
        let reader = if is_cut(n) { None } else { seg_of_node.get(&id).copied() };
        for v in device_inputs(n) {
            readers.entry(v).or_default().insert(reader);
        }
    }
    readers.entry(logits).or_default().insert(None);
    readers
}

/// Segment `si`'s inputs (values it reads that it does not compute, except constants) and outputs
/// (values it computes that another segment or the host reads).
fn set_boundary(
    g: &Graph,
    si: usize,
    seg: &mut Segment,
    readers: &HashMap<ValueId, HashSet<Option<usize>>>,
    compile_time: &[bool],
) {
    let mine: HashSet<NodeId> = seg.nodes.iter().copied().collect();
    let mut ins = Vec::new();
    let mut outs = Vec::new();
    for &ni in &seg.nodes {
        let n = g.node(ni);
        // M-RoPE reads its cos/sin caches as rows the host feeds (see `rope`).
        let mrope_caches = if n.op == "MRotaryEmbedding" { &n.inputs[2..4.min(n.inputs.len())] } else { &[] };
        for v in device_inputs(n).into_iter().chain(mrope_caches.iter().flatten().copied()) {
            let external = match g.value(v).def {
                ValueDef::Input => true,
                ValueDef::Node { node, .. } => !mine.contains(&node) && !compile_time[node.0 as usize],
                _ => mrope_caches.contains(&Some(v)),
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

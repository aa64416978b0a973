//! The values the cache and the step stand for: every Attention node's past and mask inputs and
//! present outputs (the cache), `input_ids` and `position_ids` (the step), and the logits (the one
//! graph output the executor returns); and who may read them.

use super::{AttentionShape, Loc, StateSlot, Uses};
use crate::exec::error::{node_err, value_err, ExecError};
use crate::exec::program::{ElemType, NodeInfo, Program, StepDims, ValueDef};

/// Ops whose input 3 is a past recurrent state and output 1 its present.
pub(super) const STATEFUL_OPS: [&str; 4] =
    ["com.microsoft::CausalConvWithState", "com.microsoft::LinearAttention", "npuc::CausalConv", "npuc::DeltaNet"];

/// Binds every Attention node's past and mask inputs and present outputs to the cache; the
/// geometry the nodes share, with one layer per node (`None` when there is no Attention node).
pub(super) fn attention(program: &Program, uses: &Uses, locs: &mut [Loc]) -> Result<Option<AttentionShape>, ExecError> {
    let mut attention: Option<AttentionShape> = None;
    let mut layers = 0;
    for node in program.nodes.iter().filter(|n| n.op == "npuc::Attention") {
        let shape = attention_shape(program, node)?;
        match attention {
            None => attention = Some(shape),
            Some(a) if (a.q_heads, a.kv_heads, a.head_dim) == (shape.q_heads, shape.kv_heads, shape.head_dim) => {}
            Some(_) => {
                return Err(node_err(&node.name, &node.op, "heads or head size differ from the first Attention node"))
            }
        }
        layers += 1;
        bind_to_cache(program, uses, node, locs)?;
    }
    Ok(attention.map(|a| AttentionShape { layers, ..a }))
}

/// An Attention node's past and mask inputs (graph inputs) and its present outputs (read by no
/// node) as [`Loc::Cache`].
fn bind_to_cache(program: &Program, uses: &Uses, node: &NodeInfo, locs: &mut [Loc]) -> Result<(), ExecError> {
    let values = &program.values;
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
        if let Some(&(n, _)) = uses.consumers[v].first() {
            let reader = &program.nodes[n];
            return Err(node_err(
                &reader.name,
                &reader.op,
                format!("reads `{}`, a present key/value the KV cache holds", values[v].name),
            ));
        }
        locs[v] = Loc::Cache;
    }
    Ok(())
}

/// Binds every recurrent node's (CausalConvWithState, LinearAttention, and the fused CausalConv
/// and DeltaNet) past state (input 3, a graph input)
/// and present state (output 1, read by no node) to one state slot of the step's sequence; the
/// slots in program order. A state's size must not depend on the step.
pub(super) fn recurrent_states(program: &Program, uses: &Uses, locs: &mut [Loc]) -> Result<Vec<StateSlot>, ExecError> {
    let mut slots = Vec::new();
    let mut offset = 0;
    for node in program.nodes.iter().filter(|n| STATEFUL_OPS.contains(&n.op.as_str())) {
        let fail = |problem: String| node_err(&node.name, &node.op, problem);
        let past = node
            .input(3)
            .ok_or_else(|| fail("has no past state (input 3); the executor keeps each sequence's state".into()))?;
        let present = node.outputs.get(1).copied().ok_or_else(|| fail("has no present state (output 1)".into()))?;
        if !matches!(program.values[past].def, ValueDef::Input) {
            return Err(fail(format!(
                "past state `{}` must be a graph input: the sequence holds it",
                program.values[past].name
            )));
        }
        if let Some(&(n, _)) = uses.consumers[present].first() {
            let reader = &program.nodes[n];
            return Err(node_err(
                &reader.name,
                &reader.op,
                format!("reads `{}`, a present state the sequence holds", program.values[present].name),
            ));
        }
        if let Some(&(n, _)) = uses.consumers[past]
            .iter()
            .find(|&&(n, slot)| !(n_is(program, n, &node.name) && slot == 3) && program.nodes[n].op != "ai.onnx::Shape")
        {
            let reader = &program.nodes[n];
            return Err(node_err(
                &reader.name,
                &reader.op,
                format!("reads `{}`, a past state the sequence holds", program.values[past].name),
            ));
        }
        let len = fixed_numel(program, present).ok_or_else(|| {
            fail(format!("present state `{}` has a size that depends on the step", program.values[present].name))
        })?;
        if fixed_numel(program, past) != Some(len) {
            return Err(fail(format!("past state `{}` and present state differ in size", program.values[past].name)));
        }
        locs[past] = Loc::State(slots.len());
        locs[present] = Loc::State(slots.len());
        slots.push(StateSlot { offset, len });
        offset += len;
    }
    Ok(slots)
}

fn n_is(program: &Program, n: usize, name: &str) -> bool {
    program.nodes[n].name == name
}

/// Elements of `v` (batch 1) when they do not depend on the step's sizes.
fn fixed_numel(program: &Program, v: usize) -> Option<usize> {
    let numel = |dims: StepDims| program.values[v].shape.iter().map(|d| d.eval(dims)).product::<usize>();
    let a = numel(StepDims { seq: 1, past: 0 });
    (a == numel(StepDims { seq: 2, past: 3 })).then_some(a)
}

/// The graph input a drafter program takes per row from its decoder (the decoder's output of
/// the same name), and the outputs the executor returns beside the logits.
pub(super) const HIDDEN_INPUT: &str = "hidden_states";
const HIDDEN_OUTPUTS: [&str; 2] = ["hidden_states", "hidden_states_out"];

/// `input_ids` and `position_ids` as the step's; `hidden_states` (an MTP head's) as the caller's,
/// in storage root 0; every other graph input must be the cache's or unread. Returns the hidden
/// states input, if any.
pub(super) fn graph_inputs(program: &Program, uses: &Uses, locs: &mut [Loc]) -> Result<Option<usize>, ExecError> {
    let mut hidden = None;
    for &v in &program.inputs {
        let info = &program.values[v];
        match info.name.as_str() {
            "input_ids" => locs[v] = Loc::Ids,
            "position_ids" => locs[v] = Loc::Positions,
            HIDDEN_INPUT if !uses.consumers[v].is_empty() => {
                check_rows(program, v)?;
                locs[v] = Loc::Buf(0);
                hidden = Some(v);
            }
            _ if matches!(locs[v], Loc::Cache | Loc::State(_)) => {}
            _ if uses.consumers[v].is_empty() => {}
            _ => return Err(value_err(&info.name, "is a graph input the host executor cannot supply (it supplies input_ids, position_ids, an MTP head's hidden_states, and the past and mask of Attention nodes)")),
        }
        if matches!(locs[v], Loc::Ids | Loc::Positions) && info.elem != Some(ElemType::I64) {
            return Err(value_err(&info.name, format!("has dtype {}, expected i64", info.dtype)));
        }
    }
    Ok(hidden)
}

/// `v` must be f32 rows `[batch, sequence, width]` of a fixed width.
fn check_rows(program: &Program, v: usize) -> Result<usize, ExecError> {
    let info = &program.values[v];
    match (info.elem, info.shape.len(), info.shape.last().and_then(|d| d.as_const())) {
        (Some(ElemType::F32), 3, Some(width)) => Ok(width),
        _ => Err(value_err(&info.name, "hidden states must be f32 [batch, sequence, width] with a fixed width")),
    }
}

/// A graph input bound to the cache may only be read by Attention nodes (and Shape, which reads
/// its shape only).
pub(super) fn check_cache_readers(program: &Program, uses: &Uses, locs: &[Loc]) -> Result<(), ExecError> {
    for (v, loc) in locs.iter().enumerate() {
        if *loc == Loc::Cache {
            if let Some(&(n, _)) = uses.consumers[v]
                .iter()
                .find(|(n, _)| !matches!(program.nodes[*n].op.as_str(), "npuc::Attention" | "ai.onnx::Shape"))
            {
                let reader = &program.nodes[n];
                return Err(node_err(
                    &reader.name,
                    &reader.op,
                    format!("reads `{}`, which the KV cache stands for", program.values[v].name),
                ));
            }
        }
    }
    Ok(())
}

/// Folded codes (a weight quantised by the program) are read by QGemm packing only.
pub(super) fn check_folded_readers(program: &Program, uses: &Uses, locs: &[Loc]) -> Result<(), ExecError> {
    for (v, loc) in locs.iter().enumerate() {
        if let Loc::ConstQ(_) = loc {
            if let Some(&(c, slot)) =
                uses.consumers[v].iter().find(|&&(c, slot)| !(program.nodes[c].op == "npuc::QGemm" && slot == 3))
            {
                let reader = &program.nodes[c];
                return Err(node_err(&reader.name, &reader.op, format!("input {slot} (`{}`) is a weight quantised by the program; the executor folds those for QGemm weights only", program.values[v].name)));
            }
        }
    }
    Ok(())
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

/// The logits (the graph output the cache and the state do not hold, `logits` where there are
/// two) and the hidden states output a decoder with an MTP head gives it (`hidden_states`, or
/// the head's own `hidden_states_out`), if any.
pub(super) fn outputs(program: &Program, locs: &[Loc]) -> Result<(usize, Option<usize>), ExecError> {
    let returned: Vec<usize> =
        program.outputs.iter().copied().filter(|&v| !matches!(locs[v], Loc::Cache | Loc::State(_))).collect();
    let name = |v: usize| program.values[v].name.as_str();
    let hidden = returned.iter().copied().find(|&v| returned.len() > 1 && HIDDEN_OUTPUTS.contains(&name(v)));
    let mut rest = returned.iter().copied().filter(|&v| Some(v) != hidden);
    let logits = rest.next().ok_or_else(|| value_err("logits", "the program has no output besides the KV cache"))?;
    let info = &program.values[logits];
    if info.elem != Some(ElemType::F32) || info.shape.last().and_then(|d| d.as_const()).is_none() {
        return Err(value_err(&info.name, "the logits must be f32 with a fixed vocabulary axis"));
    }
    if let Some(extra) = rest.next() {
        return Err(value_err(
            name(extra),
            "is a second graph output; the executor returns the logits (and a drafter's hidden_states) only",
        ));
    }
    if let Some(h) = hidden {
        check_rows(program, h)?;
    }
    Ok((logits, hidden))
}

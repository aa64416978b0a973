//! `position-tables`: values that are a function of each token's position alone become rows of
//! a table computed at compile time.
//!
//! transformers computes RoPE's cos/sin in the graph from `position_ids` (`inv_freq ⊗ positions`,
//! `Cos`, `Sin`, the attention scaling), through Expand, MatMul, Where and trigonometry the host
//! executor has no kernels for and that an NPU would not run either. The onnxruntime-genai
//! builder writes the same thing as `Gather(cos_cache, positions)`. This pass finds every float
//! value computed from `position_ids` (with constants, weights and sizes) and read by something
//! that is not, evaluates it once at positions `0..rows` with the reference evaluator, and
//! replaces it by `Gather(table, position_ids)` reshaped to its shape — after checking, on a
//! batch of scattered positions, that each token's row depends on its own position only (the
//! table is then exactly what the graph computes, bit for bit). Positions at or past `rows` are
//! outside the table: the manifest's `max_positions` says so and the runtime refuses them.
//!
//! A graph without `position_ids` (optimum's Gemma 3 export) counts its positions itself:
//! `Range(past, past + sequence, 1)` from the cache's and the input's sizes. Such a Range, shown
//! by evaluation at several sizes to be `past..past + sequence`, is the positions the tables are
//! indexed by; the graph keeps computing it.

use crate::{Pass, PassDetail, PassError};
use ir::graph::ValueDef;
use ir::{Attrs, DType, Dim, Domain, Graph, Node, OpRef, Tensor, ValueId, Weight};
use std::collections::HashMap;

/// The graph input whose values the tables are indexed by.
pub const POSITIONS: &str = "position_ids";

pub struct PositionTables {
    /// Rows of each table: the positions the compiled program can run at.
    pub rows: usize,
}

impl Pass for PositionTables {
    fn name(&self) -> &'static str {
        "position-tables"
    }
    fn contract(&self) -> &'static str {
        "Expects a graph after saturate. Guarantees the same program for positions below the table size, with every float value computed from position_ids alone (RoPE's in-graph cos/sin) read from a table computed at compile time."
    }
    fn run(&self, mut graph: Graph) -> Result<(Graph, PassDetail), PassError> {
        let input = graph.inputs.iter().copied().find(|&i| graph.value(i).name == POSITIONS);
        let Some(pos) = input.or_else(|| counted_positions(&graph)) else {
            let summary = "no position_ids input, no Range of the step's positions".into();
            return Ok((graph, PassDetail { summary, data: serde_json::Value::Null }));
        };
        // A model that gathers its own table by position (the builder's cos/sin caches) runs at
        // every position that table holds.
        let rows = self.rows.max(gathered_rows(&graph, pos));
        let mut tabulated = Vec::new();
        let mut declined = Vec::new();
        for v in frontier(&graph, pos) {
            match tabulate(&graph, pos, v, rows) {
                Ok(table) => {
                    replace_with_gather(&mut graph, pos, v, table);
                    tabulated.push(graph.value(v).name.clone());
                }
                Err(why) => declined.push(format!("`{}`: {why}", graph.value(v).name)),
            }
        }
        let g = graph.pruned();
        let mut summary = format!("{} values tabulated over {} positions", tabulated.len(), rows);
        if !declined.is_empty() {
            summary += &format!("; declined {}", declined.join("; "));
        }
        let data = serde_json::json!({ "tabulated": tabulated, "declined": declined, "rows": rows });
        Ok((g, PassDetail { summary, data }))
    }
}

/// A `Range(start, limit, 1)` that is the step's positions `past..past + sequence`, checked by
/// evaluating it with the sizes of the graph inputs at several (past, sequence) pairs.
fn counted_positions(g: &Graph) -> Option<ValueId> {
    let ids = g.inputs.iter().map(|&i| g.value(i)).find(|v| v.name == "input_ids")?;
    let [batch, seq] = &ids.shape[..] else { return None };
    let (batch, seq) = (batch.as_symbol()?, seq.as_symbol()?);
    let mut others: Vec<&str> =
        g.inputs.iter().flat_map(|&i| g.value(i).shape.iter()).flat_map(|d| d.symbols()).collect();
    others.sort_unstable();
    others.dedup();
    others.retain(|s| *s != batch && *s != seq);
    let [past] = others[..] else { return None };
    g.nodes.iter().filter(|n| n.domain == Domain::Onnx && n.op == "Range").map(|n| n.outputs[0]).find(|&r| {
        [(0i64, 3i64), (5, 1), (2, 4)].iter().all(|&(p, s)| {
            let sizes = HashMap::from([(batch.to_string(), 1), (seq.to_string(), s), (past.to_string(), p)]);
            let got = eval_rec(g, r, &sizes, &mut HashMap::new());
            got.ok().and_then(|t| t.as_i64().map(<[i64]>::to_vec)) == Some((p..p + s).collect())
        })
    })
}

/// Why a value computed from the positions is not tabulated.
#[derive(Debug, thiserror::Error)]
enum Decline {
    #[error("token {token} (position {position}) does not read its own row")]
    NotOwnRow { token: usize, position: i64 },
    #[error("it has no sequence axis")]
    NoSequenceAxis,
    #[error("it is {shape}, not f32 [batch, 1.., sequence, known..]")]
    Layout { shape: String },
    #[error("position_ids' dims are not plain sizes")]
    PositionsNotSizes,
    #[error("it reads the input `{0}`")]
    ReadsInput(String),
    #[error("Shape without input")]
    ShapeWithoutInput,
    #[error("size {dim} of `{value}` is not known")]
    UnknownSize { dim: Dim, value: String },
    #[error(transparent)]
    Weight(#[from] ir::tensor::TensorError),
    #[error(transparent)]
    Eval(#[from] ir::eval::EvalError),
}

/// What a value depends on.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Dep {
    /// Constants and weights.
    Fixed,
    /// Sizes (`Shape` of anything) and arithmetic on them and constants.
    Sizes,
    /// The positions' values.
    Positions,
    /// Anything else.
    Other,
}

/// The most rows of a constant table the graph gathers by position (0 when it gathers none).
fn gathered_rows(g: &Graph, pos: ValueId) -> usize {
    let dep = dependencies(g, pos);
    let gathers = g.nodes.iter().filter(|n| n.domain == Domain::Onnx && n.op == "Gather");
    let tables = gathers.filter_map(|n| match n.inputs[..] {
        [Some(table), Some(index), ..]
            if dep[index.0 as usize] == Dep::Positions && dep[table.0 as usize] == Dep::Fixed =>
        {
            g.value(table).shape.first().and_then(Dim::as_known)
        }
        _ => None,
    });
    tables.max().map_or(0, |r| r.max(0) as usize)
}

/// What each value depends on.
fn dependencies(g: &Graph, pos: ValueId) -> Vec<Dep> {
    let mut dep: Vec<Dep> = g
        .values
        .iter()
        .map(|v| match v.def {
            ValueDef::Weight(_) | ValueDef::Const(_) => Dep::Fixed,
            _ => Dep::Other,
        })
        .collect();
    dep[pos.0 as usize] = Dep::Positions;
    for n in &g.nodes {
        let d = if n.op == "Shape" {
            Dep::Sizes
        } else {
            n.inputs.iter().flatten().map(|i| dep[i.0 as usize]).max().unwrap_or(Dep::Fixed)
        };
        for &o in n.outputs.iter().filter(|&&o| o != pos) {
            dep[o.0 as usize] = d;
        }
    }
    dep
}

/// Float values that depend on the positions (and nothing but sizes and constants) and are read
/// by a node that depends on more, or are graph outputs.
fn frontier(g: &Graph, pos: ValueId) -> Vec<ValueId> {
    let dep = dependencies(g, pos);
    let mut out: Vec<ValueId> = Vec::new();
    let mut take = |v: ValueId| {
        if dep[v.0 as usize] == Dep::Positions && g.value(v).dtype.is_float() && !out.contains(&v) {
            out.push(v);
        }
    };
    for n in &g.nodes {
        if n.outputs.iter().any(|o| dep[o.0 as usize] == Dep::Other) {
            n.inputs.iter().flatten().for_each(|&i| take(i));
        }
    }
    g.outputs.iter().for_each(|&o| take(o));
    out
}

/// The `[rows, width]` table of `v`, checked to be a function of each token's position alone.
fn tabulate(g: &Graph, pos: ValueId, v: ValueId, rows: usize) -> Result<Tensor, Decline> {
    let width = row_width(g, pos, v)?;
    let p = &g.value(pos).shape;
    // position_ids is [batch, sequence]; a counted Range is [sequence].
    let (all_shape, scattered_shape) = if p.len() == 2 { (vec![1, rows], vec![2, 3]) } else { (vec![rows], vec![6]) };
    let all: Vec<i64> = (0..rows as i64).collect();
    let table = eval_value(g, pos, v, Tensor::from_i64(DType::I64, all_shape, all), p)?;
    let table = table.to_f32_vec();
    let scattered = [7i64, 3, 11, 0, 5, 2].map(|x| x.min(rows as i64 - 1)).to_vec();
    let check = eval_value(g, pos, v, Tensor::from_i64(DType::I64, scattered_shape, scattered.clone()), p)?;
    for (k, &at) in scattered.iter().enumerate() {
        let want = &table[at as usize * width..(at as usize + 1) * width];
        let got = &check.to_f32_vec()[k * width..(k + 1) * width];
        if want.iter().zip(got).any(|(a, b)| a.to_bits() != b.to_bits()) {
            return Err(Decline::NotOwnRow { token: k, position: at });
        }
    }
    Ok(Tensor::from_f32(DType::F32, vec![rows, width], table))
}

/// The elements per token of `v`, when `v` is `[batch, 1.., seq, rest..]` with `rest` known (for
/// counted positions, `[1.., seq, rest..]`).
fn row_width(g: &Graph, pos: ValueId, v: ValueId) -> Result<usize, Decline> {
    let (p, s) = (&g.value(pos).shape, &g.value(v).shape);
    let seq_at = s.iter().position(|d| Some(d) == p.last()).ok_or(Decline::NoSequenceAxis)?;
    let leading = if p.len() == 2 { s.first() == Some(&p[0]) && seq_at > 0 } else { true };
    let ones_from = if p.len() == 2 { 1 } else { 0 };
    let layout_ok = leading && s[ones_from.min(seq_at)..seq_at].iter().all(|d| d.as_known() == Some(1));
    let rest: Option<Vec<i64>> = s[seq_at + 1..].iter().map(Dim::as_known).collect();
    match rest {
        Some(rest) if layout_ok && g.value(v).dtype == DType::F32 => Ok(rest.iter().product::<i64>() as usize),
        _ => Err(Decline::Layout { shape: ir::dim::shape_to_string(s) }),
    }
}

/// Evaluates `v` with `position_ids` = `positions`; `Shape` is answered from symbolic shapes with
/// the positions' batch and sequence sizes.
fn eval_value(g: &Graph, pos: ValueId, v: ValueId, positions: Tensor, p: &[Dim]) -> Result<Tensor, Decline> {
    let mut sizes = HashMap::new();
    for (d, &n) in p.iter().zip(&positions.shape) {
        let s = d.as_symbol().ok_or(Decline::PositionsNotSizes)?;
        sizes.insert(s.to_string(), n as i64);
    }
    if p.len() == 1 {
        // Counted positions belong to one sequence: the batch is 1.
        if let Some(b) =
            g.inputs.iter().map(|&i| g.value(i)).find(|v| v.name == "input_ids").and_then(|v| v.shape[0].as_symbol())
        {
            sizes.insert(b.to_string(), 1);
        }
    }
    let mut values: HashMap<ValueId, Tensor> = HashMap::from([(pos, positions)]);
    eval_rec(g, v, &sizes, &mut values)
}

fn eval_rec(
    g: &Graph,
    v: ValueId,
    sizes: &HashMap<String, i64>,
    values: &mut HashMap<ValueId, Tensor>,
) -> Result<Tensor, Decline> {
    if let Some(t) = values.get(&v) {
        return Ok(t.clone());
    }
    let value = g.value(v);
    let t = match &value.def {
        ValueDef::Const(t) => t.clone(),
        ValueDef::Weight(w) => g.weights.get(*w).to_tensor()?,
        ValueDef::Input => return Err(Decline::ReadsInput(value.name.clone())),
        ValueDef::Node { node, output } => {
            let n = g.node(*node);
            let mut results = if n.op == "Shape" {
                vec![shape_value(g, n, sizes)?]
            } else {
                let mut args = Vec::with_capacity(n.inputs.len());
                for i in &n.inputs {
                    args.push(match i {
                        Some(i) => Some(eval_rec(g, *i, sizes, values)?),
                        None => None,
                    });
                }
                let refs: Vec<Option<&Tensor>> = args.iter().map(Option::as_ref).collect();
                let op = OpRef { node: &n.name, domain: n.domain, op: n.op, opset: n.opset, attrs: &n.attrs };
                ir::eval::eval_op(&op, &refs, n.outputs.len())?
            };
            results.swap_remove(*output)
        }
    };
    values.insert(v, t.clone());
    Ok(t)
}

/// `Shape(x)` from x's symbolic shape under `sizes`.
fn shape_value(g: &Graph, n: &Node, sizes: &HashMap<String, i64>) -> Result<Tensor, Decline> {
    let x = g.value(n.inputs[0].ok_or(Decline::ShapeWithoutInput)?);
    let r = x.shape.len() as i64;
    let clamp = |v: i64| if v < 0 { (v + r).max(0) } else { v.min(r) } as usize;
    let start = clamp(n.attrs.int("start").ok().flatten().unwrap_or(0));
    let end = clamp(n.attrs.int("end").ok().flatten().unwrap_or(r)).max(start);
    // Only the sizes the Shape reads need to be known.
    let dims: Vec<i64> = x.shape[start..end]
        .iter()
        .map(|d| {
            d.eval(&|s| sizes.get(s).copied())
                .ok_or_else(|| Decline::UnknownSize { dim: d.clone(), value: x.name.clone() })
        })
        .collect::<Result<_, _>>()?;
    Ok(Tensor::from_i64(DType::I64, vec![end - start], dims))
}

/// Makes `v` the output of `Reshape(Gather(table, position_ids), shape of v)`; the node that
/// computed it is left without readers.
fn replace_with_gather(g: &mut Graph, pos: ValueId, v: ValueId, table: Tensor) {
    let name = g.value(v).name.clone();
    let width = table.shape[1];
    let tw = add_table(g, &name, table);
    let mut rows_shape = g.value(pos).shape.clone();
    rows_shape.push(Dim::known(width as i64));
    let gathered = g.add_value(format!("{name}.rows"), DType::F32, rows_shape, ValueDef::Input);
    // Batch copies the input's dim (0), the sequence is inferred (-1), the rest are numbers.
    let target: Vec<i64> =
        g.value(v).shape.iter().enumerate().map(|(i, d)| d.as_known().unwrap_or(if i == 0 { 0 } else { -1 })).collect();
    let target = Tensor::from_i64(DType::I64, vec![target.len()], target);
    let shape_dims = vec![Dim::known(target.numel() as i64)];
    let shape_v = g.add_value(format!("{name}.shape"), DType::I64, shape_dims, ValueDef::Const(target));
    // The old producer keeps a value of its own that nothing reads.
    if let ValueDef::Node { node, output } = g.value(v).def {
        let old = g.value(v).clone();
        let o = g.add_value(format!("{name}.computed"), old.dtype, old.shape, old.def);
        g.nodes[node.0 as usize].outputs[output] = o;
    }
    let gather = onnx_node(format!("{name}.gather"), "Gather", 13, &[tw, pos], gathered);
    let reshape = onnx_node(format!("{name}.reshape"), "Reshape", 14, &[gathered, shape_v], v);
    let first_reader = g.nodes.iter().position(|n| n.inputs.contains(&Some(v))).unwrap_or(g.nodes.len());
    g.insert_nodes(first_reader, vec![gather, reshape]);
}

/// Adds `table` as the weight `<name>.table` and a value naming it.
fn add_table(g: &mut Graph, name: &str, table: Tensor) -> ValueId {
    let shape = table.shape.clone();
    let bytes = bytes::Bytes::from(table.to_le_bytes().expect("an f32 table encodes"));
    let weight = Weight::new(format!("{name}.table"), DType::F32, shape.clone(), bytes);
    let wid = std::sync::Arc::make_mut(&mut g.weights).add(weight);
    let dims = shape.iter().map(|&d| Dim::known(d as i64)).collect();
    g.add_value(format!("{name}.table"), DType::F32, dims, ValueDef::Weight(wid))
}

/// An ai.onnx node without attributes.
fn onnx_node(name: String, op: &'static str, opset: i64, inputs: &[ValueId], output: ValueId) -> Node {
    let inputs = inputs.iter().map(|&i| Some(i)).collect();
    Node { name, domain: Domain::Onnx, op, opset, attrs: Attrs::default(), inputs, outputs: vec![output] }
}

//! The RoPE tables: the program's own cos/sin computation evaluated at compile time for every
//! position the bundle runs, stored in the weights file and fed by the host.

use crate::partition::Parts;
use crate::IntelError;
use ir::graph::{Graph, ValueDef, ValueId};
use ir::{DType, OpRef, Tensor};
use std::collections::HashMap;

/// The RoPE tables the host feeds: each distinct cos or sin table (`rope_cos`, `rope_sin`, then
/// `rope_cos_1`, ... for models whose layers rotate differently, as Gemma 3's local and global
/// layers do), `[positions, width]` row-major, and the table each Rope input reads.
pub(crate) struct RopeTables {
    pub tables: Vec<(String, Vec<f32>)>,
    pub names: HashMap<ValueId, String>,
    pub width: usize,
    pub positions: usize,
}

/// Evaluates the program's cos/sin computation for positions `0..positions` (batch 1, no past)
/// with the reference evaluator (see [`RopeTables`]).
pub(crate) fn rope_tables(g: &Graph, parts: &Parts, positions: usize) -> Result<RopeTables, IntelError> {
    let mut out = RopeTables { tables: vec![], names: HashMap::new(), width: 0, positions: 0 };
    if parts.cos.is_empty() {
        mrope_tables(g, &mut out, positions)?;
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

/// M-RoPE's cos/sin caches (`[rows, rot/2]` weights of `com.microsoft::MRotaryEmbedding`), fed
/// as the rows of the step's positions: in a text-only step the three position rows are equal,
/// so every section reads the row of the token's position (as the host executor reads it).
fn mrope_tables(g: &Graph, out: &mut RopeTables, positions: usize) -> Result<(), IntelError> {
    for n in g.nodes.iter().filter(|n| n.op == "MRotaryEmbedding") {
        let fail = |msg: String| IntelError::Unsupported { node: n.name.clone(), msg };
        for (slot, what) in [(2, "cos"), (3, "sin")] {
            let v = n.inputs.get(slot).copied().flatten().ok_or_else(|| fail(format!("no {what} cache")))?;
            let ValueDef::Weight(w) = g.value(v).def else {
                return Err(fail(format!("the {what} cache `{}` is not a weight", g.value(v).name)));
            };
            let t = g.weights.get(w).to_tensor().map_err(|e| fail(e.to_string()))?;
            let (rows, width) = match t.shape[..] {
                [rows, width] if rows > 0 && width > 0 && (out.width == 0 || out.width == width) => (rows, width),
                _ => return Err(fail(format!("a {what} cache of shape {:?}", t.shape))),
            };
            out.width = width;
            out.positions = if out.positions == 0 { positions.min(rows) } else { out.positions.min(rows) };
            let data = t.to_f32_vec();
            let name = format!("rope_{what}");
            match out.tables.iter().position(|(t, _)| *t == name) {
                Some(i) if out.tables[i].1[..out.positions * width] != data[..out.positions * width] => {
                    return Err(fail(format!("a {what} cache that differs from another layer's")));
                }
                Some(_) => {}
                None => out.tables.push((name.clone(), data)),
            }
            out.names.insert(v, name);
        }
    }
    for (_, data) in &mut out.tables {
        data.truncate(out.positions * out.width);
    }
    Ok(())
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

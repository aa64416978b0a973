//! Runs a whole [`Graph`] with the reference evaluator: the oracle tests compare every later pass
//! and every kernel against.

use crate::dtype::DType;
use crate::eval::{eval_op, EvalError};
use crate::graph::{Graph, Node, ValueDef, ValueId};
use crate::op::OpRef;
use crate::tensor::Tensor;
use std::collections::HashMap;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum RunError {
    #[error("graph input `{0}` was not given")]
    MissingInput(String),
    #[error("input `{name}` is {given}, the graph declares {declared}")]
    InputDtype { name: String, given: DType, declared: DType },
    #[error("input `{name}` has shape {given:?}, the graph declares {declared}")]
    InputShape { name: String, given: Vec<usize>, declared: String },
    #[error("input `{name}` binds `{symbol}` to {given}, an earlier input bound it to {earlier}")]
    SymbolConflict { name: String, symbol: String, given: i64, earlier: i64 },
    #[error("weight `{name}`: {msg}")]
    Weight { name: String, msg: String },
    #[error(transparent)]
    Eval(#[from] EvalError),
    #[error("node `{node}` output `{value}` has shape {got:?}, inference said {inferred}")]
    ShapeDisagrees { node: String, value: String, got: Vec<usize>, inferred: String },
}

/// Evaluates `graph` on named inputs and returns every graph output by name. Intermediate tensors
/// are dropped after their last use; input shapes are checked against the declared symbolic
/// shapes, and each node's results against the shapes inference gave them.
pub fn run_graph(graph: &Graph, inputs: &HashMap<String, Tensor>) -> Result<HashMap<String, Tensor>, RunError> {
    run_graph_with(graph, inputs, &mut |op, args, n| eval_op(op, args, n))
}

/// One node's evaluation: the op, its arguments (absent optional inputs are `None`) and how many
/// results it must give.
pub type NodeEval<'f> = dyn FnMut(&OpRef, &[Option<&Tensor>], usize) -> Result<Vec<Tensor>, EvalError> + 'f;

/// [`run_graph`] with every node evaluated by `eval` instead of the reference evaluator: a
/// simulation of other arithmetic (see [`crate::fp16sim`]) reuses the walk, the input and shape
/// checks and the freeing of intermediates.
pub fn run_graph_with(
    graph: &Graph,
    inputs: &HashMap<String, Tensor>,
    eval: &mut NodeEval<'_>,
) -> Result<HashMap<String, Tensor>, RunError> {
    let mut bindings: HashMap<String, i64> = HashMap::new();
    let mut slots: Vec<Option<Tensor>> = vec![None; graph.values.len()];
    bind_inputs(graph, inputs, &mut slots, &mut bindings)?;
    let mut uses = count_uses(graph);
    let mut weight_cache: HashMap<ValueId, Tensor> = HashMap::new();
    for n in &graph.nodes {
        load_constant_inputs(graph, n, &slots, &mut weight_cache)?;
        let args: Vec<Option<&Tensor>> = n
            .inputs
            .iter()
            .map(|i| i.and_then(|i| slots[i.0 as usize].as_ref().or_else(|| weight_cache.get(&i))))
            .collect();
        let op = OpRef { node: &n.name, domain: n.domain, op: n.op, opset: n.opset, attrs: &n.attrs };
        let results = eval(&op, &args, n.outputs.len())?;
        for (&out, t) in n.outputs.iter().zip(results) {
            check_inferred_shape(graph, n, out, &t, &bindings)?;
            slots[out.0 as usize] = Some(t);
        }
        for &i in n.inputs.iter().flatten() {
            let u = &mut uses[i.0 as usize];
            *u -= 1;
            if *u == 0 {
                slots[i.0 as usize] = None;
                weight_cache.remove(&i);
            }
        }
    }
    graph_outputs(graph, &slots)
}

/// Checks every graph input against its declared dtype and shape, binding the shape's symbols,
/// and puts it in its slot.
fn bind_inputs(
    graph: &Graph,
    inputs: &HashMap<String, Tensor>,
    slots: &mut [Option<Tensor>],
    bindings: &mut HashMap<String, i64>,
) -> Result<(), RunError> {
    for &id in &graph.inputs {
        let v = graph.value(id);
        let t = inputs.get(&v.name).ok_or_else(|| RunError::MissingInput(v.name.clone()))?;
        if t.dtype != v.dtype {
            return Err(RunError::InputDtype { name: v.name.clone(), given: t.dtype, declared: v.dtype });
        }
        bind_shape(&v.name, &v.shape, &t.shape, bindings)?;
        slots[id.0 as usize] = Some(t.clone());
    }
    Ok(())
}

/// Remaining uses per value (node inputs and graph outputs), so intermediates can be freed as
/// soon as possible.
fn count_uses(graph: &Graph) -> Vec<usize> {
    let mut uses = vec![0usize; graph.values.len()];
    for n in &graph.nodes {
        for &i in n.inputs.iter().flatten() {
            uses[i.0 as usize] += 1;
        }
    }
    for &o in &graph.outputs {
        uses[o.0 as usize] += 1;
    }
    uses
}

/// Decodes the weights and constants `n` reads that are not decoded yet into `cache`.
fn load_constant_inputs(
    graph: &Graph,
    n: &Node,
    slots: &[Option<Tensor>],
    cache: &mut HashMap<ValueId, Tensor>,
) -> Result<(), RunError> {
    for &i in n.inputs.iter().flatten() {
        if slots[i.0 as usize].is_none() && !cache.contains_key(&i) {
            let t = match &graph.value(i).def {
                ValueDef::Weight(w) => {
                    let w = graph.weights.get(*w);
                    w.to_tensor().map_err(|e| RunError::Weight { name: w.name.clone(), msg: e.to_string() })?
                }
                ValueDef::Const(t) => t.clone(),
                _ => continue,
            };
            cache.insert(i, t);
        }
    }
    Ok(())
}

/// Checks a result of node `n` against the shape inference gave its value `out`, where the
/// bound sizes determine it.
fn check_inferred_shape(
    graph: &Graph,
    n: &Node,
    out: ValueId,
    t: &Tensor,
    bindings: &HashMap<String, i64>,
) -> Result<(), RunError> {
    let v = graph.value(out);
    let expected: Option<Vec<i64>> = v.shape.iter().map(|d| d.eval(&|s| bindings.get(s).copied())).collect();
    if let Some(expected) = expected {
        let got: Vec<i64> = t.shape.iter().map(|&d| d as i64).collect();
        if got != expected {
            return Err(RunError::ShapeDisagrees {
                node: n.name.clone(),
                value: v.name.clone(),
                got: t.shape.clone(),
                inferred: crate::dim::shape_to_string(&v.shape),
            });
        }
    }
    Ok(())
}

/// Every graph output by name: computed, constant or weight.
fn graph_outputs(graph: &Graph, slots: &[Option<Tensor>]) -> Result<HashMap<String, Tensor>, RunError> {
    let mut out = HashMap::new();
    for &o in &graph.outputs {
        let v = graph.value(o);
        let t = match &v.def {
            ValueDef::Const(t) => t.clone(),
            ValueDef::Weight(w) => graph
                .weights
                .get(*w)
                .to_tensor()
                .map_err(|e| RunError::Weight { name: v.name.clone(), msg: e.to_string() })?,
            _ => slots[o.0 as usize].clone().expect("verified graph defines every output"),
        };
        out.insert(v.name.clone(), t);
    }
    Ok(out)
}

fn bind_shape(
    name: &str,
    declared: &[crate::dim::Dim],
    given: &[usize],
    bindings: &mut HashMap<String, i64>,
) -> Result<(), RunError> {
    let mismatch = || RunError::InputShape {
        name: name.to_string(),
        given: given.to_vec(),
        declared: crate::dim::shape_to_string(declared),
    };
    if declared.len() != given.len() {
        return Err(mismatch());
    }
    // Bare symbols bind first; compound dims (`past + seq`) are checked once everything is bound.
    for (d, &g) in declared.iter().zip(given) {
        if let Some(s) = d.as_symbol() {
            match bindings.get(s) {
                Some(&earlier) if earlier != g as i64 => {
                    return Err(RunError::SymbolConflict {
                        name: name.into(),
                        symbol: s.into(),
                        given: g as i64,
                        earlier,
                    })
                }
                _ => {
                    bindings.insert(s.to_string(), g as i64);
                }
            }
        } else if let Some(k) = d.as_known() {
            if k != g as i64 {
                return Err(mismatch());
            }
        }
    }
    Ok(())
}

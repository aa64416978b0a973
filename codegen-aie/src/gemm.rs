//! The projection GEMMs of a compiled program: every `npuc::WGemm` / `WGemmRowScaled`,
//! `npuc::QGemm`, and `MatMul` whose right operand is a constant 2-D weight, including the tied
//! lm_head that reads the embedding through `Transpose(perm = [1, 0])` (and through a
//! `QuantizeLinear` of that in QDQ models).

use ir::graph::{Graph, Node, ValueDef, ValueId};
use ir::Domain;
use serde::Serialize;

/// One projection: `[.., k] × [k, n]` with a constant weight.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GemmSite {
    pub node: String,
    /// `domain::op` of the node.
    pub op: String,
    pub k: usize,
    pub n: usize,
    /// The weight the node reads.
    pub weight: String,
    /// The weight is read transposed (a tied lm_head reading the `[n, k]` embedding).
    pub transposed: bool,
    /// Rows a call has per row of activations: a `QGemm{passes}`'s stacked passes, else 1.
    pub passes: usize,
    /// The last columns (a weight's residual pass) multiply the first pass only: a
    /// `QGemm{first_pass_columns}`'s, else 0.
    pub first_pass_columns: usize,
}

impl GemmSite {
    /// A one-pass `MatMul` projection `[.., k] × [k, n]` whose weight is named after its node: a
    /// plan of shapes alone (the cost tables, the design tests).
    pub fn of_shape(node: &str, k: usize, n: usize) -> GemmSite {
        let (node, op) = (node.to_string(), "ai.onnx::MatMul".to_string());
        GemmSite { weight: node.clone(), node, op, k, n, transposed: false, passes: 1, first_pass_columns: 0 }
    }
}

fn known_2d(g: &Graph, v: ValueId) -> Option<(usize, usize)> {
    let s = &g.value(v).shape;
    match (s.len(), s.first().and_then(|d| d.as_known()), s.get(1).and_then(|d| d.as_known())) {
        (2, Some(a), Some(b)) if a > 0 && b > 0 => Some((a as usize, b as usize)),
        _ => None,
    }
}

/// The weight behind `v`, and whether it is read transposed: a weight or constant, or a value
/// computed from constants only (a tied lm_head's `Transpose(perm = [1, 0])` of the embedding,
/// a `QuantizeLinear` of one); the name is that of the first weight on the data operand's path.
fn weight_of(g: &Graph, v: ValueId) -> Option<(String, bool)> {
    weight_at(g, v, 0)
}

fn weight_at(g: &Graph, v: ValueId, depth: usize) -> Option<(String, bool)> {
    let value = g.value(v);
    match &value.def {
        ValueDef::Weight(w) => Some((g.weights.get(*w).name.clone(), false)),
        ValueDef::Const(_) => Some((value.name.clone(), false)),
        ValueDef::Input => None,
        ValueDef::Node { node, .. } if depth < 8 => {
            let n = g.node(*node);
            let inputs: Vec<ValueId> = n.inputs.iter().flatten().copied().collect();
            let (first, rest) = inputs.split_first()?;
            if !rest.iter().all(|&i| weight_at(g, i, depth + 1).is_some()) {
                return None;
            }
            let (name, transposed) = weight_at(g, *first, depth + 1)?;
            // ONNX's default permutation reverses the dimensions: [1, 0] for a matrix.
            let perm = n.attrs.ints("perm").ok().flatten();
            let flips = n.domain == Domain::Onnx
                && n.op == "Transpose"
                && g.value(*first).shape.len() == 2
                && perm.is_none_or(|p| p == [1, 0]);
            if n.domain == Domain::Onnx && n.op == "Transpose" && !flips {
                return None;
            }
            Some((name, transposed ^ flips))
        }
        ValueDef::Node { .. } => None,
    }
}

fn site(g: &Graph, n: &Node) -> Option<GemmSite> {
    let op = format!("{}::{}", n.domain, n.op);
    match (n.domain, n.op) {
        (Domain::Onnx, "MatMul") => {
            let w = n.inputs.get(1).copied().flatten()?;
            let (k, nn) = known_2d(g, w)?;
            let (weight, transposed) = weight_of(g, w)?;
            Some(GemmSite { node: n.name.clone(), op, k, n: nn, weight, transposed, passes: 1, first_pass_columns: 0 })
        }
        (Domain::Npuc, "WGemm" | "WGemmRowScaled") => {
            let k = n.attrs.int("K").ok().flatten()?;
            let nn = n.attrs.int("N").ok().flatten()?;
            let w = n.inputs.get(1).copied().flatten()?;
            let (weight, _) = weight_of(g, w)?;
            Some(GemmSite {
                node: n.name.clone(),
                op,
                k: k as usize,
                n: nn as usize,
                weight,
                transposed: false,
                passes: 1,
                first_pass_columns: 0,
            })
        }
        (Domain::Npuc, "QGemm") => {
            let w = n.inputs.get(3).copied().flatten()?;
            let (k, nn) = known_2d(g, w)?;
            let (weight, transposed) = weight_of(g, w)?;
            let int = |name| n.attrs.int(name).ok().flatten().unwrap_or(0).max(0) as usize;
            let (passes, first_pass_columns) = (int("passes").max(1), int("first_pass_columns").min(nn));
            Some(GemmSite { node: n.name.clone(), op, k, n: nn, weight, transposed, passes, first_pass_columns })
        }
        _ => None,
    }
}

/// Every projection GEMM of the program, in program order.
pub fn collect(g: &Graph) -> Vec<GemmSite> {
    g.nodes.iter().filter_map(|n| site(g, n)).collect()
}

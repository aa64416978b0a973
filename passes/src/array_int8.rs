//! `array-int8`: the projections as the xdna array computes them.
//!
//! The AIE compute tiles multiply int8 by int8 into int32 (`matmul_i8_i32`); the array takes a
//! projection whose weight is int8 per output channel and whose activations are quantised per
//! row when the step runs. This pass rewrites every projection of a float or weight-only program
//! — a `MatMul` by a constant 2-D float weight (the tied lm_head reads the embedding through a
//! Transpose), a `WGemm` (4- or 8-bit blocks, dequantised exactly first) — into
//!
//! ```text
//! codes, s_rows = npuc::QuantizeRows(a)                     (per row: s = max|a|/127)
//! y = npuc::QGemm(codes, s_rows, 0, W8, s_cols, 0)          (W8 int8 [K, N], s_cols [N])
//! ```
//!
//! with W8 = round_half_even(W / s_col), s_col = max_k |W[k, col]| / 127. The int32 product and
//! its epilogue are `QGemm`'s reference semantics, so a bundle compiled for xdna runs on the host
//! backend with the array's numerics, and a design's int32 readback goes through the same
//! epilogue. `QGemm`s the `qdq` family built (A8W8 models) already are what the array takes and
//! stay as they are; a MatMul of two activations (attention inside a QDQ model) has no constant
//! weight and stays on the host, in float.
//!
//! The summary counts the projections rewritten and the worst per-weight error of the int8
//! weights (max|W8·s − W| / max|W|); the error this costs on the logits is measured against the
//! float program in `tests/xdna_numerics.rs`.

use crate::{Pass, PassDetail, PassError};
use ir::fused::NBitsWeights;
use ir::graph::{Graph, Node, NodeId, Value, ValueDef, ValueId};
use ir::weights::{Weight, WeightId, WeightStore};
use ir::{Attrs, DType, Dim, Domain, Tensor};
use std::collections::HashMap;
use std::sync::Arc;

pub struct ArrayInt8;

impl Pass for ArrayInt8 {
    fn name(&self) -> &'static str {
        "array-int8"
    }
    fn contract(&self) -> &'static str {
        "Expects the extracted program. Guarantees every projection with a constant weight (MatMul by a 2-D float weight, WGemm, QGemm) is a QGemm with int8 per-channel weights fed by QuantizeRows (or an A8W8 QGemm left as it was); MatMuls of two activations stay float."
    }
    fn run(&self, graph: Graph) -> Result<(Graph, PassDetail), PassError> {
        rewrite(graph)
    }
}

/// A projection found in the program: its activation, its weight as f64 [K, N], what it came from.
struct Projection {
    a: ValueId,
    k: usize,
    n: usize,
    /// The weight (or constant) the int8 form is named after and cached by: a weight read by two
    /// projections is quantised once.
    source: Source,
    w_kn: Vec<f64>,
    bias: Option<ValueId>,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Source {
    Weight(WeightId),
    Const(ValueId),
}

impl Source {
    fn name(self, g: &Graph) -> String {
        match self {
            Source::Weight(w) => g.weights.get(w).name.clone(),
            Source::Const(v) => g.value(v).name.clone(),
        }
    }
}

/// The tensor of a weight or constant value, or of a view of one the program computes at run
/// time (a Slice of a packed projection's rows, a Reshape): those are evaluated here, once.
fn weight_tensor(g: &Graph, v: ValueId) -> Option<(Source, Tensor)> {
    match &g.value(v).def {
        ValueDef::Weight(w) => Some((Source::Weight(*w), g.weights.get(*w).to_tensor().ok()?)),
        ValueDef::Const(t) => Some((Source::Const(v), t.clone())),
        ValueDef::Input => None,
        ValueDef::Node { node, .. } => {
            let n = g.node(*node);
            if n.domain != Domain::Onnx || !matches!(n.op, "Slice" | "Reshape" | "Squeeze" | "Unsqueeze") {
                return None;
            }
            let args: Option<Vec<Option<Tensor>>> = n
                .inputs
                .iter()
                .map(|i| match i {
                    None => Some(None),
                    Some(v) => weight_tensor(g, *v).map(|(_, t)| Some(t)),
                })
                .collect();
            let args = args?;
            let refs: Vec<Option<&Tensor>> = args.iter().map(Option::as_ref).collect();
            let op = ir::OpRef { node: &n.name, domain: n.domain, op: n.op, opset: n.opset, attrs: &n.attrs };
            let t = ir::eval::eval_op(&op, &refs, n.outputs.len()).ok()?.swap_remove(0);
            Some((Source::Const(v), t))
        }
    }
}

/// The projection `n` computes, if it is one the array takes and not yet int8.
fn projection(g: &Graph, n: &Node) -> Result<Option<Projection>, String> {
    let input = |i: usize| n.inputs.get(i).copied().flatten();
    match (n.domain, n.op) {
        (Domain::Npuc, "WGemm" | "WGemmRowScaled") => {
            let (Some(a), Some(w), Some(s)) = (input(0), input(1), input(2)) else { return Ok(None) };
            let (Some((source, w)), Some((_, s))) = (weight_tensor(g, w), weight_tensor(g, s)) else { return Ok(None) };
            let z = match input(3) {
                Some(z) => match weight_tensor(g, z) {
                    Some((_, z)) => Some(z),
                    None => return Ok(None),
                },
                None => None,
            };
            let nb = NBitsWeights::new(&n.attrs, &w, &s, z.as_ref())?;
            let w_nk = nb.dequantized();
            Ok(Some(Projection { a, k: nb.k, n: nb.n, source, w_kn: transpose(&w_nk, nb.n, nb.k), bias: input(4) }))
        }
        (Domain::Onnx, "MatMul") => {
            let (Some(a), Some(b)) = (input(0), input(1)) else { return Ok(None) };
            if !g.value(a).dtype.is_float() {
                return Ok(None);
            }
            if let Some((source, w)) = weight_tensor(g, b).filter(|(_, w)| w.rank() == 2 && w.dtype.is_float()) {
                let (k, n) = (w.shape[0], w.shape[1]);
                return Ok(Some(Projection { a, k, n, source, w_kn: w.to_f64_vec(), bias: None }));
            }
            // The tied lm_head: MatMul(x, Transpose(table [N, K])).
            let ValueDef::Node { node, .. } = g.value(b).def else { return Ok(None) };
            let t = g.node(node);
            let perm = t.attrs.ints("perm").ok().flatten();
            if t.op != "Transpose" || perm.as_deref() != Some(&[1, 0][..]) {
                return Ok(None);
            }
            let Some((source, w)) = t.inputs[0].and_then(|v| weight_tensor(g, v)) else { return Ok(None) };
            if w.rank() != 2 || !w.dtype.is_float() {
                return Ok(None);
            }
            let (nn, k) = (w.shape[0], w.shape[1]);
            Ok(Some(Projection { a, k, n: nn, source, w_kn: transpose(&w.to_f64_vec(), nn, k), bias: None }))
        }
        _ => Ok(None),
    }
}

fn transpose(m: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let mut t = vec![0.0; m.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = m[r * cols + c];
        }
    }
    t
}

/// Per output channel (column of W [K, N]): s = max|W[:, col]|/127 (1 for a zero column), codes
/// rounded half to even. Returns (codes [K, N], scales [N], max|W8·s − W| / max|W|).
pub fn quantize_columns(w_kn: &[f64], k: usize, n: usize) -> (Vec<i8>, Vec<f32>, f64) {
    let mut scales = vec![0f32; n];
    for (col, s) in scales.iter_mut().enumerate() {
        let max = (0..k).fold(0.0f64, |m, r| m.max(w_kn[r * n + col].abs()));
        *s = if max > 0.0 { (max / 127.0) as f32 } else { 1.0 };
    }
    let mut codes = Vec::with_capacity(k * n);
    let (mut err, mut max) = (0.0f64, 0.0f64);
    for (i, &w) in w_kn.iter().enumerate() {
        let s = scales[i % n] as f64;
        let q = (w / s).round_ties_even().clamp(-127.0, 127.0);
        codes.push(q as i8);
        err = err.max((q * s - w).abs());
        max = max.max(w.abs());
    }
    (codes, scales, if max > 0.0 { err / max } else { 0.0 })
}

fn rewrite(g: Graph) -> Result<(Graph, PassDetail), PassError> {
    let mut store = WeightStore::default();
    for (_, w) in g.weights.iter() {
        store.add(Weight::new(w.name.clone(), w.dtype, w.shape.clone(), w.bytes.clone()));
    }
    let mut values = g.values.clone();
    let mut nodes: Vec<Node> = Vec::with_capacity(g.nodes.len());
    let add_value = |values: &mut Vec<Value>, name: String, dtype: DType, shape: Vec<Dim>, def: ValueDef| {
        values.push(Value { name, dtype, shape, def });
        ValueId(values.len() as u32 - 1)
    };
    let zero_a = add_value(
        &mut values,
        "array_int8.zero".into(),
        DType::I8,
        vec![],
        ValueDef::Const(Tensor::from_i64(DType::I8, vec![], vec![0])),
    );
    // Source weight → (W8, s_cols, zeros) values, so a shared weight is quantised once.
    let mut quantised: HashMap<Source, (ValueId, ValueId, ValueId)> = HashMap::new();
    let (mut rewritten, mut kept_qgemm, mut activation_matmuls) = (0usize, 0usize, 0usize);
    let mut worst_error = 0.0f64;
    let mut per_weight = Vec::new();
    for n in &g.nodes {
        let p = projection(&g, n).map_err(|m| PassError(format!("node `{}` ({}): {m}", n.name, n.op)))?;
        let Some(p) = p else {
            match (n.domain, n.op) {
                (Domain::Npuc, "QGemm") => kept_qgemm += 1,
                (Domain::Onnx, "MatMul") => activation_matmuls += 1,
                _ => {}
            }
            nodes.push(n.clone());
            continue;
        };
        rewritten += 1;
        let (w8, s_cols, z_cols) = match quantised.get(&p.source) {
            Some(&v) => v,
            None => {
                let (codes, scales, error) = quantize_columns(&p.w_kn, p.k, p.n);
                worst_error = worst_error.max(error);
                let base = p.source.name(&g);
                per_weight.push(serde_json::json!({"weight": base, "k": p.k, "n": p.n, "max_rel_error": error}));
                let bytes = |v: Vec<u8>| bytes::Bytes::from(v);
                let w_id = store.add(Weight::new(
                    format!("{base}.int8"),
                    DType::I8,
                    vec![p.k, p.n],
                    bytes(codes.iter().map(|&c| c as u8).collect()),
                ));
                let s_id = store.add(Weight::new(
                    format!("{base}.int8_scale"),
                    DType::F32,
                    vec![p.n],
                    bytes(scales.iter().flat_map(|s| s.to_le_bytes()).collect()),
                ));
                let z_id =
                    store.add(Weight::new(format!("{base}.int8_zero"), DType::I8, vec![p.n], bytes(vec![0; p.n])));
                let kn = vec![Dim::known(p.k as i64), Dim::known(p.n as i64)];
                let v = (
                    add_value(&mut values, format!("{base}.int8"), DType::I8, kn, ValueDef::Weight(w_id)),
                    add_value(
                        &mut values,
                        format!("{base}.int8_scale"),
                        DType::F32,
                        vec![Dim::known(p.n as i64)],
                        ValueDef::Weight(s_id),
                    ),
                    add_value(
                        &mut values,
                        format!("{base}.int8_zero"),
                        DType::I8,
                        vec![Dim::known(p.n as i64)],
                        ValueDef::Weight(z_id),
                    ),
                );
                quantised.insert(p.source, v);
                v
            }
        };
        let a = g.value(p.a);
        let mut row_shape = a.shape.clone();
        if let Some(last) = row_shape.last_mut() {
            *last = Dim::known(1);
        }
        let placeholder = ValueDef::Node { node: NodeId(0), output: 0 };
        let codes =
            add_value(&mut values, format!("{}/codes", n.name), DType::I8, a.shape.clone(), placeholder.clone());
        let rows = add_value(&mut values, format!("{}/row_scales", n.name), DType::F32, row_shape, placeholder.clone());
        nodes.push(Node {
            name: format!("{}/quantize_rows", n.name),
            domain: Domain::Npuc,
            op: "QuantizeRows",
            opset: 1,
            attrs: Attrs::default(),
            inputs: vec![Some(p.a)],
            outputs: vec![codes, rows],
        });
        let y = n.outputs[0];
        let product = match p.bias {
            None => y,
            Some(_) => {
                let v = g.value(y);
                add_value(&mut values, format!("{}/product", n.name), v.dtype, v.shape.clone(), placeholder.clone())
            }
        };
        nodes.push(Node {
            name: n.name.clone(),
            domain: Domain::Npuc,
            op: "QGemm",
            opset: 1,
            attrs: Attrs::default(),
            inputs: vec![Some(codes), Some(rows), Some(zero_a), Some(w8), Some(s_cols), Some(z_cols)],
            outputs: vec![product],
        });
        if let Some(bias) = p.bias {
            nodes.push(Node {
                name: format!("{}/bias", n.name),
                domain: Domain::Onnx,
                op: "Add",
                opset: 14,
                attrs: Attrs::default(),
                inputs: vec![Some(product), Some(bias)],
                outputs: vec![y],
            });
        }
    }
    // Node outputs point at their (renumbered) nodes; pruning drops what the old projections read.
    for (i, node) in nodes.iter().enumerate() {
        for (k, &o) in node.outputs.iter().enumerate() {
            values[o.0 as usize].def = ValueDef::Node { node: NodeId(i as u32), output: k };
        }
    }
    let out = Graph { values, nodes, weights: Arc::new(store), ..g }.pruned();
    let summary = format!(
        "{rewritten} projections → int8 QGemm (worst weight error {worst_error:.2e} of max|W|), {kept_qgemm} A8W8 QGemm kept, {} activation MatMuls left float",
        activation_matmuls
    );
    let data = serde_json::json!({
        "rewritten": rewritten,
        "kept_qgemm": kept_qgemm,
        "activation_matmuls": activation_matmuls,
        "worst_weight_error": worst_error,
        "weights": per_weight,
    });
    Ok((out, PassDetail { summary, data }))
}

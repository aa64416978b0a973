//! `array-gates`: the gates that feed the array's down projections, in integers.
//!
//! After `array-int8`, a SwiGlu's output is read by a `QuantizeRows` only: its rows become the
//! down projection's int8 codes. The f32 gate would cost an array core some 440 cycles a value;
//! the codes need far fewer bits than f32 carries, so the gate and its quantisation become one
//! op whose every step is integer (`ir::integer_gate`):
//!
//! ```text
//! y = SwiGlu(g, u)
//! C, S = QuantizeRows(y)      →      C, S = QuantizeSwiGlu(g, u)   (ĝ·σ̂·û exact, quantised)
//! ```
//!
//! `tools/xdna_kl_prompts.py` measures the program this pass leaves against ONNX Runtime over
//! eight prompts. A SwiGlu whose output anything else reads (a graph output, a float op) is left
//! as it is.

use crate::{Pass, PassDetail, PassError};
use ir::graph::{Graph, ValueId};
use ir::Domain;
use std::collections::HashMap;

pub struct ArrayGates;

impl Pass for ArrayGates {
    fn name(&self) -> &'static str {
        "array-gates"
    }
    fn contract(&self) -> &'static str {
        "Expects array-int8's program. Guarantees no SwiGlu output is read by a QuantizeRows: such a gate and its quantisation are one QuantizeSwiGlu, every step integer."
    }
    fn run(&self, graph: Graph) -> Result<(Graph, PassDetail), PassError> {
        Ok(rewrite(graph))
    }
}

/// The gate and up inputs of every SwiGlu whose output only one-input `QuantizeRows` read.
fn quantised_gates(g: &Graph) -> HashMap<ValueId, (ValueId, ValueId)> {
    let mut readers: HashMap<ValueId, Vec<&ir::Node>> = HashMap::new();
    for n in &g.nodes {
        for &v in n.inputs.iter().flatten() {
            readers.entry(v).or_default().push(n);
        }
    }
    let quantises = |y: ValueId, q: &ir::Node| {
        q.domain == Domain::Npuc && q.op == "QuantizeRows" && q.inputs.len() == 1 && q.inputs[0] == Some(y)
    };
    g.nodes
        .iter()
        .filter(|n| n.domain == Domain::Npuc && n.op == "SwiGlu" && !g.outputs.contains(&n.outputs[0]))
        .filter_map(|n| {
            let y = n.outputs[0];
            let read = readers.get(&y)?;
            let same_shape = |a: ValueId, b: ValueId| g.value(a).shape == g.value(b).shape;
            match n.inputs[..] {
                [Some(gate), Some(up)] if same_shape(gate, up) && read.iter().all(|q| quantises(y, q)) => {
                    Some((y, (gate, up)))
                }
                _ => None,
            }
        })
        .collect()
}

fn rewrite(g: Graph) -> (Graph, PassDetail) {
    let gates = quantised_gates(&g);
    let total = g.nodes.iter().filter(|n| n.domain == Domain::Npuc && n.op == "SwiGlu").count();
    let mut nodes = Vec::with_capacity(g.nodes.len());
    for n in &g.nodes {
        match n.inputs.first().copied().flatten().and_then(|y| gates.get(&y)) {
            Some(&(gate, up)) if n.op == "QuantizeRows" => {
                let mut q = n.clone();
                q.op = "QuantizeSwiGlu";
                q.inputs = vec![Some(gate), Some(up)];
                nodes.push(q);
            }
            _ => nodes.push(n.clone()),
        }
    }
    let kept = total - gates.len();
    let values = g.values.clone();
    let out = g.with_nodes(values, nodes);
    let summary = format!(
        "{} SwiGlu → QuantizeSwiGlu (ĝ·σ̂·û in integers, quantised exactly); {kept} SwiGlu left as they are",
        gates.len()
    );
    let data = serde_json::json!({ "rewritten": gates.len(), "kept": kept });
    (out, PassDetail { summary, data })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ir::build::{GraphBuilder, ValueType};
    use ir::{Attr, DType, Tensor};

    /// `SwiGlu(g, u)` into a two-pass `QuantizeRows`, over rows of 8; the gate's output also a
    /// graph output when `read_elsewhere`.
    fn gate_graph(read_elsewhere: bool) -> Graph {
        let mut b = GraphBuilder::new("gate");
        let ty = || ValueType::known(DType::F32, &[3, 8]);
        let (g, u) = (b.input("g", ty()), b.input("u", ty()));
        let y = b.node(Domain::Npuc, "SwiGlu").inputs(&[g, u]).output("y", ty()).add()[0];
        let q = b
            .node(Domain::Npuc, "QuantizeRows")
            .attr("passes", Attr::Int(2))
            .inputs(&[y])
            .output("codes", ValueType::known(DType::I8, &[2, 3, 8]))
            .output("scales", ValueType::known(DType::F32, &[2, 3, 1]))
            .add();
        b.output(q[0]);
        b.output(q[1]);
        if read_elsewhere {
            b.output(y);
        }
        b.finish().unwrap()
    }

    #[test]
    fn a_quantised_gate_becomes_the_integer_one() {
        let (out, detail) = rewrite(gate_graph(false));
        let ops: Vec<&str> = out.nodes.iter().map(|n| n.op).collect();
        assert_eq!((ops, detail.data["rewritten"].as_u64()), (vec!["QuantizeSwiGlu"], Some(1)));
        let g: Vec<f32> = (0..24).map(|i| (i as f32 - 11.5) * 1.37).collect();
        let u: Vec<f32> = (0..24).map(|i| 0.25 + i as f32 * 0.61).collect();
        let tensor = |v: &[f32]| Tensor::from_f32(DType::F32, vec![3, 8], v.to_vec());
        let inputs = [("g".to_string(), tensor(&g)), ("u".to_string(), tensor(&u))].into();
        let r = ir::run::run_graph(&out, &inputs).unwrap();
        let (codes, scales) = ir::integer_gate::quantize_gate_rows(&g, &u, 8, 2);
        let got: Vec<i8> = r["codes"].as_i64().unwrap().iter().map(|&c| c as i8).collect();
        assert_eq!((got, r["scales"].to_f32_vec()), (codes, scales));
    }

    #[test]
    fn a_gate_read_elsewhere_stays() {
        let (out, detail) = rewrite(gate_graph(true));
        let ops: Vec<&str> = out.nodes.iter().map(|n| n.op).collect();
        assert_eq!((ops, detail.data["kept"].as_u64()), (vec!["SwiGlu", "QuantizeRows"], Some(1)));
    }
}

//! Rule family `delta-net` on small hand-built graphs, for the spellings the builder's files
//! (`tests/hybrid_fused.rs` runs those) do not have: the opset-27 ai.onnx LinearAttention with the
//! default scale (`scale = 0`, 1/√d_k, which DeltaNet writes out), a constant factor on the
//! queries written on the left, and a per-token state window, declined with its reason.

mod common;

use common::float;
use ir::attr::Attr;
use ir::build::GraphBuilder;
use ir::{Domain, Graph};
use rewrites::saturate::{rewrite_with, SaturationReport};
use std::collections::HashMap;

const B: usize = 1;
const T: usize = 3;
const HEADS: usize = 2;
const DK: usize = 4;
const DV: usize = 3;

fn delta_net(g: &Graph) -> (Graph, SaturationReport) {
    rewrite_with(g, &[rewrites::family("delta-net").unwrap()])
}

/// `LinearAttention{attrs}(c·q, k, v, state, decay, beta)` in the ai.onnx domain, the factor c
/// (a scalar constant) on the left, both outputs graph outputs.
fn linear_attention(attrs: &[(&str, Attr)], c: f32) -> Graph {
    let mut b = GraphBuilder::new("delta").with_opset(Domain::Onnx, 27);
    let q = b.input("q", float(&[B, T, HEADS * DK]));
    let k = b.input("k", float(&[B, T, HEADS * DK]));
    let v = b.input("v", float(&[B, T, HEADS * DV]));
    let state = b.input("state", float(&[B, HEADS, DK, DV]));
    let decay = b.input("decay", float(&[B, T, HEADS]));
    let beta = b.input("beta", float(&[B, T, HEADS]));
    let factor = b.constant("c", ir::Tensor::from_f32(ir::DType::F32, vec![], vec![c]));
    let scaled = b.node(Domain::Onnx, "Mul").inputs(&[factor, q]).output("scaled", float(&[B, T, HEADS * DK])).add();
    let outs = b
        .node(Domain::Onnx, "LinearAttention")
        .attrs(attrs)
        .attr("q_num_heads", Attr::Int(HEADS as i64))
        .attr("kv_num_heads", Attr::Int(HEADS as i64))
        .inputs(&[scaled[0], k, v, state, decay, beta])
        .output("y", float(&[B, T, HEADS * DV]))
        .output("present", float(&[B, HEADS, DK, DV]))
        .add();
    outs.iter().for_each(|&o| b.output(o));
    b.finish().unwrap()
}

#[test]
fn an_onnx_linear_attention_with_the_default_scale_folds_with_it_written_out() {
    let g = linear_attention(&[], 0.5);
    let (out, report) = delta_net(&g);
    assert!(report.type_conflicts.is_empty() && report.declined.is_empty(), "{report:?}");
    let fused: Vec<_> = out.nodes.iter().filter(|n| n.op == "DeltaNet").collect();
    assert_eq!(fused.len(), 1);
    assert_eq!(common::count(&out, "LinearAttention") + common::count(&out, "Mul"), 0);
    // 1/√d_k times the factor on the left.
    let scale = fused[0].attrs.float("scale").unwrap().unwrap();
    assert!((f64::from(scale) - 0.5 / (DK as f64).sqrt()).abs() < 1e-7, "scale {scale}");
    let worst = common::worst_difference(&g, &out, &HashMap::new());
    assert!(worst <= 1e-6, "fused and unfused differ by {worst:e}");
}

#[test]
fn a_state_window_is_declined_with_its_reason() {
    let g = linear_attention(&[("state_window", Attr::Int(2))], 1.0);
    let (out, report) = delta_net(&g);
    assert_eq!((common::count(&out, "DeltaNet"), common::count(&out, "LinearAttention")), (0, 1));
    let reasons: Vec<_> = report.declined.iter().map(|d| (d.rule.as_str(), d.reason.as_str())).collect();
    assert_eq!(reasons.len(), 1, "{reasons:?}");
    assert_eq!(reasons[0].0, "delta-net-linear-attention");
    assert!(reasons[0].1.starts_with("state_window = 2"), "{reasons:?}");
}

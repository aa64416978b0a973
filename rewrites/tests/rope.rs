//! Rule family `rope`: every exporter's file with a rotary embedding outside attention folds it
//! into `Rope` with the count the model implies and stays within tolerance of ONNX Runtime's
//! outputs on that file; each exporter spelling and each refusal is checked on a small
//! hand-built graph against the reference evaluator of the unrewritten graph.
//!
//! Counts, for a decoder of L layers: 2L Rope (q and k of every layer), nothing of the rotation's
//! spelling left: optimum's and torch's rotate-half negate one half of q and of k (2L Neg, the
//! graph's only ones) and cut both halves with Slices; the opset-23 export has 2L
//! RotaryEmbedding. The builder's graphs have no rotation of their own: GroupQueryAttention
//! applies it, and the `attention` family lowers it.

mod common;

use common::float;

use ir::build::{GraphBuilder, ValueType};
use ir::{Attr, DType, Domain, Graph, Tensor, ValueId};
use rewrites::saturate::{rewrite_with, SaturationReport};
use std::collections::HashMap;

fn rope(g: &Graph) -> (Graph, SaturationReport) {
    rewrite_with(g, &[rewrites::family("rope").unwrap()])
}

// ---- exporters' files ----

/// Slices of a value a Rope rotates: what is left of a rotate-half.
fn slices_of_rotated(g: &Graph) -> usize {
    let rotated: Vec<ValueId> = g.nodes.iter().filter(|n| n.op == "Rope").filter_map(|n| n.inputs[0]).collect();
    g.nodes.iter().filter(|n| n.op == "Slice" && n.inputs[0].is_some_and(|x| rotated.contains(&x))).count()
}

/// Rewrites an entry, checks the count and that nothing of the rotation's spelling is left, and
/// returns the rewritten graph with its worst relative error against ONNX Runtime.
fn fold_entry(name: &str) -> (Graph, f64) {
    let g = common::import(name);
    let layers = common::meta(name).layers;
    let spelled = common::count(&g, "Neg") + common::count(&g, "RotaryEmbedding");
    assert_eq!(spelled, 2 * layers, "{name}: the rotations of q and k");
    let (out, report) = rope(&g);
    assert!(report.type_conflicts.is_empty(), "{name}: {:?}", report.type_conflicts);
    assert!(report.declined.is_empty(), "{name}: {:?}", report.declined);
    out.verify().unwrap();
    assert_eq!(common::count(&out, "Rope"), 2 * layers, "{name}: Rope");
    for op in ["Neg", "RotaryEmbedding"] {
        assert_eq!(common::count(&out, op), 0, "{name}: {op} left");
    }
    assert_eq!(slices_of_rotated(&out), 0, "{name}: a half of q or k is still sliced");
    let err = common::worst_relative_error(&out, name);
    eprintln!("{name}: worst relative error against ONNX Runtime {err:.3e}");
    (out, err)
}

fn check_float(name: &str) {
    let (_, err) = fold_entry(name);
    assert!(err <= 1e-4, "{name}: {err:e}");
}

/// QDQ files: the rotation stays float between the pairs and the fold is exact, so the rewritten
/// graph computes what the unrewritten one does on the reference evaluator (the rotation is the
/// same f32 operations: products, negation, one sum), and is no further from ONNX Runtime. That
/// distance is the QDQ graph's own: a value on a rounding tie of QuantizeLinear may round the
/// other way in ONNX Runtime (measured on the unrewritten files: llama-qdq-per-tensor-s8 8.5e-3
/// of the logits' range, one step; qwen3-quark-a8w8 9.9e-3, one step; the others 4e-8 to 2e-7).
fn check_qdq(name: &str) {
    let (out, err) = fold_entry(name);
    let g = common::import(name);
    let before = common::worst_relative_error(&g, name);
    assert!(err <= before + 1e-6, "{name}: {err:e} from ONNX Runtime, the unrewritten graph {before:e}");
    for case in ["prefill", "decode"] {
        let (inputs, _) = common::case(name, case);
        let want = ir::run::run_graph(&g, &inputs).unwrap();
        let got = ir::run::run_graph(&out, &inputs).unwrap();
        for (k, w) in &want {
            let d = common::relative_difference(&got[k], w);
            assert!(d <= 1e-6, "{name}/{case}/{k}: {d:e} of max|ref| from the unrewritten graph");
        }
    }
}

#[test]
fn llama_optimum_rotate_half() {
    check_float("llama-optimum");
}

#[test]
fn qwen3_optimum_rotate_half_after_qk_norms() {
    check_float("qwen3-optimum");
}

#[test]
fn phi3_optimum_rotate_half() {
    check_float("phi3-optimum");
}

#[test]
fn smollm2_optimum_rotate_half_60_ropes() {
    check_float("smollm2-optimum");
}

#[test]
fn llama_torch_dynamo_rotate_half() {
    check_float("llama-torch-dynamo");
}

#[test]
fn llama_torch_dynamo_opset23_rotary_embedding() {
    check_float("llama-torch-dynamo-opset23");
}

#[test]
fn qwen3_torch_dynamo_opset23_rotary_embedding_after_qk_norms() {
    check_float("qwen3-torch-dynamo-opset23");
}

#[test]
fn llama_qdq_per_tensor_s8_rotate_half_between_qdq_pairs() {
    check_qdq("llama-qdq-per-tensor-s8");
}

#[test]
fn llama_qdq_per_channel_u8_rotate_half_between_qdq_pairs() {
    check_qdq("llama-qdq-per-channel-u8");
}

#[test]
fn qwen3_qdq_per_tensor_s8_rotate_half_between_qdq_pairs() {
    check_qdq("qwen3-qdq-per-tensor-s8");
}

#[test]
fn qwen3_qdq_per_channel_u8_rotate_half_between_qdq_pairs() {
    check_qdq("qwen3-qdq-per-channel-u8");
}

#[test]
fn qwen3_quark_a8w8_rotate_half_between_qdq_pairs() {
    check_qdq("qwen3-quark-a8w8");
}

#[test]
fn builder_graphs_have_no_rotation_of_their_own() {
    for name in ["llama-builder-int4", "qwen3-builder-int4"] {
        let (out, report) = rope(&common::import(name));
        assert!(report.type_conflicts.is_empty() && report.declined.is_empty(), "{name}");
        assert_eq!(common::count(&out, "Rope"), 0, "{name}");
        assert_eq!(common::count(&out, "GroupQueryAttention"), common::meta(name).layers, "{name}");
    }
}

// ---- hand-built graphs ----

fn ints(net: &mut GraphBuilder, v: &[i64]) -> ValueId {
    net.constant("", Tensor::from_i64(DType::I64, vec![v.len()], v.to_vec()))
}

/// `Concat(values)` over the last axis.
fn concat_last(net: &mut GraphBuilder, values: &[ValueId], shape: &[usize]) -> ValueId {
    net.node(Domain::Onnx, "Concat").attr("axis", Attr::Int(-1)).inputs(values).output("", float(shape)).add()[0]
}

/// `Slice(x, [start], [end], [axis], [step])`.
fn slice(
    net: &mut GraphBuilder,
    x: ValueId,
    (start, end, axis, step): (i64, i64, i64, i64),
    shape: &[usize],
) -> ValueId {
    let (s, e, a, p) = (ints(net, &[start]), ints(net, &[end]), ints(net, &[axis]), ints(net, &[step]));
    net.op("Slice", &[x, s, e, a, p], float(shape))
}

/// torch's `rotate_half(x)` over the last axis: `Concat(−x[D/2:], x[:D/2])`.
fn rotate_half(net: &mut GraphBuilder, x: ValueId, shape: &[usize]) -> ValueId {
    let d = *shape.last().unwrap() as i64;
    let mut half = shape.to_vec();
    *half.last_mut().unwrap() /= 2;
    let x1 = slice(net, x, (0, d / 2, -1, 1), &half);
    let x2 = slice(net, x, (d / 2, i64::MAX, -1, 1), &half);
    let n = net.op("Neg", &[x2], float(&half));
    concat_last(net, &[n, x1], shape)
}

/// GPT-J's `rotate_every_two(x)`: `stack((−x[1::2], x[::2]), −1).flatten(−2)`.
fn rotate_every_two(net: &mut GraphBuilder, x: ValueId, shape: &[usize]) -> ValueId {
    let d = *shape.last().unwrap() as i64;
    let mut half = shape.to_vec();
    *half.last_mut().unwrap() /= 2;
    let even = slice(net, x, (0, d, -1, 2), &half);
    let odd = slice(net, x, (1, d, -1, 2), &half);
    let n = net.op("Neg", &[odd], float(&half));
    let mut col = half.clone();
    col.push(1);
    let last = ints(net, &[-1]);
    let (a, b) = (net.op("Unsqueeze", &[n, last], float(&col)), net.op("Unsqueeze", &[even, last], float(&col)));
    let mut pairs = half.clone();
    pairs.push(2);
    let stacked = concat_last(net, &[a, b], &pairs);
    let target: Vec<i64> = shape.iter().map(|&s| s as i64).collect();
    let t = ints(net, &target);
    net.op("Reshape", &[stacked, t], float(shape))
}

/// Finishes `net`, rewrites it, checks that it computes the same (one f32 rounding) on inputs
/// whose integer ones `ints` gives, and returns the result.
fn fold_net(net: GraphBuilder, ints: &HashMap<ValueId, Vec<i64>>) -> (Graph, SaturationReport) {
    let net = net.finish().unwrap();
    let (out, report) = rope(&net);
    assert!(report.type_conflicts.is_empty(), "{:?}", report.type_conflicts);
    out.verify().unwrap();
    let err = common::worst_difference(&net, &out, ints);
    assert!(err <= 1e-6, "rewritten graph differs by {err:e}");
    (out, report)
}

fn ops(g: &Graph) -> Vec<&str> {
    g.nodes.iter().map(|n| n.op).filter(|&op| op != "Identity").collect()
}

fn interleaved(g: &Graph) -> Vec<i64> {
    g.nodes.iter().filter(|n| n.op == "Rope").map(|n| n.attrs.int("interleaved").unwrap().unwrap()).collect()
}

fn declined(report: &SaturationReport, rule: &str, fragment: &str) -> bool {
    report.declined.iter().any(|d| d.rule == rule && d.reason.contains(fragment))
}

const X: [usize; 4] = [2, 3, 4, 8];

#[test]
fn rotate_half_with_tables_computed_in_graph_folds() {
    // cos/sin from Range → Cast → outer product with inverse frequencies → Concat → Cos/Sin, as
    // exporters that compute the tables in-graph write them; broadcast [S, D] against BNSH x.
    let mut net = common::net(23);
    let x = net.input("", float(&X));
    let (zero, four, one) = (
        net.constant("", Tensor::scalar_i64(0)),
        net.constant("", Tensor::scalar_i64(4)),
        net.constant("", Tensor::scalar_i64(1)),
    );
    let pos =
        net.node(Domain::Onnx, "Range").inputs(&[zero, four, one]).output("", ValueType::known(DType::I64, &[4])).add()
            [0];
    let pos = net.node(Domain::Onnx, "Cast").attr("to", Attr::Int(1)).inputs(&[pos]).output("", float(&[4])).add()[0];
    let axis = ints(&mut net, &[1]);
    let pos = net.op("Unsqueeze", &[pos, axis], float(&[4, 1]));
    let inv = net.constant("", Tensor::from_f32(DType::F32, vec![4], vec![1.0, 0.1, 0.01, 0.001]));
    let freqs = net.op("Mul", &[pos, inv], float(&[4, 4]));
    let emb = concat_last(&mut net, &[freqs, freqs], &[4, 8]);
    let cos = net.op("Cos", &[emb], float(&[4, 8]));
    let sin = net.op("Sin", &[emb], float(&[4, 8]));
    let a = net.op("Mul", &[x, cos], float(&X));
    let r = rotate_half(&mut net, x, &X);
    let b = net.op("Mul", &[r, sin], float(&X));
    let y = net.op("Add", &[a, b], float(&X));
    net.output(y);
    let (out, report) = fold_net(net, &HashMap::new());
    assert!(report.declined.is_empty());
    assert_eq!(interleaved(&out), vec![0]);
    for op in ["Neg", "Slice"] {
        assert!(!ops(&out).contains(&op), "{op} left: {:?}", ops(&out));
    }
    assert_eq!(ops(&out).iter().filter(|&&o| o == "Concat").count(), 1, "only the tables' Concat stays");
}

#[test]
fn rotate_half_with_the_sum_swapped_and_gathered_tables_folds() {
    let mut net = common::net(23);
    let x = net.input("", float(&X));
    let cos = net.input("", float(&[2, 1, 4, 8]));
    let sin = net.input("", float(&[2, 1, 4, 8]));
    let r = rotate_half(&mut net, x, &X);
    let b = net.op("Mul", &[r, sin], float(&X));
    let a = net.op("Mul", &[x, cos], float(&X));
    let y = net.op("Add", &[b, a], float(&X));
    net.output(y);
    let (out, _) = fold_net(net, &HashMap::new());
    assert_eq!(ops(&out), vec!["Rope"]);
    assert_eq!(interleaved(&out), vec![0]);
}

#[test]
fn interleaved_pairs_fold_in_either_order() {
    for swapped in [false, true] {
        let mut net = common::net(23);
        let x = net.input("", float(&X));
        let cos = net.input("", float(&[1, 1, 4, 8]));
        let sin = net.input("", float(&[1, 1, 4, 8]));
        let a = net.op("Mul", &[x, cos], float(&X));
        let r = rotate_every_two(&mut net, x, &X);
        let b = net.op("Mul", &[r, sin], float(&X));
        let y = if swapped { net.op("Add", &[b, a], float(&X)) } else { net.op("Add", &[a, b], float(&X)) };
        net.output(y);
        let (out, _) = fold_net(net, &HashMap::new());
        assert_eq!(ops(&out), vec!["Rope"], "swapped: {swapped}");
        assert_eq!(interleaved(&out), vec![1]);
    }
}

#[test]
fn tables_that_widen_x_are_declined() {
    // cos [2, 2, 4, 8] against x [1, 2, 4, 8]: the product broadcasts x over the batch, which
    // Rope (whose output has x's shape) cannot express.
    let xs = [1, 2, 4, 8];
    let mut net = common::net(23);
    let x = net.input("", float(&xs));
    let cos = net.input("", float(&[2, 2, 4, 8]));
    let sin = net.input("", float(&[2, 2, 4, 8]));
    let a = net.op("Mul", &[x, cos], float(&[2, 2, 4, 8]));
    let r = rotate_half(&mut net, x, &xs);
    let b = net.op("Mul", &[r, sin], float(&[2, 2, 4, 8]));
    let y = net.op("Add", &[a, b], float(&[2, 2, 4, 8]));
    net.output(y);
    let (out, report) = fold_net(net, &HashMap::new());
    assert!(!ops(&out).contains(&"Rope"));
    assert!(declined(&report, "rope-rotate-half", "do not broadcast to x"), "{:?}", report.declined);
}

#[test]
fn a_cut_off_the_middle_is_not_a_rotation() {
    let mut net = common::net(23);
    let x = net.input("", float(&X));
    let cos = net.input("", float(&[1, 1, 4, 8]));
    let sin = net.input("", float(&[1, 1, 4, 8]));
    let x1 = slice(&mut net, x, (0, 3, -1, 1), &[2, 3, 4, 3]);
    let x2 = slice(&mut net, x, (3, 8, -1, 1), &[2, 3, 4, 5]);
    let n = net.op("Neg", &[x2], float(&[2, 3, 4, 5]));
    let r = concat_last(&mut net, &[n, x1], &X);
    let a = net.op("Mul", &[x, cos], float(&X));
    let b = net.op("Mul", &[r, sin], float(&X));
    let y = net.op("Add", &[a, b], float(&X));
    net.output(y);
    let (out, report) = fold_net(net, &HashMap::new());
    assert!(!ops(&out).contains(&"Rope"));
    assert!(report.declined.is_empty());
}

/// A `[max_pos, D/2]` cache of distinct values.
fn cache(net: &mut GraphBuilder, rows: usize, half: usize, phase: f32) -> ValueId {
    let v = (0..rows * half).map(|i| ((i as f32) * 0.37 + phase).sin()).collect();
    net.constant("", Tensor::from_f32(DType::F32, vec![rows, half], v))
}

/// ONNX RotaryEmbedding(x, cos, sin, positions) with `attrs` on hidden states x [B, S, H·D] =
/// [2, 3, 16], positions [B, S] and `[10, half]` caches; returns the graph and the positions.
fn onnx_rotary_embedding_of_hidden_states(half: usize, attrs: &[(&str, Attr)]) -> (GraphBuilder, ValueId) {
    let mut net = common::net(23);
    let x = net.input("", float(&[2, 3, 16]));
    let pos = net.input("", ValueType::known(DType::I64, &[2, 3]));
    let (c, s) = (cache(&mut net, 10, half, 0.0), cache(&mut net, 10, half, 1.0));
    let y = net
        .node(Domain::Onnx, "RotaryEmbedding")
        .attrs(attrs)
        .inputs(&[x, c, s, pos])
        .output("", float(&[2, 3, 16]))
        .add()[0];
    net.output(y);
    (net, pos)
}

#[test]
fn onnx_rotary_embedding_on_hidden_states_with_positions_folds() {
    // [B, S, H·D] = [2, 3, 2·8] with num_heads, interleaved, positions [B, S].
    for interleave in [0, 1] {
        let attrs = [("num_heads", Attr::Int(2)), ("interleaved", Attr::Int(interleave))];
        let (net, pos) = onnx_rotary_embedding_of_hidden_states(4, &attrs);
        let ints = HashMap::from([(pos, vec![0, 1, 2, 7, 8, 9])]);
        let (out, report) = fold_net(net, &ints);
        assert!(report.declined.is_empty(), "{:?}", report.declined);
        assert!(!ops(&out).contains(&"RotaryEmbedding"), "{:?}", ops(&out));
        assert_eq!(interleaved(&out), vec![interleave]);
    }
}

#[test]
fn onnx_rotary_embedding_on_heads_with_gathered_rows_folds() {
    // [B, H, S, D] = [2, 2, 3, 8] and, without position_ids, rows [B, S, D/2].
    let mut net = common::net(23);
    let x = net.input("", float(&[2, 2, 3, 8]));
    let c = net.input("", float(&[2, 3, 4]));
    let s = net.input("", float(&[2, 3, 4]));
    let y = net.node(Domain::Onnx, "RotaryEmbedding").inputs(&[x, c, s]).output("", float(&[2, 2, 3, 8])).add()[0];
    net.output(y);
    let (out, report) = fold_net(net, &HashMap::new());
    assert!(report.declined.is_empty(), "{:?}", report.declined);
    assert!(!ops(&out).contains(&"RotaryEmbedding"), "{:?}", ops(&out));
    assert_eq!(interleaved(&out), vec![0]);
}

#[test]
fn contrib_rotary_embedding_with_positions_or_a_start_offset_folds() {
    for offset in [false, true] {
        let mut net = common::net(23);
        let x = net.input("", float(&[2, 3, 16]));
        let pos = if offset {
            net.input("", ValueType::known(DType::I64, &[1]))
        } else {
            net.input("", ValueType::known(DType::I64, &[2, 3]))
        };
        let (c, s) = (cache(&mut net, 10, 4, 0.5), cache(&mut net, 10, 4, 2.0));
        let attrs = [("num_heads", Attr::Int(2))];
        let y = net
            .node(Domain::Microsoft, "RotaryEmbedding")
            .attrs(&attrs)
            .inputs(&[x, pos, c, s])
            .output("", float(&[2, 3, 16]))
            .add()[0];
        net.output(y);
        let ints = HashMap::from([(pos, if offset { vec![4] } else { vec![3, 4, 5, 0, 1, 2] })]);
        let (out, report) = fold_net(net, &ints);
        assert!(report.declined.is_empty(), "{:?}", report.declined);
        assert!(!ops(&out).contains(&"RotaryEmbedding"), "offset {offset}: {:?}", ops(&out));
        assert_eq!(interleaved(&out), vec![0]);
    }
}

#[test]
fn partial_rotation_is_declined() {
    // rotary_embedding_dim = 4 of a head of 8: the caches rotate half the head.
    let attrs = [("num_heads", Attr::Int(2)), ("rotary_embedding_dim", Attr::Int(4))];
    let (net, pos) = onnx_rotary_embedding_of_hidden_states(2, &attrs);
    let ints = HashMap::from([(pos, vec![0, 1, 2, 3, 4, 5])]);
    let (out, report) = fold_net(net, &ints);
    assert!(ops(&out).contains(&"RotaryEmbedding"));
    assert!(declined(&report, "rope-onnx-rotary-embedding", "Rope rotates the full width"), "{:?}", report.declined);
}

//! Rule family `rope`: every fixture form with a rotary embedding outside attention folds it into
//! `Rope` with the count the model implies and stays within tolerance of ONNX Runtime; each
//! exporter spelling and each refusal is checked on a small hand-built graph against the
//! reference evaluator of the unrewritten graph.
//!
//! Counts, for a decoder of L layers: 2L Rope (q and k of every layer), nothing of the rotation's
//! spelling left (no Neg, no Slice in forms 1 and 3; no RotaryEmbedding in form 4). Form 2 has no
//! rotation of its own: GroupQueryAttention applies it, and the `attention` family lowers it.

mod common;

use ir::{Attr, Attrs, DType, Dim, Domain, Graph, Tensor, ValueDef, ValueId};
use rewrites::saturate::{rewrite_with, SaturationReport};
use std::collections::HashMap;

fn rope(g: &Graph) -> (Graph, SaturationReport) {
    rewrite_with(g, &[rewrites::family("rope").unwrap()])
}

// ---- fixtures ----

/// A top-level field of `fixtures/<name>/meta.json`, as text.
fn meta_field(name: &str, key: &str) -> String {
    let text = std::fs::read_to_string(common::fixtures_dir().join(name).join("meta.json")).unwrap();
    let pat = format!("\"{key}\":");
    let start = text.find(&pat).unwrap_or_else(|| panic!("{name}: meta.json has no `{key}`")) + pat.len();
    let rest = text[start..].trim_start();
    let end = rest.find([',', '}']).unwrap();
    rest[..end].trim().trim_matches('"').to_string()
}

/// Rewrites a fixture, checks the count and that nothing of the rotation's spelling is left, and
/// returns the rewritten graph with its worst relative error against ONNX Runtime.
fn fold_fixture(name: &str) -> (Graph, f64) {
    let g = common::import(name);
    let (out, report) = rope(&g);
    assert!(report.type_conflicts.is_empty(), "{name}: {:?}", report.type_conflicts);
    assert!(report.declined.is_empty(), "{name}: {:?}", report.declined);
    out.verify().unwrap();
    let layers: usize = meta_field(name, "layers").parse().unwrap();
    assert_eq!(common::count(&out, "Rope"), 2 * layers, "{name}: Rope");
    for op in ["Neg", "Slice", "RotaryEmbedding"] {
        assert_eq!(common::count(&out, op), 0, "{name}: {op} left");
    }
    let err = common::worst_relative_error(&out, name);
    eprintln!("{name}: worst relative error against ONNX Runtime {err:.3e}");
    (out, err)
}

fn check_float(name: &str) {
    let (_, err) = fold_fixture(name);
    assert!(err <= 1e-4, "{name}: {err:e}");
}

/// QDQ forms: the rotation stays float between the pairs and the fold is exact, so the rewritten
/// graph computes what the unrewritten one does on the reference evaluator (the rotation is the
/// same f32 operations: products, negation, one sum), and is no further from ONNX Runtime. That
/// distance is the QDQ graph's own: a value on a rounding tie of QuantizeLinear may round the
/// other way in ONNX Runtime (qwen3_f3a: 2.1e-2 of the logits' range, the other three 0 to 1.5e-7).
fn check_qdq(name: &str) {
    let (out, err) = fold_fixture(name);
    let g = common::import(name);
    let before = common::worst_relative_error(&g, name);
    assert!(err <= before + 1e-6, "{name}: {err:e} from ONNX Runtime, the unrewritten graph {before:e}");
    for case in ["prefill", "decode"] {
        let (inputs, _) = common::case(name, case);
        let want = ir::run::run_graph(&g, &inputs).unwrap();
        let got = ir::run::run_graph(&out, &inputs).unwrap();
        for (k, w) in &want {
            let (a, b) = (got[k].to_f64_vec(), w.to_f64_vec());
            let m = b.iter().fold(0.0f64, |m, x| m.max(x.abs()));
            let d = a.iter().zip(&b).fold(0.0f64, |d, (x, y)| d.max((x - y).abs()));
            assert!(d <= 1e-6 * m, "{name}/{case}/{k}: {d:e} from the unrewritten graph");
        }
    }
}

#[test]
fn llama_f1_rotate_half() {
    check_float("llama_f1");
}

#[test]
fn qwen3_f1_rotate_half() {
    check_float("qwen3_f1");
}

#[test]
fn smollm2_f1_rotate_half_60_ropes() {
    check_float("smollm2_f1");
}

#[test]
fn llama_f4_rotary_embedding() {
    check_float("llama_f4");
}

#[test]
fn qwen3_f4_rotary_embedding_after_qk_norms() {
    check_float("qwen3_f4");
}

#[test]
fn llama_f3a_rotate_half_between_qdq_pairs() {
    check_qdq("llama_f3a");
}

#[test]
fn llama_f3b_rotate_half_between_qdq_pairs() {
    check_qdq("llama_f3b");
}

#[test]
fn qwen3_f3a_rotate_half_between_qdq_pairs() {
    check_qdq("qwen3_f3a");
}

#[test]
fn qwen3_f3b_rotate_half_between_qdq_pairs() {
    check_qdq("qwen3_f3b");
}

#[test]
fn genai_forms_have_no_rotation_of_their_own() {
    for name in ["llama_f2", "qwen3_f2"] {
        let (out, report) = rope(&common::import(name));
        assert!(report.type_conflicts.is_empty() && report.declined.is_empty(), "{name}");
        assert_eq!(common::count(&out, "Rope"), 0, "{name}");
        assert_eq!(common::count(&out, "GroupQueryAttention"), 2, "{name}");
    }
}

// ---- hand-built graphs ----

/// A small graph written node by node; values are named `v<i>`, all dims known.
struct Net {
    g: Graph,
}

impl Net {
    fn new() -> Net {
        let g = Graph {
            name: "net".into(),
            values: vec![],
            nodes: vec![],
            inputs: vec![],
            outputs: vec![],
            weights: Default::default(),
            assumptions: vec![],
        };
        Net { g }
    }

    fn value(&mut self, dtype: DType, shape: &[usize], def: ValueDef) -> ValueId {
        let name = format!("v{}", self.g.values.len());
        let shape = shape.iter().map(|&d| Dim::known(d as i64)).collect();
        self.g.values.push(ir::Value { name, dtype, shape, def });
        ValueId(self.g.values.len() as u32 - 1)
    }

    fn input(&mut self, dtype: DType, shape: &[usize]) -> ValueId {
        let v = self.value(dtype, shape, ValueDef::Input);
        self.g.inputs.push(v);
        v
    }

    fn constant(&mut self, t: Tensor) -> ValueId {
        let (dtype, shape) = (t.dtype, t.shape.clone());
        self.value(dtype, &shape, ValueDef::Const(t))
    }

    fn ints(&mut self, v: &[i64]) -> ValueId {
        self.constant(Tensor::from_i64(DType::I64, vec![v.len()], v.to_vec()))
    }

    fn node(
        &mut self,
        domain: Domain,
        op: &str,
        attrs: &[(&str, Attr)],
        inputs: &[ValueId],
        out: (DType, &[usize]),
    ) -> ValueId {
        let spec = ir::op::lookup(domain, op).unwrap();
        let node = ir::NodeId(self.g.nodes.len() as u32);
        let y = self.value(out.0, out.1, ValueDef::Node { node, output: 0 });
        let mut a = Attrs::default();
        for (k, v) in attrs {
            a.set(k, v.clone());
        }
        let opset = if domain == Domain::Onnx { 23 } else { 1 };
        self.g.nodes.push(ir::Node {
            name: format!("n{}", node.0),
            domain,
            op: spec.name,
            opset,
            attrs: a,
            inputs: inputs.iter().map(|&v| Some(v)).collect(),
            outputs: vec![y],
        });
        y
    }

    fn op(&mut self, op: &str, inputs: &[ValueId], shape: &[usize]) -> ValueId {
        self.node(Domain::Onnx, op, &[], inputs, (DType::F32, shape))
    }

    fn output(&mut self, v: ValueId) {
        self.g.outputs.push(v);
    }

    /// `Slice(x, [start], [end], [axis], [step])`.
    fn slice(&mut self, x: ValueId, (start, end, axis, step): (i64, i64, i64, i64), shape: &[usize]) -> ValueId {
        let (s, e, a, p) = (self.ints(&[start]), self.ints(&[end]), self.ints(&[axis]), self.ints(&[step]));
        self.op("Slice", &[x, s, e, a, p], shape)
    }

    /// torch's `rotate_half(x)` over the last axis: `Concat(−x[D/2:], x[:D/2])`.
    fn rotate_half(&mut self, x: ValueId, shape: &[usize]) -> ValueId {
        let d = *shape.last().unwrap() as i64;
        let mut half = shape.to_vec();
        *half.last_mut().unwrap() /= 2;
        let x1 = self.slice(x, (0, d / 2, -1, 1), &half);
        let x2 = self.slice(x, (d / 2, i64::MAX, -1, 1), &half);
        let n = self.op("Neg", &[x2], &half);
        self.node(Domain::Onnx, "Concat", &[("axis", Attr::Int(-1))], &[n, x1], (DType::F32, shape))
    }

    /// GPT-J's `rotate_every_two(x)`: `stack((−x[1::2], x[::2]), −1).flatten(−2)`.
    fn rotate_every_two(&mut self, x: ValueId, shape: &[usize]) -> ValueId {
        let d = *shape.last().unwrap() as i64;
        let mut half = shape.to_vec();
        *half.last_mut().unwrap() /= 2;
        let even = self.slice(x, (0, d, -1, 2), &half);
        let odd = self.slice(x, (1, d, -1, 2), &half);
        let n = self.op("Neg", &[odd], &half);
        let mut col = half.clone();
        col.push(1);
        let last = self.ints(&[-1]);
        let (a, b) = (self.op("Unsqueeze", &[n, last], &col), self.op("Unsqueeze", &[even, last], &col));
        let mut pairs = half.clone();
        pairs.push(2);
        let stacked = self.node(Domain::Onnx, "Concat", &[("axis", Attr::Int(-1))], &[a, b], (DType::F32, &pairs));
        let target: Vec<i64> = shape.iter().map(|&s| s as i64).collect();
        let t = self.ints(&target);
        self.op("Reshape", &[stacked, t], shape)
    }

    /// Deterministic values for every input: floats in [−2, 2), integer inputs from `ints`.
    fn feeds(&self, ints: &HashMap<ValueId, Vec<i64>>) -> HashMap<String, Tensor> {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
        };
        self.g
            .inputs
            .iter()
            .map(|&i| {
                let v = self.g.value(i);
                let shape: Vec<usize> = v.shape.iter().map(|d| d.as_known().unwrap() as usize).collect();
                let n = shape.iter().product();
                let t = match ints.get(&i) {
                    Some(values) => Tensor::from_i64(v.dtype, shape, values.clone()),
                    None => Tensor::from_f32(DType::F32, shape, (0..n).map(|_| next()).collect()),
                };
                (v.name.clone(), t)
            })
            .collect()
    }
}

/// Worst max|Δ|/max|ref| of `b`'s outputs against `a`'s on the same inputs.
fn worst_difference(a: &Net, b: &Graph, ints: &HashMap<ValueId, Vec<i64>>) -> f64 {
    let feeds = a.feeds(ints);
    let want = ir::run::run_graph(&a.g, &feeds).unwrap();
    let got = ir::run::run_graph(b, &feeds).unwrap();
    let mut worst = 0.0f64;
    for &o in &a.g.outputs {
        let name = &a.g.value(o).name;
        let (x, y) = (got[name].to_f64_vec(), want[name].to_f64_vec());
        assert_eq!(got[name].shape, want[name].shape, "{name}");
        let m = y.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        let d = x.iter().zip(&y).fold(0.0f64, |d, (p, q)| d.max((p - q).abs()));
        worst = worst.max(d / m);
    }
    worst
}

/// Rewrites `net`, checks that it computes the same (one f32 rounding) and returns the result.
fn fold_net(net: &Net, ints: &HashMap<ValueId, Vec<i64>>) -> (Graph, SaturationReport) {
    let (out, report) = rope(&net.g);
    assert!(report.type_conflicts.is_empty(), "{:?}", report.type_conflicts);
    out.verify().unwrap();
    let err = worst_difference(net, &out, ints);
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
    let mut net = Net::new();
    let x = net.input(DType::F32, &X);
    let (zero, four, one) =
        (net.constant(Tensor::scalar_i64(0)), net.constant(Tensor::scalar_i64(4)), net.constant(Tensor::scalar_i64(1)));
    let pos = net.node(Domain::Onnx, "Range", &[], &[zero, four, one], (DType::I64, &[4]));
    let pos = net.node(Domain::Onnx, "Cast", &[("to", Attr::Int(1))], &[pos], (DType::F32, &[4]));
    let axis = net.ints(&[1]);
    let pos = net.op("Unsqueeze", &[pos, axis], &[4, 1]);
    let inv = net.constant(Tensor::from_f32(DType::F32, vec![4], vec![1.0, 0.1, 0.01, 0.001]));
    let freqs = net.op("Mul", &[pos, inv], &[4, 4]);
    let emb = net.node(Domain::Onnx, "Concat", &[("axis", Attr::Int(-1))], &[freqs, freqs], (DType::F32, &[4, 8]));
    let cos = net.op("Cos", &[emb], &[4, 8]);
    let sin = net.op("Sin", &[emb], &[4, 8]);
    let a = net.op("Mul", &[x, cos], &X);
    let r = net.rotate_half(x, &X);
    let b = net.op("Mul", &[r, sin], &X);
    let y = net.op("Add", &[a, b], &X);
    net.output(y);
    let (out, report) = fold_net(&net, &HashMap::new());
    assert!(report.declined.is_empty());
    assert_eq!(interleaved(&out), vec![0]);
    for op in ["Neg", "Slice"] {
        assert!(!ops(&out).contains(&op), "{op} left: {:?}", ops(&out));
    }
    assert_eq!(ops(&out).iter().filter(|&&o| o == "Concat").count(), 1, "only the tables' Concat stays");
}

#[test]
fn rotate_half_with_the_sum_swapped_and_gathered_tables_folds() {
    let mut net = Net::new();
    let x = net.input(DType::F32, &X);
    let cos = net.input(DType::F32, &[2, 1, 4, 8]);
    let sin = net.input(DType::F32, &[2, 1, 4, 8]);
    let r = net.rotate_half(x, &X);
    let b = net.op("Mul", &[r, sin], &X);
    let a = net.op("Mul", &[x, cos], &X);
    let y = net.op("Add", &[b, a], &X);
    net.output(y);
    let (out, _) = fold_net(&net, &HashMap::new());
    assert_eq!(ops(&out), vec!["Rope"]);
    assert_eq!(interleaved(&out), vec![0]);
}

#[test]
fn interleaved_pairs_fold_in_either_order() {
    for swapped in [false, true] {
        let mut net = Net::new();
        let x = net.input(DType::F32, &X);
        let cos = net.input(DType::F32, &[1, 1, 4, 8]);
        let sin = net.input(DType::F32, &[1, 1, 4, 8]);
        let a = net.op("Mul", &[x, cos], &X);
        let r = net.rotate_every_two(x, &X);
        let b = net.op("Mul", &[r, sin], &X);
        let y = if swapped { net.op("Add", &[b, a], &X) } else { net.op("Add", &[a, b], &X) };
        net.output(y);
        let (out, _) = fold_net(&net, &HashMap::new());
        assert_eq!(ops(&out), vec!["Rope"], "swapped: {swapped}");
        assert_eq!(interleaved(&out), vec![1]);
    }
}

#[test]
fn tables_that_widen_x_are_declined() {
    // cos [2, 2, 4, 8] against x [1, 2, 4, 8]: the product broadcasts x over the batch, which
    // Rope (whose output has x's shape) cannot express.
    let xs = [1, 2, 4, 8];
    let mut net = Net::new();
    let x = net.input(DType::F32, &xs);
    let cos = net.input(DType::F32, &[2, 2, 4, 8]);
    let sin = net.input(DType::F32, &[2, 2, 4, 8]);
    let a = net.op("Mul", &[x, cos], &[2, 2, 4, 8]);
    let r = net.rotate_half(x, &xs);
    let b = net.op("Mul", &[r, sin], &[2, 2, 4, 8]);
    let y = net.op("Add", &[a, b], &[2, 2, 4, 8]);
    net.output(y);
    let (out, report) = fold_net(&net, &HashMap::new());
    assert!(!ops(&out).contains(&"Rope"));
    assert!(declined(&report, "rope-rotate-half", "do not broadcast to x"), "{:?}", report.declined);
}

#[test]
fn a_cut_off_the_middle_is_not_a_rotation() {
    let mut net = Net::new();
    let x = net.input(DType::F32, &X);
    let cos = net.input(DType::F32, &[1, 1, 4, 8]);
    let sin = net.input(DType::F32, &[1, 1, 4, 8]);
    let x1 = net.slice(x, (0, 3, -1, 1), &[2, 3, 4, 3]);
    let x2 = net.slice(x, (3, 8, -1, 1), &[2, 3, 4, 5]);
    let n = net.op("Neg", &[x2], &[2, 3, 4, 5]);
    let r = net.node(Domain::Onnx, "Concat", &[("axis", Attr::Int(-1))], &[n, x1], (DType::F32, &X));
    let a = net.op("Mul", &[x, cos], &X);
    let b = net.op("Mul", &[r, sin], &X);
    let y = net.op("Add", &[a, b], &X);
    net.output(y);
    let (out, report) = fold_net(&net, &HashMap::new());
    assert!(!ops(&out).contains(&"Rope"));
    assert!(report.declined.is_empty());
}

/// A `[max_pos, D/2]` cache of distinct values.
fn cache(net: &mut Net, rows: usize, half: usize, phase: f32) -> ValueId {
    let v = (0..rows * half).map(|i| ((i as f32) * 0.37 + phase).sin()).collect();
    net.constant(Tensor::from_f32(DType::F32, vec![rows, half], v))
}

#[test]
fn onnx_rotary_embedding_on_hidden_states_with_positions_folds() {
    // [B, S, H·D] = [2, 3, 2·8] with num_heads, interleaved, positions [B, S].
    for interleave in [0, 1] {
        let mut net = Net::new();
        let x = net.input(DType::F32, &[2, 3, 16]);
        let pos = net.input(DType::I64, &[2, 3]);
        let (c, s) = (cache(&mut net, 10, 4, 0.0), cache(&mut net, 10, 4, 1.0));
        let attrs = [("num_heads", Attr::Int(2)), ("interleaved", Attr::Int(interleave))];
        let y = net.node(Domain::Onnx, "RotaryEmbedding", &attrs, &[x, c, s, pos], (DType::F32, &[2, 3, 16]));
        net.output(y);
        let ints = HashMap::from([(pos, vec![0, 1, 2, 7, 8, 9])]);
        let (out, report) = fold_net(&net, &ints);
        assert!(report.declined.is_empty(), "{:?}", report.declined);
        assert!(!ops(&out).contains(&"RotaryEmbedding"), "{:?}", ops(&out));
        assert_eq!(interleaved(&out), vec![interleave]);
    }
}

#[test]
fn onnx_rotary_embedding_on_heads_with_gathered_rows_folds() {
    // [B, H, S, D] = [2, 2, 3, 8] and, without position_ids, rows [B, S, D/2].
    let mut net = Net::new();
    let x = net.input(DType::F32, &[2, 2, 3, 8]);
    let c = net.input(DType::F32, &[2, 3, 4]);
    let s = net.input(DType::F32, &[2, 3, 4]);
    let y = net.node(Domain::Onnx, "RotaryEmbedding", &[], &[x, c, s], (DType::F32, &[2, 2, 3, 8]));
    net.output(y);
    let (out, report) = fold_net(&net, &HashMap::new());
    assert!(report.declined.is_empty(), "{:?}", report.declined);
    assert!(!ops(&out).contains(&"RotaryEmbedding"), "{:?}", ops(&out));
    assert_eq!(interleaved(&out), vec![0]);
}

#[test]
fn contrib_rotary_embedding_with_positions_or_a_start_offset_folds() {
    for offset in [false, true] {
        let mut net = Net::new();
        let x = net.input(DType::F32, &[2, 3, 16]);
        let pos = if offset { net.input(DType::I64, &[1]) } else { net.input(DType::I64, &[2, 3]) };
        let (c, s) = (cache(&mut net, 10, 4, 0.5), cache(&mut net, 10, 4, 2.0));
        let attrs = [("num_heads", Attr::Int(2))];
        let y = net.node(Domain::Microsoft, "RotaryEmbedding", &attrs, &[x, pos, c, s], (DType::F32, &[2, 3, 16]));
        net.output(y);
        let ints = HashMap::from([(pos, if offset { vec![4] } else { vec![3, 4, 5, 0, 1, 2] })]);
        let (out, report) = fold_net(&net, &ints);
        assert!(report.declined.is_empty(), "{:?}", report.declined);
        assert!(!ops(&out).contains(&"RotaryEmbedding"), "offset {offset}: {:?}", ops(&out));
        assert_eq!(interleaved(&out), vec![0]);
    }
}

#[test]
fn partial_rotation_is_declined() {
    // rotary_embedding_dim = 4 of a head of 8: the caches rotate half the head.
    let mut net = Net::new();
    let x = net.input(DType::F32, &[2, 3, 16]);
    let pos = net.input(DType::I64, &[2, 3]);
    let (c, s) = (cache(&mut net, 10, 2, 0.0), cache(&mut net, 10, 2, 1.0));
    let attrs = [("num_heads", Attr::Int(2)), ("rotary_embedding_dim", Attr::Int(4))];
    let y = net.node(Domain::Onnx, "RotaryEmbedding", &attrs, &[x, c, s, pos], (DType::F32, &[2, 3, 16]));
    net.output(y);
    let ints = HashMap::from([(pos, vec![0, 1, 2, 3, 4, 5])]);
    let (out, report) = fold_net(&net, &ints);
    assert!(ops(&out).contains(&"RotaryEmbedding"));
    assert!(declined(&report, "rope-onnx-rotary-embedding", "Rope rotates the full width"), "{:?}", report.declined);
}

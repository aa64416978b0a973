//! Family `qdq`: every int8 projection of the QDQ files (onnxruntime's quantize_static, AMD
//! Quark), the tied lm_head included, becomes one requantising QGemm whose outputs match ONNX
//! Runtime's on that file within the QDQ bound; each exporter spelling folds in a hand-built
//! graph; each refusal is recorded with its reason; and QGemm equals an exact integer reference,
//! ties of the output rounding included.

mod common;

use common::{indexed_node, rows};
use ir::build::ValueType;
use ir::{Attr, Attrs, DType, Dim, Domain, Graph, Node, OpRef, Tensor, ValueDef, ValueId, Weight, WeightStore};
use rewrites::saturate::{rewrite_with, SaturationReport};
use std::collections::HashMap;
use std::sync::Arc;

fn qdq() -> rewrites::Family {
    rewrites::family("qdq").unwrap()
}

/// Steps of the output scale allowed for outputs that are DequantizeLinear results (the bound of
/// the repository's evaluator-vs-ONNX-Runtime test), and the relative bound for float outputs.
const QDQ_MAX_STEPS: f64 = 2.0;
const FLOAT_TOL: f64 = 1e-4;

/// The tensor a weight or constant value holds.
fn value_tensor(g: &Graph, v: ValueId) -> Option<Tensor> {
    match &g.value(v).def {
        ValueDef::Const(t) => Some(t.clone()),
        ValueDef::Weight(w) => g.weights.get(*w).to_tensor().ok(),
        _ => None,
    }
}

fn producer(g: &Graph, v: ValueId) -> Option<&Node> {
    common::producer(g, v)
}

/// MatMuls whose right operand is a DequantizeLinear of compile-time codes (a weight, or a
/// QuantizeLinear of a Transpose of a weight): the products this family must have folded.
fn weight_matmuls_left(g: &Graph) -> usize {
    let compile_time = |v: ValueId| -> bool {
        match producer(g, v) {
            None => !matches!(g.value(v).def, ValueDef::Input),
            Some(q) if q.op == "QuantizeLinear" => q.inputs[0]
                .and_then(|x| producer(g, x))
                .is_some_and(|t| t.op == "Transpose" && t.inputs[0].is_some_and(|w| producer(g, w).is_none())),
            Some(_) => false,
        }
    };
    g.nodes
        .iter()
        .filter(|n| n.op == "MatMul")
        .filter(|n| {
            n.inputs[1]
                .and_then(|y| producer(g, y))
                .is_some_and(|d| d.op == "DequantizeLinear" && d.inputs[0].is_some_and(compile_time))
        })
        .count()
}

/// Runs `g` keeping every value (for looking inside the program).
fn run_keeping_values(g: &Graph, inputs: &HashMap<String, Tensor>) -> Vec<Option<Tensor>> {
    let mut slots: Vec<Option<Tensor>> = g
        .values
        .iter()
        .enumerate()
        .map(|(i, v)| match &v.def {
            ValueDef::Input => inputs.get(&v.name).cloned(),
            ValueDef::Node { .. } => None,
            _ => value_tensor(g, ValueId(i as u32)),
        })
        .collect();
    for n in &g.nodes {
        let results = {
            let args: Vec<Option<&Tensor>> =
                n.inputs.iter().map(|i| i.and_then(|i| slots[i.0 as usize].as_ref())).collect();
            let op = OpRef { node: &n.name, domain: n.domain, op: n.op, opset: n.opset, attrs: &n.attrs };
            ir::eval::eval_op(&op, &args, n.outputs.len()).unwrap_or_else(|e| panic!("{e}"))
        };
        for (&o, t) in n.outputs.iter().zip(results) {
            slots[o.0 as usize] = Some(t);
        }
    }
    slots
}

fn eval1(domain: Domain, op: &str, attrs: &Attrs, inputs: &[&Tensor]) -> Tensor {
    let r = OpRef { node: op, domain, op, opset: 21, attrs };
    let args: Vec<Option<&Tensor>> = inputs.iter().map(|t| Some(*t)).collect();
    ir::eval::eval_op(&r, &args, 1).unwrap_or_else(|e| panic!("{e}")).remove(0)
}

/// QuantizeLinear(MatMul(DequantizeLinear(a), DequantizeLinear(w))): the unfused form of an
/// 8-input QGemm, evaluated op by op.
fn unfused_qgemm(args: &[&Tensor]) -> Tensor {
    let none = Attrs::default();
    let x = eval1(Domain::Onnx, "DequantizeLinear", &none, &[args[0], args[1], args[2]]);
    let w = eval1(Domain::Onnx, "DequantizeLinear", &none, &[args[3], args[4], args[5]]);
    let y = eval1(Domain::Onnx, "MatMul", &none, &[&x, &w]);
    eval1(Domain::Onnx, "QuantizeLinear", &none, &[&y, args[6], args[7]])
}

/// What the QGemms of a program do at the rounding of their output, over both recorded cases.
#[derive(Default)]
struct Ties {
    /// Output codes compared.
    codes: usize,
    /// Codes whose exact value acc·sₐ·s_w/s_y lies within 10⁻³ of a step of a rounding tie, and
    /// within 10⁻⁵ (about the f32 resolution of values up to 255: a tie f32 arithmetic may break
    /// either way).
    near: usize,
    nearest: usize,
    /// Codes that differ from the unfused DequantizeLinear → MatMul → QuantizeLinear on the same
    /// inputs (a near-tie the two f32 orders round differently), and by how much at most.
    flipped: usize,
    worst: i64,
}

fn qgemm_ties(g: &Graph, name: &str) -> Ties {
    let mut t = Ties::default();
    for c in ["prefill", "decode"] {
        let (inputs, _) = common::case(name, c);
        let slots = run_keeping_values(g, &inputs);
        for n in g.nodes.iter().filter(|n| n.op == "QGemm") {
            let args: Vec<&Tensor> = n.inputs.iter().map(|i| slots[i.unwrap().0 as usize].as_ref().unwrap()).collect();
            let fused = slots[n.outputs[0].0 as usize].as_ref().unwrap();
            let unfused = unfused_qgemm(&args);
            assert_eq!(fused.shape, unfused.shape);
            for (x, y) in fused.as_i64().unwrap().iter().zip(unfused.as_i64().unwrap()) {
                if x != y {
                    t.flipped += 1;
                    t.worst = t.worst.max((x - y).abs());
                }
            }
            let (k, cols) = (args[3].shape[0], args[3].shape[1]);
            let ints = |i: usize| args[i].as_i64().unwrap();
            let acc = int32_accumulators(ints(0), ints(2)[0], ints(3), ints(5), args[0].numel() / k, k, cols);
            let (sa, sw, sy) = (args[1].to_f64_vec()[0], args[4].to_f64_vec(), args[6].to_f64_vec()[0]);
            for (i, &x) in acc.iter().enumerate() {
                let v = x as f64 * sa * sw[if sw.len() == 1 { 0 } else { i % cols }] / sy;
                let distance = (v - v.floor() - 0.5).abs();
                t.near += usize::from(distance < 1e-3);
                t.nearest += usize::from(distance < 1e-5);
            }
            t.codes += fused.numel();
        }
    }
    t
}

/// Runs `g` on both recorded cases of entry `name` and returns the worst relative error of the
/// float outputs and the worst error, in steps of their scale, of the dequantised outputs.
fn error_vs_ort(g: &Graph, name: &str) -> (f64, f64) {
    let (mut rel, mut steps) = (0.0f64, 0.0f64);
    let names = g.value_by_name();
    for c in ["prefill", "decode"] {
        let (inputs, outputs) = common::case(name, c);
        let got = ir::run::run_graph(g, &inputs).unwrap_or_else(|e| panic!("{name}/{c}: {e}"));
        for (output, want) in outputs {
            let t = &got[&output];
            assert_eq!(t.shape, want.shape, "{name}/{c}: {output}");
            let (a, b) = (t.to_f64_vec(), want.to_f64_vec());
            let d = a.iter().zip(&b).fold(0.0f64, |d, (x, y)| d.max((x - y).abs()));
            match g.dequantize_step(names[output.as_str()]) {
                Some(scale) => steps = steps.max(d / scale),
                None => rel = rel.max(common::relative_difference(t, &want)),
            }
        }
    }
    (rel, steps)
}

/// The accounting: 7 projections per layer plus the lm_head, each one requantising QGemm; no
/// weight product left; the products of two run-time operands untouched and declined.
fn assert_every_projection_folded(name: &str, g: &Graph, r: &Graph, report: &SaturationReport) {
    let layers = common::meta(name).layers;
    assert!(report.type_conflicts.is_empty(), "{name}: {:?}", report.type_conflicts);
    assert_eq!(common::count(r, "QGemm"), 7 * layers + 1, "{name}: QGemms");
    assert!(
        r.nodes.iter().filter(|n| n.op == "QGemm").all(|n| n.inputs.len() == 8),
        "{name}: a QGemm without its epilogue"
    );
    assert_eq!(weight_matmuls_left(r), 0, "{name}: DequantizeLinear→MatMul on weights left");
    assert_eq!(weight_matmuls_left(g), 7 * layers + 1, "{name}: the count above can fail");
    // What is left are the products of two quantised activations: attention's QKᵀ and AV per
    // layer, and the rotary embedding's inv_freq × positions, which both tools quantise too.
    assert_eq!(common::count(r, "MatMul"), 2 * layers + 1, "{name}: MatMuls left");
    let declined: Vec<_> = report.declined.iter().filter(|d| d.rule == "qdq-matmul").collect();
    assert_eq!(declined.len(), 2 * layers + 1, "{name}: {declined:?}");
    assert!(declined.iter().all(|d| d.reason.contains("computed at run time")), "{name}: {declined:?}");
}

/// The embedding table the token Gather reads, when the lm_head's weight is that table
/// transposed and quantised at run time (tied embeddings): QuantizeLinear(Transpose(E)).
fn tied_table(g: &Graph, lm_head_codes: ValueId) -> Option<ValueId> {
    let codes = producer(g, lm_head_codes).filter(|n| n.op == "QuantizeLinear")?;
    let transpose = producer(g, codes.inputs[0]?).filter(|n| n.op == "Transpose")?;
    transpose.inputs[0].filter(|&e| matches!(g.value(e).def, ValueDef::Weight(_)))
}

/// The lm_head QGemm computes the logits. `tied`: the file ties the embedding, and quantises the
/// lm_head's weight at run time as QuantizeLinear(Transpose(E)) of the table E the token Gather
/// reads (quantize_static on optimum's export); the QGemm must read those codes and the Gather E.
/// Else (Quark folds the transpose; untied models) the QGemm reads a weight of codes.
fn assert_lm_head(name: &str, g: &Graph, r: &Graph, tied: bool) {
    let lm_head = producer(r, r.outputs[0]).and_then(|dq| producer(r, dq.inputs[0].unwrap())).unwrap();
    assert_eq!(lm_head.op, "QGemm", "{name}: logits");
    // logits = DequantizeLinear(QuantizeLinear(MatMul(x, DequantizeLinear(codes)))) in the file.
    let q = producer(g, g.outputs[0]).and_then(|dq| producer(g, dq.inputs[0].unwrap())).unwrap();
    let matmul = producer(g, q.inputs[0].unwrap()).unwrap();
    let codes = producer(g, matmul.inputs[1].unwrap()).unwrap().inputs[0].unwrap();
    assert_eq!(tied_table(g, codes).is_some(), tied, "{name}: the file's lm_head");
    if tied {
        let table = tied_table(r, lm_head.inputs[3].unwrap()).expect("the tied lm_head lost its table");
        let gathered = r.nodes.iter().any(|n| n.op == "Gather" && n.inputs[0] == Some(table));
        assert!(gathered, "{name}: embedding and lm_head share E");
    } else {
        assert!(matches!(r.value(lm_head.inputs[3].unwrap()).def, ValueDef::Weight(_)), "{name}: lm_head codes");
    }
}

/// The rewritten file against ONNX Runtime: float outputs within `FLOAT_TOL`, dequantised
/// outputs within `QDQ_MAX_STEPS`; the QGemms' output codes equal the unfused product's but for
/// near-ties of the rounding, by one step.
fn assert_numerics(name: &str, r: &Graph) {
    let (rel, steps) = error_vs_ort(r, name);
    let ties = qgemm_ties(r, name);
    eprintln!(
        "{name}: {} QGemm; float outputs {rel:.3e} of max|ref|; dequantised outputs {steps:.3} steps; of {} QGemm \
         output codes, {} lie within 1e-3 step of a rounding tie, {} within 1e-5, and {} differ from the unfused order \
         (by at most {})",
        common::count(r, "QGemm"),
        ties.codes,
        ties.near,
        ties.nearest,
        ties.flipped,
        ties.worst
    );
    assert!(rel <= FLOAT_TOL, "{name}: float outputs {rel:e}");
    assert!(steps <= QDQ_MAX_STEPS + 1e-3, "{name}: dequantised outputs {steps} steps");
    assert!(
        ties.worst <= 1 && ties.flipped <= ties.nearest,
        "{name}: {} codes moved, by up to {}",
        ties.flipped,
        ties.worst
    );
}

fn check_entry(name: &str, tied: bool) {
    let g = common::import(name);
    let (r, report) = rewrite_with(&g, &[qdq()]);
    r.verify().unwrap();
    assert_every_projection_folded(name, &g, &r, &report);
    assert_lm_head(name, &g, &r, tied);
    assert_numerics(name, &r);
}

#[test]
fn llama_qdq_per_tensor_s8_with_tied_lm_head() {
    check_entry("llama-qdq-per-tensor-s8", true);
}

#[test]
fn llama_qdq_per_channel_u8_with_tied_lm_head() {
    check_entry("llama-qdq-per-channel-u8", true);
}

#[test]
fn qwen3_qdq_per_tensor_s8() {
    check_entry("qwen3-qdq-per-tensor-s8", false);
}

#[test]
fn qwen3_qdq_per_channel_u8() {
    check_entry("qwen3-qdq-per-channel-u8", false);
}

#[test]
fn qwen2_qdq_per_channel_u8_with_biased_q_k_v_and_tied_lm_head() {
    check_entry("qwen2-qdq-per-channel-u8", true);
}

#[test]
fn llama_and_qwen3_quark_a8w8_with_the_lm_head_transposed_at_export() {
    check_entry("llama-quark-a8w8", false);
    check_entry("qwen3-quark-a8w8", false);
}

#[test]
fn float_and_weight_only_files_have_nothing_to_fold() {
    let names = [
        "llama-optimum",
        "llama-torch-dynamo-opset23",
        "qwen3-builder-int4",
        "mistral-builder-int4-b128-asym",
        "smollm2-optimum",
        "smollm2-builder-int4",
    ];
    for name in names {
        let g = common::import(name);
        let (r, report) = rewrite_with(&g, &[qdq()]);
        assert_eq!(common::count(&r, "QGemm"), 0, "{name}");
        assert!(report.declined.is_empty(), "{name}: {:?}", report.declined);
        assert!(r.nodes.len() <= g.nodes.len(), "{name}");
    }
}

/// How one hand-built QDQ product is spelled.
#[derive(Clone, Copy)]
struct Spelling {
    domain: Domain,
    activation_zero_point: bool,
    weight_zero_point: bool,
    output_zero_point: bool,
    /// `axis` of the weight DequantizeLinear, and whether its scale is per column.
    weight_axis: i64,
    per_column: bool,
}

const QUANTIZE_STATIC: Spelling = Spelling {
    domain: Domain::Onnx,
    activation_zero_point: true,
    weight_zero_point: true,
    output_zero_point: true,
    weight_axis: 1,
    per_column: false,
};

const K: usize = 12;
const N: usize = 5;

/// x (f32 [rows, K]) → Q → DQ → MatMul ← DQ(w [K, N] int8 weight) → Q → DQ → y, with power-of-two
/// scales (so the fused and unfused forms agree exactly) and asymmetric zero points.
fn qdq_product(s: Spelling) -> Graph {
    let mut rng = common::Rng(0x5eed_0001);
    let mut b = common::hand_built();
    let x = b.input("x", rows(DType::F32, K));
    let sa = b.weight("sa", &Tensor::scalar_f32(0.125));
    let za = b.weight("za", &Tensor::from_i64(DType::U8, vec![], vec![131]));
    let w = b.weight("w", &Tensor::from_i64(DType::I8, vec![K, N], rng.codes(DType::I8, K * N)));
    let sw = if s.per_column {
        b.weight("sw", &Tensor::from_f32(DType::F32, vec![N], (0..N).map(|_| rng.pow2(-7, -3)).collect()))
    } else {
        b.weight("sw", &Tensor::scalar_f32(0.0625))
    };
    let zw_shape = if s.per_column { vec![N] } else { vec![] };
    let zw = b.weight(
        "zw",
        &Tensor::from_i64(
            DType::I8,
            zw_shape.clone(),
            (0..zw_shape.iter().product()).map(|_| rng.int(-5, 5)).collect(),
        ),
    );
    let sy = b.weight("sy", &Tensor::scalar_f32(4.0));
    let zy = b.weight("zy", &Tensor::from_i64(DType::U8, vec![], vec![120]));
    let d = s.domain;
    let with = |v: &[ValueId], z: Option<ValueId>| -> Vec<ValueId> { v.iter().copied().chain(z).collect() };
    let (za, zw, zy) =
        (s.activation_zero_point.then_some(za), s.weight_zero_point.then_some(zw), s.output_zero_point.then_some(zy));
    let xq = indexed_node(&mut b, d, "QuantizeLinear", rows(DType::U8, K)).inputs(&with(&[x, sa], za)).add()[0];
    let xd = indexed_node(&mut b, d, "DequantizeLinear", rows(DType::F32, K)).inputs(&with(&[xq, sa], za)).add()[0];
    let wd = indexed_node(&mut b, d, "DequantizeLinear", ValueType::known(DType::F32, &[K, N]))
        .attr("axis", Attr::Int(s.weight_axis))
        .inputs(&with(&[w, sw], zw))
        .add()[0];
    let y = indexed_node(&mut b, Domain::Onnx, "MatMul", rows(DType::F32, N)).inputs(&[xd, wd]).add()[0];
    let yq = indexed_node(&mut b, d, "QuantizeLinear", rows(DType::U8, N)).inputs(&with(&[y, sy], zy)).add()[0];
    let yd = indexed_node(&mut b, d, "DequantizeLinear", rows(DType::F32, N)).inputs(&with(&[yq, sy], zy)).add()[0];
    b.output(yd);
    b.finish().unwrap()
}

fn random_rows(seed: u64, rows: usize, width: usize) -> Tensor {
    let mut rng = common::Rng(seed);
    Tensor::from_f32(
        DType::F32,
        vec![rows, width],
        (0..rows * width).map(|_| rng.int(-4000, 4000) as f32 / 128.0).collect(),
    )
}

/// Rewrites `g`, and runs both on a few random inputs: the outputs must be identical.
fn rewrite_and_compare(g: &Graph) -> (Graph, SaturationReport) {
    let (r, report) = rewrite_with(g, &[qdq()]);
    r.verify().unwrap();
    assert!(report.type_conflicts.is_empty(), "{:?}", report.type_conflicts);
    for seed in 1..4 {
        let inputs: HashMap<String, Tensor> = [("x".to_string(), random_rows(seed, 7, K))].into();
        let (want, got) = (ir::run::run_graph(g, &inputs).unwrap(), ir::run::run_graph(&r, &inputs).unwrap());
        for (name, t) in &want {
            assert_eq!(t, &got[name], "output {name} differs after rewriting");
        }
    }
    (r, report)
}

fn assert_one_requantising_qgemm(r: &Graph) {
    assert_eq!(common::count(r, "QGemm"), 1);
    assert_eq!(common::count(r, "MatMul"), 0);
    let q = r.nodes.iter().find(|n| n.op == "QGemm").unwrap();
    assert_eq!(q.inputs.len(), 8, "the output QuantizeLinear is the epilogue");
}

#[test]
fn quantize_static_per_tensor_folds() {
    let (r, report) = rewrite_and_compare(&qdq_product(QUANTIZE_STATIC));
    assert_one_requantising_qgemm(&r);
    assert!(report.declined.is_empty());
}

#[test]
fn per_column_weights_on_axis_one_and_minus_one_fold() {
    for axis in [1, -1] {
        let (r, _) =
            rewrite_and_compare(&qdq_product(Spelling { weight_axis: axis, per_column: true, ..QUANTIZE_STATIC }));
        assert_one_requantising_qgemm(&r);
    }
}

#[test]
fn contrib_domain_qdq_folds() {
    let s = Spelling { domain: Domain::Microsoft, per_column: true, ..QUANTIZE_STATIC };
    let (r, _) = rewrite_and_compare(&qdq_product(s));
    assert_one_requantising_qgemm(&r);
    assert!(r.nodes.iter().all(|n| n.op != "DequantizeLinear" || n.domain == Domain::Microsoft));
}

#[test]
fn omitted_zero_points_become_explicit_zeros() {
    let symmetric_weight = Spelling { weight_zero_point: false, per_column: true, ..QUANTIZE_STATIC };
    let symmetric = Spelling {
        activation_zero_point: false,
        weight_zero_point: false,
        output_zero_point: false,
        ..QUANTIZE_STATIC
    };
    for s in [symmetric_weight, symmetric] {
        let (r, report) = rewrite_and_compare(&qdq_product(s));
        assert_one_requantising_qgemm(&r);
        assert!(report.declined.is_empty(), "{:?}", report.declined);
        let q = r.nodes.iter().find(|n| n.op == "QGemm").unwrap();
        let zw = value_tensor(&r, q.inputs[5].unwrap()).unwrap();
        assert_eq!(zw.dtype, DType::I8);
        assert!(zw.as_i64().unwrap().iter().all(|&z| z == 0));
    }
}

/// The reasons recorded for `g`'s products, after checking nothing folded.
fn declined_reasons(g: &Graph) -> Vec<String> {
    let (r, report) = rewrite_with(g, &[qdq()]);
    assert_eq!(common::count(&r, "QGemm"), 0);
    assert_eq!(common::count(&r, "MatMul"), 1);
    report.declined.into_iter().map(|d| d.reason).collect()
}

/// x → Q → DQ → MatMul ← DQ(w) for a weight DequantizeLinear with the given scale and attributes.
fn product_with_weight_dq(codes: DType, scale: Tensor, zero: Tensor, attrs: &[(&str, Attr)]) -> Graph {
    let mut rng = common::Rng(7);
    let mut b = common::hand_built();
    let x = b.input("x", rows(DType::F32, K));
    let sa = b.weight("sa", &Tensor::scalar_f32(0.125));
    let za = b.weight("za", &Tensor::from_i64(DType::U8, vec![], vec![128]));
    let w = b.weight("w", &Tensor::from_i64(codes, vec![K, N], rng.codes(codes, K * N)));
    let (sw, zw) = (b.weight("sw", &scale), b.weight("zw", &zero));
    let xq = indexed_node(&mut b, Domain::Onnx, "QuantizeLinear", rows(DType::U8, K)).inputs(&[x, sa, za]).add()[0];
    let xd = indexed_node(&mut b, Domain::Onnx, "DequantizeLinear", rows(DType::F32, K)).inputs(&[xq, sa, za]).add()[0];
    let wd = indexed_node(&mut b, Domain::Onnx, "DequantizeLinear", ValueType::known(DType::F32, &[K, N]))
        .attrs(attrs)
        .inputs(&[w, sw, zw])
        .add()[0];
    let y = indexed_node(&mut b, Domain::Onnx, "MatMul", rows(DType::F32, N)).inputs(&[xd, wd]).add()[0];
    b.output(y);
    b.finish().unwrap()
}

#[test]
fn a_weight_scale_along_k_is_declined() {
    let scale = Tensor::from_f32(DType::F32, vec![K], vec![0.01; K]);
    let zero = Tensor::from_i64(DType::I8, vec![K], vec![0; K]);
    let reasons = declined_reasons(&product_with_weight_dq(DType::I8, scale, zero, &[("axis", Attr::Int(0))]));
    assert_eq!(reasons.len(), 1, "{reasons:?}");
    assert!(reasons[0].contains("along K"), "{reasons:?}");
}

#[test]
fn blocked_quantisation_along_k_is_declined() {
    let scale = Tensor::from_f32(DType::F32, vec![K / 4, N], vec![0.01; K / 4 * N]);
    let zero = Tensor::from_i64(DType::I8, vec![K / 4, N], vec![0; K / 4 * N]);
    let attrs = [("axis", Attr::Int(0)), ("block_size", Attr::Int(4))];
    let reasons = declined_reasons(&product_with_weight_dq(DType::I8, scale, zero, &attrs));
    assert_eq!(reasons.len(), 1, "{reasons:?}");
    assert!(reasons[0].contains("blocked") && reasons[0].contains("along K"), "{reasons:?}");
}

#[test]
fn sixteen_bit_weight_codes_are_declined() {
    let reasons = declined_reasons(&product_with_weight_dq(
        DType::I16,
        Tensor::scalar_f32(0.01),
        Tensor::from_i64(DType::I16, vec![], vec![0]),
        &[],
    ));
    assert!(reasons.len() == 1 && reasons[0].contains("8-bit"), "{reasons:?}");
}

/// A weight DequantizeLinear whose codes are computed at run time (what attention's QKᵀ and AV
/// look like): the product must stay a MatMul and the reason must say why.
#[test]
fn a_weight_dequantize_of_run_time_codes_is_declined() {
    let mut b = common::hand_built();
    let x = b.input("x", rows(DType::F32, K));
    let sa = b.weight("sa", &Tensor::scalar_f32(0.125));
    let za = b.weight("za", &Tensor::from_i64(DType::U8, vec![], vec![128]));
    let sw = b.weight("sw", &Tensor::scalar_f32(0.5));
    let zw = b.weight("zw", &Tensor::from_i64(DType::I8, vec![], vec![0]));
    let codes = b.input("w_codes", ValueType::known(DType::I8, &[K, N]));
    let xq = indexed_node(&mut b, Domain::Onnx, "QuantizeLinear", rows(DType::U8, K)).inputs(&[x, sa, za]).add()[0];
    let xd = indexed_node(&mut b, Domain::Onnx, "DequantizeLinear", rows(DType::F32, K)).inputs(&[xq, sa, za]).add()[0];
    let wd = indexed_node(&mut b, Domain::Onnx, "DequantizeLinear", ValueType::known(DType::F32, &[K, N]))
        .inputs(&[codes, sw, zw])
        .add()[0];
    let y = indexed_node(&mut b, Domain::Onnx, "MatMul", rows(DType::F32, N)).inputs(&[xd, wd]).add()[0];
    b.output(y);
    let reasons = declined_reasons(&b.finish().unwrap());
    assert_eq!(reasons.len(), 1, "{reasons:?}");
    assert!(reasons[0].contains("computed at run time"), "{reasons:?}");
}

#[test]
fn a_per_channel_output_scale_keeps_the_quantize_linear() {
    let mut g = qdq_product(QUANTIZE_STATIC);
    // Give the output QuantizeLinear (and its DequantizeLinear) a per-column scale and zero point.
    let sy = Tensor::from_f32(DType::F32, vec![N], vec![4.0; N]);
    let zy = Tensor::from_i64(DType::U8, vec![N], vec![120; N]);
    let mut store = WeightStore::default();
    for (_, w) in g.weights.iter() {
        let (t, name) = match w.name.as_str() {
            "sy" => (sy.clone(), "sy"),
            "zy" => (zy.clone(), "zy"),
            other => (w.to_tensor().unwrap(), other),
        };
        store.add(Weight::new(name.into(), t.dtype, t.shape.clone(), t.to_le_bytes().unwrap().into()));
    }
    g.weights = Arc::new(store);
    for v in g.values.iter_mut().filter(|v| v.name == "sy" || v.name == "zy") {
        v.shape = vec![Dim::known(N as i64)];
    }
    for n in g.nodes.iter_mut().skip(4) {
        n.attrs.set("axis", Attr::Int(-1));
    }
    let (r, report) = rewrite_and_compare(&g);
    assert_eq!(common::count(&r, "QGemm"), 1);
    assert_eq!(r.nodes.iter().find(|n| n.op == "QGemm").unwrap().inputs.len(), 6);
    assert_eq!(common::count(&r, "QuantizeLinear"), 2);
    assert!(
        report.declined.iter().any(|d| d.rule == "qdq-requantize" && d.reason.contains("per tensor")),
        "{:?}",
        report.declined
    );
}

fn qgemm(args: &[&Tensor]) -> Tensor {
    eval1(Domain::Npuc, "QGemm", &Attrs::default(), args)
}

/// The exact reference: integer accumulation Σ(a − zₐ)(w − z_w[n]) in i32 (checked).
fn int32_accumulators(a: &[i64], za: i64, w: &[i64], zw: &[i64], m: usize, k: usize, n: usize) -> Vec<i32> {
    let mut acc = vec![0i32; m * n];
    for r in 0..m {
        for c in 0..n {
            let z = zw[if zw.len() == 1 { 0 } else { c }];
            for kk in 0..k {
                let p = i32::try_from((a[r * k + kk] - za) * (w[kk * n + c] - z)).unwrap();
                acc[r * n + c] = acc[r * n + c].checked_add(p).unwrap();
            }
        }
    }
    acc
}

/// Round-half-to-even of `x / 2^shift` in integers.
fn shift_round_half_even(x: i64, shift: u32) -> i64 {
    let d = 1i64 << shift;
    let (q, r) = (x.div_euclid(d), x.rem_euclid(d));
    match (2 * r).cmp(&d) {
        std::cmp::Ordering::Less => q,
        std::cmp::Ordering::Greater => q + 1,
        std::cmp::Ordering::Equal => q + (q & 1),
    }
}

/// Random small QGemms — uint8/int8 activations and weights, per-tensor and per-column weight
/// scales, asymmetric zero points — against the i32 reference: the float output is exactly
/// acc·(sₐ·s_w) in f32, within 2 ulp of the exact product, and the requantised output is the
/// f32 QuantizeLinear of it.
#[test]
fn qgemm_equals_the_int32_reference_on_random_inputs() {
    let mut rng = common::Rng(0x9e37_79b9_7f4a_7c15);
    for case in 0..300 {
        let (m, k, n) = (rng.int(1, 4) as usize, rng.int(1, 40) as usize, rng.int(1, 6) as usize);
        let a_type = if rng.below(2) == 0 { DType::U8 } else { DType::I8 };
        let w_type = if rng.below(2) == 0 { DType::U8 } else { DType::I8 };
        let per_column = rng.below(2) == 0;
        let cols = if per_column { n } else { 1 };
        let a = rng.codes(a_type, m * k);
        let w = rng.codes(w_type, k * n);
        let za = rng.codes(a_type, 1);
        let zw = rng.codes(w_type, cols);
        let sa = 0.001 + rng.below(1000) as f32 * 1e-4;
        let sw: Vec<f32> = (0..cols).map(|_| 0.0005 + rng.below(1000) as f32 * 1e-5).collect();
        let scale_shape = if per_column { vec![n] } else { vec![] };
        let at = Tensor::from_i64(a_type, vec![m, k], a.clone());
        let wt = Tensor::from_i64(w_type, vec![k, n], w.clone());
        let sat = Tensor::scalar_f32(sa);
        let zat = Tensor::from_i64(a_type, vec![], za.clone());
        let swt = Tensor::from_f32(DType::F32, scale_shape.clone(), sw.clone());
        let zwt = Tensor::from_i64(w_type, scale_shape, zw.clone());
        let acc = int32_accumulators(&a, za[0], &w, &zw, m, k, n);
        let y = qgemm(&[&at, &sat, &zat, &wt, &swt, &zwt]);
        let yv = y.as_f32().unwrap();
        for (i, &got) in yv.iter().enumerate() {
            let s = sw[if per_column { i % n } else { 0 }];
            assert_eq!(got, acc[i] as f32 * (sa * s), "case {case}: element {i}");
            let exact = acc[i] as f64 * sa as f64 * s as f64;
            assert!(
                (got as f64 - exact).abs() <= 2.0 * f32::EPSILON as f64 * exact.abs(),
                "case {case}: {got} vs {exact}"
            );
        }
        let sy = Tensor::scalar_f32(0.01 + rng.below(100) as f32 * 1e-3);
        let zy = Tensor::from_i64(DType::I8, vec![], vec![rng.int(-20, 20)]);
        let q = qgemm(&[&at, &sat, &zat, &wt, &swt, &zwt, &sy, &zy]);
        let syv = sy.as_f32().unwrap()[0];
        let want: Vec<i64> = yv
            .iter()
            .map(|&v| ((v / syv).round_ties_even() as i64 + zy.as_i64().unwrap()[0]).clamp(-128, 127))
            .collect();
        assert_eq!(q.as_i64().unwrap(), &want[..], "case {case}: requantised");
    }
}

/// With power-of-two scales every step is exact, so the requantised QGemm must equal the integer
/// reference sat(round_half_even(acc / 2^s) + z_y) exactly, at the ties (acc/2^s exactly halfway)
/// included, and equal the unfused DequantizeLinear → MatMul → QuantizeLinear.
#[test]
fn requantisation_rounds_exact_ties_half_to_even() {
    let mut rng = common::Rng(0x2545_f491_4f6c_dd1d);
    let mut ties = 0;
    for case in 0..300 {
        let (m, k, n) = (rng.int(1, 3) as usize, rng.int(1, 16) as usize, rng.int(1, 5) as usize);
        let a_type = if rng.below(2) == 0 { DType::U8 } else { DType::I8 };
        let w_type = if rng.below(2) == 0 { DType::U8 } else { DType::I8 };
        let a = rng.codes(a_type, m * k);
        let w = rng.codes(w_type, k * n);
        let za = rng.codes(a_type, 1);
        let zw = rng.codes(w_type, n);
        // sₐ·s_w[n] / s_y = 2^-shift[n] for each column.
        let sa_exp = rng.int(-6, -2) as i32;
        let shifts: Vec<u32> = (0..n).map(|_| rng.int(1, 6) as u32).collect();
        let sy_exp = rng.int(-3, 2) as i32;
        let sw: Vec<f32> = shifts.iter().map(|&s| 2f32.powi(sy_exp - sa_exp - s as i32)).collect();
        let zy = rng.int(-10, 10);
        let args = [
            Tensor::from_i64(a_type, vec![m, k], a.clone()),
            Tensor::scalar_f32(2f32.powi(sa_exp)),
            Tensor::from_i64(a_type, vec![], za.clone()),
            Tensor::from_i64(w_type, vec![k, n], w.clone()),
            Tensor::from_f32(DType::F32, vec![n], sw),
            Tensor::from_i64(w_type, vec![n], zw.clone()),
            Tensor::scalar_f32(2f32.powi(sy_exp)),
            Tensor::from_i64(DType::I8, vec![], vec![zy]),
        ];
        let refs: Vec<&Tensor> = args.iter().collect();
        let q = qgemm(&refs);
        let acc = int32_accumulators(&a, za[0], &w, &zw, m, k, n);
        let want: Vec<i64> = acc
            .iter()
            .enumerate()
            .map(|(i, &x)| {
                let s = shifts[i % n];
                if (x as i64).rem_euclid(1 << s) * 2 == 1 << s {
                    ties += 1;
                }
                (shift_round_half_even(x as i64, s) + zy).clamp(-128, 127)
            })
            .collect();
        assert_eq!(q.as_i64().unwrap(), &want[..], "case {case}");
        assert_eq!(q, unfused_qgemm(&refs), "case {case}: fused and unfused differ");
    }
    assert!(ties > 50, "only {ties} exact ties exercised");
}

//! Family `weight-only`: every MatMulNBits of the genai forms becomes a WGemm (packed products
//! stay packed under the host cost model, and split into per-projection WGemms over weight views
//! under one that prefers narrow GEMMs); the embedding keeps sharing the lm_head's packed weight;
//! blocked DequantizeLinear → MatMul folds into a WGemm over lazily repacked codes; refusals are
//! recorded with their reasons.

mod common;

use common::{indexed_node, rows};
use egg::{CostFunction, Id};
use ir::build::ValueType;
use ir::egraph::{EGraph, ENode, Head};
use ir::{Attr, DType, Domain, Graph, Node, Tensor, ValueDef, ValueId, WeightId};
use rewrites::saturate::{extract_graph, rewrite_with, saturate, Limits, Phase, SaturationReport};
use std::collections::{HashMap, HashSet};

fn weight_only() -> rewrites::Family {
    rewrites::family("weight-only").unwrap()
}

/// How onnxruntime-genai packed a weight-only form's projections.
fn packing(fixture: &str) -> common::Quant {
    common::meta(fixture).quant.unwrap_or_else(|| panic!("{fixture}: meta.json says nothing of weight-only packing"))
}

/// The node defining `v`, if a node does.
fn producer(g: &Graph, v: ValueId) -> Option<&Node> {
    match g.value(v).def {
        ValueDef::Node { node, .. } => Some(g.node(node)),
        _ => None,
    }
}

fn weight_id(g: &Graph, v: Option<ValueId>) -> Option<WeightId> {
    match g.value(v?).def {
        ValueDef::Weight(w) => Some(w),
        _ => None,
    }
}

/// Projections (7 per layer and the lm_head) and the GEMMs they are packed into by genai.
fn accounting(fixture: &str) -> (usize, usize) {
    let (layers, packing) = (common::meta(fixture).layers, packing(fixture));
    let packed_away = 2 * usize::from(packing.packed_qkv) + usize::from(packing.packed_gate_up);
    (7 * layers + 1, (7 - packed_away) * layers + 1)
}

/// The embedding GatherBlockQuantized reads (through a Reshape) the very codes, scales and zero
/// points the lm_head WGemm reads: same WeightIds.
fn assert_embedding_shares_the_lm_head(r: &Graph, fixture: &str) {
    let lm_head = producer(r, r.outputs[0]).unwrap();
    assert_eq!(lm_head.op, "WGemm", "{fixture}: logits");
    let gather = r
        .nodes
        .iter()
        .find(|n| n.op == "GatherBlockQuantized")
        .unwrap_or_else(|| panic!("{fixture}: no quantised gather"));
    let reshape = producer(r, gather.inputs[0].unwrap()).unwrap();
    assert_eq!(reshape.op, "Reshape");
    let codes = weight_id(r, reshape.inputs[0]);
    assert!(codes.is_some(), "{fixture}: the gathered table is not a weight");
    assert_eq!(codes, weight_id(r, lm_head.inputs[1]), "{fixture}: codes");
    assert_eq!(weight_id(r, gather.inputs[2]), weight_id(r, lm_head.inputs[2]), "{fixture}: scales");
    assert!(weight_id(r, gather.inputs[2]).is_some());
    assert_eq!(gather.inputs.get(3).copied().flatten().is_some(), lm_head.inputs.len() > 3, "{fixture}: zero points");
    if lm_head.inputs.len() > 3 {
        assert_eq!(weight_id(r, gather.inputs[3]), weight_id(r, lm_head.inputs[3]), "{fixture}: zero points");
    }
}

/// The projections one WGemm computes: three for genai's packed `qkv_proj` weight, two for its
/// packed `gate_up_proj`, one for any other weight or a Slice view of one.
fn projections_of(r: &Graph, wgemm: &Node) -> usize {
    match weight_id(r, wgemm.inputs[1]).map(|w| r.weights.get(w).name.as_str()) {
        Some(name) if name.contains("qkv_proj") => 3,
        Some(name) if name.contains("gate_up_proj") => 2,
        _ => 1,
    }
}

/// f2 accounting under the host cost model: no MatMulNBits is left, every projection is computed
/// by exactly one WGemm (`host_wgemms` of them: what the host cost model picks), every WGemm reads
/// weights or Slice views of them, and the program matches ONNX Runtime within 1e-4.
fn check_f2(fixture: &str, host_wgemms: usize) -> Graph {
    let (projections, packed) = accounting(fixture);
    let g = common::import(fixture);
    assert_eq!(common::count(&g, "MatMulNBits"), packed, "{fixture}: the fixture's packing");
    let (r, report) = rewrite_with(&g, &[weight_only()]);
    r.verify().unwrap();
    assert!(report.type_conflicts.is_empty(), "{fixture}: {:?}", report.type_conflicts);
    assert!(report.declined.is_empty(), "{fixture}: {:?}", report.declined);
    assert_eq!(common::count(&r, "MatMulNBits"), 0, "{fixture}: MatMulNBits left");
    let wgemms: Vec<&Node> = r.nodes.iter().filter(|n| n.op == "WGemm").collect();
    assert_eq!(wgemms.len(), host_wgemms, "{fixture}: WGemms");
    assert_eq!(
        wgemms.iter().map(|n| projections_of(&r, n)).sum::<usize>(),
        projections,
        "{fixture}: projections covered"
    );
    assert_views_not_copies(&r, fixture);
    assert_embedding_shares_the_lm_head(&r, fixture);
    let err = common::worst_relative_error(&r, fixture);
    eprintln!(
        "{fixture}: {projections} projections, {packed} MatMulNBits → {} WGemms, {} Split, {} Concat, {} weight Slices (host cost model); worst relative error {err:.3e}",
        wgemms.len(),
        common::count(&r, "Split"),
        common::count(&r, "Concat"),
        common::count(&r, "Slice")
    );
    assert!(err <= 1e-4, "{fixture}: {err:e}");
    r
}

/// Every Slice reads a weight, and every WGemm operand after the activation is a weight or a
/// Slice of one: split weights are views, never copies.
fn assert_views_not_copies(r: &Graph, fixture: &str) {
    for n in r.nodes.iter().filter(|n| n.op == "Slice") {
        assert!(weight_id(r, n.inputs[0]).is_some(), "{fixture}: Slice {} of a non-weight", n.name);
    }
    for n in r.nodes.iter().filter(|n| n.op == "WGemm") {
        for &v in &n.inputs[1..] {
            let direct = weight_id(r, v).is_some();
            let view = v.and_then(|v| producer(r, v)).is_some_and(|p| p.op == "Slice");
            assert!(direct || view, "{fixture}: WGemm {} reads a computed weight", n.name);
        }
    }
}

/// llama f2: 2 layers × (qkv, o, gate, up, down) + lm_head = 11 WGemms for 15 projections; the
/// packed q|k|v stays packed.
#[test]
fn llama_f2_packed_qkv() {
    check_f2("llama_f2", 11);
}

/// qwen3 f2: 2 layers × (q, k, v, o, gate, up, down) + lm_head = 15 WGemms for 15 projections:
/// the host cost model replaces Split(gate|up) by two WGemms over weight Slices.
#[test]
fn qwen3_f2_packed_gate_up() {
    check_f2("qwen3_f2", 15);
}

/// SmolLM2-135M: 30 layers × (packed qkv, o, gate, up, down) + the 8-bit lm_head = 151 WGemms for
/// 30 × 7 + 1 = 211 projections.
#[test]
fn smollm2_f2_real_weights() {
    assert_eq!(accounting("smollm2_f2"), (211, 151));
    let r = check_f2("smollm2_f2", 151);
    let bits: Vec<i64> =
        r.nodes.iter().filter(|n| n.op == "WGemm").map(|n| n.attrs.int("bits").unwrap().unwrap()).collect();
    assert_eq!((bits.iter().filter(|&&b| b == 4).count(), bits.iter().filter(|&&b| b == 8).count()), (150, 1));
}

#[test]
fn other_forms_have_nothing_to_fold() {
    for fixture in ["llama_f1", "qwen3_f3a", "llama_f3b", "qwen3_f4", "smollm2_f1"] {
        let g = common::import(fixture);
        let (r, report) = rewrite_with(&g, &[weight_only()]);
        assert_eq!(common::count(&r, "WGemm"), 0, "{fixture}");
        assert!(report.declined.is_empty(), "{fixture}: {:?}", report.declined);
    }
}

/// A cost model for a target that prefers narrow GEMMs: a WGemm costs N² (a MatMulNBits one more),
/// a Slice of a weight (a view) nothing, other ops as on the host, summed along the costliest path
/// (as `HostCost` compares first).
struct NarrowGemms;

impl CostFunction<ENode> for NarrowGemms {
    type Cost = f64;

    fn cost<C: FnMut(Id) -> f64>(&mut self, enode: &ENode, mut costs: C) -> f64 {
        let own = match &enode.head {
            Head::Op { op: "WGemm", attrs, .. } => (attrs.attrs.int("N").unwrap().unwrap() as f64).powi(2),
            Head::Op { op: "MatMulNBits", attrs, .. } => (attrs.attrs.int("N").unwrap().unwrap() as f64).powi(2) + 1.0,
            Head::Op { op: "Slice", .. } => 0.0,
            Head::Op { domain: Domain::Npuc, .. } => 1.0,
            Head::Op { .. } => 2.0,
            _ => 0.0,
        };
        own + enode.children.iter().fold(0.0f64, |acc, &c| acc.max(costs(c)))
    }
}

fn rewrite_and_extract<CF: CostFunction<ENode>>(
    g: &Graph,
    cost: impl FnOnce(&EGraph) -> CF,
) -> (Graph, SaturationReport) {
    let phase =
        Phase { name: "test".into(), families: vec![weight_only()], extra_rules: vec![], limits: Limits::default() };
    let sat = saturate(g, &[phase], false);
    let cf = cost(&sat.egraph);
    (extract_graph(g, &sat, cf), sat.report)
}

/// The per-projection alternative is in the e-graph and correct: under a narrow-GEMM cost model
/// every projection is its own WGemm over Slice views of the packed weights.
#[test]
fn packed_products_split_per_projection_under_a_narrow_gemm_cost_model() {
    for fixture in ["llama_f2", "qwen3_f2"] {
        let (projections, _) = accounting(fixture);
        let layers = common::meta(fixture).layers;
        let g = common::import(fixture);
        let (r, report) = rewrite_and_extract(&g, |_| NarrowGemms);
        r.verify().unwrap();
        assert!(report.type_conflicts.is_empty(), "{fixture}: {:?}", report.type_conflicts);
        assert_eq!(common::count(&r, "WGemm"), projections, "{fixture}: one WGemm per projection");
        assert_eq!(common::count(&r, "MatMulNBits") + common::count(&r, "Split"), 0, "{fixture}");
        assert_eq!(common::count(&r, "Concat"), layers * usize::from(packing(fixture).packed_qkv), "{fixture}: q|k|v");
        assert!(common::count(&r, "Slice") > 0);
        assert_views_not_copies(&r, fixture);
        assert_embedding_shares_the_lm_head(&r, fixture);
        let err = common::worst_relative_error(&r, fixture);
        eprintln!("{fixture}: {projections} per-projection WGemms; worst relative error {err:.3e}");
        assert!(err <= 1e-4, "{fixture}: {err:e}");
    }
}

/// Host costs, except that an op computing from compile-time data only costs nothing: a folding
/// pass computes it once, before the program runs.
struct FoldedConstants {
    folded: HashSet<Id>,
}

impl FoldedConstants {
    fn new(egraph: &EGraph) -> FoldedConstants {
        let mut folded = HashSet::new();
        loop {
            let before = folded.len();
            for class in egraph.classes() {
                if !folded.contains(&class.id)
                    && class.nodes.iter().any(|n| match n.head {
                        Head::Weight(_) | Head::Const(_) | Head::Absent => true,
                        Head::Op { .. } => n.children.iter().all(|c| folded.contains(&egraph.find(*c))),
                        _ => false,
                    })
                {
                    folded.insert(class.id);
                }
            }
            if folded.len() == before {
                return FoldedConstants { folded };
            }
        }
    }
}

impl CostFunction<ENode> for FoldedConstants {
    type Cost = f64;

    fn cost<C: FnMut(Id) -> f64>(&mut self, enode: &ENode, mut costs: C) -> f64 {
        let own = match &enode.head {
            Head::Op { .. } if enode.children.iter().all(|c| self.folded.contains(c)) => 0.0,
            Head::Op { domain: Domain::Npuc, .. } => 1.0,
            Head::Op { .. } => 2.0,
            _ => 0.0,
        };
        enode.children.iter().fold(own, |acc, &c| acc + costs(c))
    }
}

/// x [rows, K] → MatMul ← DequantizeLinear(codes [K, N], scales, zero points) with the given
/// attributes; scales and zero points have `grid` shape.
fn dequantized_product(
    codes: DType,
    k: usize,
    n: usize,
    grid: [usize; 2],
    zero_points: bool,
    attrs: &[(&str, Attr)],
) -> Graph {
    dequantized_product_after(0, codes, k, n, grid, zero_points, attrs)
}

/// The same, with the activation first negated `depth` times (as deep inside a model, where the
/// activation's path is long).
fn dequantized_product_after(
    depth: usize,
    codes: DType,
    k: usize,
    n: usize,
    grid: [usize; 2],
    zero_points: bool,
    attrs: &[(&str, Attr)],
) -> Graph {
    let mut rng = common::Rng(0x5eed_0002 + k as u64);
    let mut b = common::hand_built();
    let mut x = b.input("x", rows(DType::F32, k));
    for _ in 0..depth {
        x = indexed_node(&mut b, Domain::Onnx, "Neg", rows(DType::F32, k)).inputs(&[x]).add()[0];
    }
    let w = b.weight("w", &Tensor::from_i64(codes, vec![k, n], rng.codes(codes, k * n)));
    let s = b.weight("s", &Tensor::from_f32(DType::F32, grid.to_vec(), rng.floats(grid[0] * grid[1], 0.01, 0.05)));
    let z = zero_points
        .then(|| b.weight("z", &Tensor::from_i64(codes, grid.to_vec(), rng.codes(codes, grid[0] * grid[1]))));
    let inputs: Vec<Option<ValueId>> = [Some(w), Some(s)].into_iter().chain(z.map(Some)).collect();
    let wd = indexed_node(&mut b, Domain::Onnx, "DequantizeLinear", ValueType::known(DType::F32, &[k, n]))
        .attrs(attrs)
        .optional_inputs(&inputs)
        .add()[0];
    let y = indexed_node(&mut b, Domain::Onnx, "MatMul", rows(DType::F32, n)).inputs(&[x, wd]).add()[0];
    b.output(y);
    b.finish().unwrap()
}

fn blocked(block: usize) -> [(&'static str, Attr); 2] {
    [("axis", Attr::Int(0)), ("block_size", Attr::Int(block as i64))]
}

/// Runs `g` and `r` on random rows and returns max|Δ| / max|ref|.
fn relative_difference(g: &Graph, r: &Graph, k: usize) -> f64 {
    let mut rng = common::Rng(99);
    let x = Tensor::from_f32(DType::F32, vec![3, k], rng.floats(3 * k, -2.0, 2.0));
    let inputs: HashMap<String, Tensor> = [("x".to_string(), x)].into();
    let (want, got) = (ir::run::run_graph(g, &inputs).unwrap(), ir::run::run_graph(r, &inputs).unwrap());
    let mut worst = 0.0f64;
    for (name, t) in &want {
        let (a, b) = (t.to_f64_vec(), got[name].to_f64_vec());
        let m = a.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        let d = a.iter().zip(&b).fold(0.0f64, |d, (x, y)| d.max((x - y).abs()));
        worst = worst.max(d / m);
    }
    worst
}

#[test]
fn blocked_dequantize_linear_folds_into_a_wgemm_over_repacked_codes() {
    let (k, n) = (64, 6);
    for (codes, block, zero_points) in [
        (DType::I4, 16, true),
        (DType::I4, 32, false),
        (DType::U4, 16, true),
        (DType::U4, 32, false),
        (DType::I8, 16, true),
        (DType::U8, 32, false),
    ] {
        let what = format!("{codes} codes, block {block}, zero points {zero_points}");
        let g = dequantized_product(codes, k, n, [k / block, n], zero_points, &blocked(block));
        let (r, report) = rewrite_and_extract(&g, FoldedConstants::new);
        r.verify().unwrap();
        assert!(report.type_conflicts.is_empty(), "{what}: {:?}", report.type_conflicts);
        assert!(report.declined.is_empty(), "{what}: {:?}", report.declined);
        assert_eq!(common::count(&r, "WGemm"), 1, "{what}");
        assert_eq!(
            common::count(&r, "MatMul") + common::count(&r, "DequantizeLinear"),
            0,
            "{what}: weights expanded to float"
        );
        let wgemm = r.nodes.iter().find(|n| n.op == "WGemm").unwrap();
        let bits = if matches!(codes, DType::I4 | DType::U4) { 4 } else { 8 };
        assert_eq!(wgemm.attrs.int("bits").unwrap(), Some(bits), "{what}");
        assert_eq!(wgemm.attrs.int("block_size").unwrap(), Some(block as i64), "{what}");
        let diff = relative_difference(&g, &r, k);
        assert!(diff <= 1e-6, "{what}: {diff:e}");
        // The host cost model compares critical paths first. The repacking hangs off the weights,
        // beside the activation's path: once that path is longer (as anywhere inside a model), the
        // WGemm wins; when the repacking is the longest path (the activation is a graph input),
        // the original stays.
        let (host, _) = rewrite_with(&g, &[weight_only()]);
        assert_eq!((common::count(&host, "WGemm"), common::count(&host, "MatMul")), (0, 1), "{what}: host, shallow");
        let deep = dequantized_product_after(16, codes, k, n, [k / block, n], zero_points, &blocked(block));
        let (host, _) = rewrite_with(&deep, &[weight_only()]);
        assert_eq!((common::count(&host, "WGemm"), common::count(&host, "MatMul")), (1, 0), "{what}: host, deep");
        assert!(relative_difference(&deep, &host, k) <= 1e-6, "{what}");
    }
}

/// The reasons recorded for `g`'s products, after checking nothing folded.
fn declined_reasons(g: &Graph) -> Vec<String> {
    let (r, report) = rewrite_and_extract(g, FoldedConstants::new);
    assert_eq!(common::count(&r, "WGemm"), 0);
    report.declined.into_iter().map(|d| d.reason).collect()
}

#[test]
fn blocks_along_n_are_declined() {
    let g =
        dequantized_product(DType::I4, 32, 16, [32, 2], true, &[("axis", Attr::Int(1)), ("block_size", Attr::Int(8))]);
    let reasons = declined_reasons(&g);
    assert!(reasons.len() == 1 && reasons[0].contains("along N"), "{reasons:?}");
}

#[test]
fn a_partial_last_block_is_declined() {
    let g = dequantized_product(DType::U4, 40, 4, [3, 4], true, &blocked(16));
    let reasons = declined_reasons(&g);
    assert!(reasons.len() == 1 && reasons[0].contains("whole number"), "{reasons:?}");
}

#[test]
fn per_column_four_bit_codes_are_declined() {
    let (k, n) = (32, 4);
    let mut b = common::hand_built();
    let x = b.input("x", rows(DType::F32, k));
    let w = b.weight("w", &Tensor::from_i64(DType::I4, vec![k, n], common::Rng(1).codes(DType::I4, k * n)));
    let s = b.weight("s", &Tensor::from_f32(DType::F32, vec![n], vec![0.02; n]));
    let wd = indexed_node(&mut b, Domain::Onnx, "DequantizeLinear", ValueType::known(DType::F32, &[k, n]))
        .attr("axis", Attr::Int(1))
        .inputs(&[w, s])
        .add()[0];
    let y = indexed_node(&mut b, Domain::Onnx, "MatMul", rows(DType::F32, n)).inputs(&[x, wd]).add()[0];
    b.output(y);
    let reasons = declined_reasons(&b.finish().unwrap());
    assert!(reasons.len() == 1 && reasons[0].contains("per tensor or per column"), "{reasons:?}");
}

#[test]
fn blocked_codes_computed_at_run_time_are_declined() {
    let (k, n, block) = (32, 4, 16);
    let mut b = common::hand_built();
    let x = b.input("x", rows(DType::F32, k));
    let w = b.input("w", ValueType::known(DType::I4, &[k, n]));
    let s = b.weight("s", &Tensor::from_f32(DType::F32, vec![k / block, n], vec![0.02; k / block * n]));
    let wd = indexed_node(&mut b, Domain::Onnx, "DequantizeLinear", ValueType::known(DType::F32, &[k, n]))
        .attrs(&blocked(block))
        .inputs(&[w, s])
        .add()[0];
    let y = indexed_node(&mut b, Domain::Onnx, "MatMul", rows(DType::F32, n)).inputs(&[x, wd]).add()[0];
    b.output(y);
    let reasons = declined_reasons(&b.finish().unwrap());
    assert!(reasons.len() == 1 && reasons[0].contains("run time"), "{reasons:?}");
}

/// MatMulNBits(a [rows, 32], 4-bit B [4, 1, 16], scales [4]) with the given extra inputs.
fn matmul_nbits(extra: &[(usize, Tensor)]) -> Graph {
    let (k, n) = (32, 4);
    let mut rng = common::Rng(5);
    let mut b = common::hand_built();
    let a = b.input("a", rows(DType::F32, k));
    let codes = b.weight("B", &Tensor::from_i64(DType::U8, vec![n, 1, 16], rng.codes(DType::U8, n * 16)));
    let scales = b.weight("scales", &Tensor::from_f32(DType::F32, vec![n], vec![0.1; n]));
    let mut inputs = vec![Some(a), Some(codes), Some(scales)];
    for (i, t) in extra {
        inputs.resize(i + 1, None);
        inputs[*i] = Some(b.weight(&format!("input{i}"), t));
    }
    let attrs =
        [("K", Attr::Int(k as i64)), ("N", Attr::Int(n as i64)), ("bits", Attr::Int(4)), ("block_size", Attr::Int(32))];
    let y = indexed_node(&mut b, Domain::Microsoft, "MatMulNBits", rows(DType::F32, n))
        .attrs(&attrs)
        .optional_inputs(&inputs)
        .add()[0];
    b.output(y);
    b.finish().unwrap()
}

#[test]
fn matmul_nbits_with_a_bias_or_g_idx_is_declined() {
    let bias = (5, Tensor::from_f32(DType::F32, vec![4], vec![1.0; 4]));
    let g_idx = (4, Tensor::from_i64(DType::I32, vec![32], vec![0; 32]));
    for (extra, word) in [(bias, "bias"), (g_idx, "g_idx")] {
        let (r, report) = rewrite_with(&matmul_nbits(&[extra]), &[weight_only()]);
        assert_eq!(common::count(&r, "WGemm"), 0);
        let reasons: Vec<&str> = report.declined.iter().map(|d| d.reason.as_str()).collect();
        assert!(reasons.len() == 1 && reasons[0].contains(word), "{reasons:?}");
    }
}

#[test]
fn matmul_nbits_folds_with_and_without_zero_points() {
    let zero_points = (3, Tensor::from_i64(DType::U8, vec![4, 1], vec![0x08, 0x07, 0x09, 0x0f]));
    for extra in [vec![], vec![zero_points]] {
        let g = matmul_nbits(&extra);
        let (r, report) = rewrite_with(&g, &[weight_only()]);
        assert!(report.declined.is_empty() && report.type_conflicts.is_empty());
        assert_eq!((common::count(&r, "WGemm"), common::count(&r, "MatMulNBits")), (1, 0));
        let wgemm = r.nodes.iter().find(|n| n.op == "WGemm").unwrap();
        assert_eq!(wgemm.inputs.len(), 3 + extra.len());
        assert!(wgemm.attrs.get("accuracy_level").is_none());
        let mut rng = common::Rng(3);
        let a = Tensor::from_f32(DType::F32, vec![2, 32], rng.floats(64, -1.0, 1.0));
        let inputs: HashMap<String, Tensor> = [("a".to_string(), a)].into();
        assert_eq!(ir::run::run_graph(&g, &inputs).unwrap(), ir::run::run_graph(&r, &inputs).unwrap());
    }
}

//! The whole `cpu` pipeline on the exporter corpus (tiny models of five architectures and
//! SmolLM2-135M, as optimum, torch dynamo, the onnxruntime-genai builder, quantize_static and AMD
//! Quark wrote them): what is left after it (the accounting of fused ops the model implies,
//! nothing decomposed left) and that the extracted program, run by the reference evaluator, still
//! matches ONNX Runtime on the file, prefill and decode, every output.

mod common;

use ir::graph::{Graph, ValueDef};

struct Meta {
    layers: usize,
    /// Qwen3 and Gemma 3 normalise q and k per head before RoPE.
    qk_norm: bool,
}

fn meta(name: &str) -> Meta {
    let e = common::entry(name);
    Meta { layers: e.layers, qk_norm: e.arch == "qwen3" || e.arch == "gemma3" }
}

fn compile(name: &str) -> Graph {
    let g = frontend::import_file(&common::fixture(name).join("model.onnx")).unwrap_or_else(|e| panic!("{e}")).graph;
    let t = passes::targets::target("cpu").unwrap();
    passes::driver::run(&t.pipeline(), g, None, |_, _| {}).unwrap_or_else(|e| panic!("{name}: {e}")).graph
}

fn count(g: &Graph, domain_op: &str) -> usize {
    g.nodes.iter().filter(|n| format!("{}::{}", n.domain, n.op) == domain_op).count()
}

/// MatMuls whose right operand is a weight (directly or through a Transpose of one).
fn weight_matmuls(g: &Graph) -> usize {
    g.nodes
        .iter()
        .filter(|n| n.op == "MatMul")
        .filter(|n| {
            let b = n.inputs[1].unwrap();
            match &g.value(b).def {
                ValueDef::Weight(_) => true,
                ValueDef::Node { node, .. } => {
                    let p = g.node(*node);
                    p.op == "Transpose" && p.inputs[0].is_some_and(|i| matches!(g.value(i).def, ValueDef::Weight(_)))
                }
                _ => false,
            }
        })
        .count()
}

/// Decomposed or unfused ops that must not survive the pipeline.
const GONE: &[&str] = &[
    "ai.onnx::Softmax",
    "ai.onnx::Sigmoid",
    "ai.onnx::ReduceMean",
    "ai.onnx::Neg",
    "ai.onnx::RMSNormalization",
    "ai.onnx::SimplifiedLayerNormalization",
    "ai.onnx::RotaryEmbedding",
    "ai.onnx::Attention",
    "com.microsoft::GroupQueryAttention",
    "com.microsoft::MatMulNBits",
    "com.microsoft::SkipSimplifiedLayerNormalization",
    "com.microsoft::SimplifiedLayerNormalization",
];

/// Asserts the accounting of one compiled fixture and returns the worst relative error of the
/// float outputs against ONNX Runtime.
/// `projections` is `None` where the file leaves part of the model dead, so the accounting of
/// what it implies does not apply.
fn check(name: &str, projections: Option<usize>) -> f64 {
    let m = meta(name);
    let arch = common::entry(name).arch;
    let g = compile(name);
    for op in GONE {
        assert_eq!(count(&g, op), 0, "{name}: {op} survived the pipeline");
    }
    let l = m.layers;
    assert_eq!(count(&g, "npuc::Attention"), l, "{name}: one Attention per layer");
    assert_eq!(count(&g, "npuc::Rope"), 2 * l, "{name}: q and k Rope per layer");
    if let Some(projections) = projections {
        let gates = count(&g, "npuc::SwiGlu") + count(&g, "npuc::GeluGate");
        assert_eq!(gates, l, "{name}: one SwiGlu or GeluGate per layer");
        let norms = count(&g, "npuc::RmsNorm") + count(&g, "npuc::SkipRmsNorm");
        assert_eq!(norms, expected_norms(&arch, &m), "{name}: norms");
        let gemms = weight_matmuls(&g) + count(&g, "npuc::QGemm") + count(&g, "npuc::WGemm");
        assert_eq!(gemms, projections, "{name}: projection GEMMs");
    }
    let err = common_err(&g, name);
    eprintln!("{name}: {} nodes after the pipeline, worst max|Δ|/max|ref| = {err:.3e}", g.nodes.len());
    err
}

fn common_err(g: &Graph, name: &str) -> f64 {
    let mut worst = 0.0f64;
    for case in ["prefill", "decode"] {
        let c = common::read_case(name, case);
        let got = ir::run::run_graph(g, &c.inputs).unwrap_or_else(|e| panic!("{name}/{case}: {e}"));
        for (out, want) in &c.outputs {
            let (d, m) = common::max_abs_diff(&got[out], want);
            worst = worst.max(if m > 0.0 { d / m } else { d });
        }
    }
    worst
}

const FLOAT_TOL: f64 = 1e-4;

/// Norms the model implies: two per layer and the final one (Gemma 3: four per layer, before
/// and after attention and MLP), and q/k norms per layer for Qwen3 and Gemma 3.
fn expected_norms(arch: &str, m: &Meta) -> usize {
    let per_layer = if arch == "gemma3" { 4 } else { 2 };
    per_layer * m.layers + 1 + if m.qk_norm { 2 * m.layers } else { 0 }
}

/// Weight products per layer as the program keeps them. The checkpoints have q, k, v, o, gate,
/// up and down (7), Phi-3's fused qkv and gate_up (4). The builder packs q|k|v into one product:
/// it stays one where it feeds GroupQueryAttention as its packed query (5 per layer); the builder
/// splits it itself for Qwen3, whose q and k are normalised first, and the weight-only family
/// turns that split int4 product into three WGemms over views of the packed weight (7); a float
/// packed MatMul stays packed (5).
fn projections_per_layer(arch: &str, exporter: &str) -> usize {
    match (arch, exporter.starts_with("builder")) {
        ("phi3", false) => 4,
        ("qwen3", true) if exporter.contains("int4") => 7,
        (_, true) => 5,
        _ => 7,
    }
}

/// Every tiny entry of `exporters` through [`check`], each within `tol` of ONNX Runtime.
fn check_exporters(exporters: &[&str], tol: f64) {
    for x in exporters {
        for name in common::tiny_entries(x) {
            let e = common::entry(&name);
            // The builder's Phi-3 graph feeds its lm_head from layer 0's post-attention norm,
            // leaving layer 0's MLP output, layer 1's MLP and the final norm dead (the corpus
            // index notes ONNX Runtime's greedy on it parting from optimum's).
            let dead = e.arch == "phi3" && x.starts_with("builder");
            let projections = (!dead).then(|| projections_per_layer(&e.arch, x) * e.layers + 1);
            let err = check(&name, projections);
            assert!(err <= tol, "{name}: {err:e} of max|ref|, above {tol:e}");
        }
    }
}

#[test]
fn float_graphs() {
    check_exporters(&["optimum", "torch-dynamo", "torch-dynamo-opset23", "builder-fp32"], FLOAT_TOL);
}

#[test]
fn smollm2_optimum_float() {
    // 30 layers × 7 projections + the tied lm_head = 211 GEMMs; 61 norms; 30 attentions.
    let err = check("smollm2-optimum", Some(211));
    assert!(err <= FLOAT_TOL, "{err:e}");
}

#[test]
fn builder_int4_at_accuracy_level_1() {
    check_exporters(&["builder-int4-acc1"], FLOAT_TOL);
}

#[test]
fn builder_int4_at_accuracy_level_4() {
    // Each activation block quantised to int8 as ONNX Runtime does; a code on a rounding
    // boundary can go either way (tests/evaluator_vs_ort.rs): measured 2.8e-3 (llama-builder-int4)
    // and 1.5e-2 (qwen3-builder-int4-b128-asym), the other entries below 1e-6.
    check_exporters(&["builder-int4", "builder-int4-b128-asym"], 0.05);
}

#[test]
fn smollm2_builder_int4_at_accuracy_level_1() {
    // The packed q|k|v stays one WGemm: 30 × 5 + the 8-bit lm_head = 151 WGemms covering its
    // 211 projections.
    let err = check("smollm2-builder-int4-acc1", Some(151));
    assert!(err <= FLOAT_TOL, "{err:e}");
}

#[test]
fn qdq_graphs() {
    // Every projection and the lm_head is one QGemm. The attention's own Q/DQ pairs (q, kᵀ,
    // scores, probabilities, v) are dequantised into the float Attention (see the attention
    // family's header for why), which moves the logits by a few steps of their quantisation
    // scale against ONNX Runtime on the file: measured 5.6e-2 to 1.02e-1 of max|ref| over the 18
    // entries (the most, gemma3-quark-a8w8). Against ONNX Runtime on the file with those pairs
    // bypassed, the contract, the corpus test holds the logits to 1e-5.
    check_exporters(&["qdq-per-tensor-s8", "qdq-per-channel-u8", "quark-a8w8"], 0.15);
}

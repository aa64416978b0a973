//! The fused ops of hybrid decoders (`npuc::DeltaNet`, `npuc::CausalConv`, `npuc::Moe`) on the
//! hybrid corpus (`fixtures/hybrid`): the `delta-net`, `causal-conv` and `moe` families fold
//! every recurrent layer and mixture of experts the onnxruntime-genai builder writes, and the
//! rewritten graph evaluates as the imported one on ONNX Runtime's prefill and decode cases; a
//! node the rules cannot fold is kept, with the reason.
//!
//! Tolerance, relative to the largest |value| of each output: [`FUSED_TOL`]. Both graphs run the
//! same f64 recurrences and expert sums; they differ only where the queries' constant factor
//! moved into DeltaNet's scale (the product rounded once per output instead of once per query
//! element).

mod common;

use common::hybrid::{hybrid_dir, index};
use ir::{Attr, Graph};
use rewrites::saturate::{rewrite_with, SaturationReport};

const FUSED_TOL: f64 = 1e-6;

/// The families under test.
fn recurrent_families() -> Vec<rewrites::Family> {
    ["delta-net", "causal-conv", "moe"].map(|f| rewrites::family(f).unwrap()).to_vec()
}

fn count(g: &Graph, op: &str) -> usize {
    g.nodes.iter().filter(|n| n.op == op).count()
}

/// The corpus entries that have a model file, with their imported graphs.
fn imported() -> Vec<(String, Graph)> {
    let mut out = Vec::new();
    for entry in index() {
        let name = entry["name"].as_str().unwrap().to_string();
        let model = hybrid_dir().join(&name).join("model.onnx");
        if model.is_file() {
            let g = frontend::import_file(&model).unwrap_or_else(|e| panic!("{name}: {e}")).graph;
            out.push((name, g));
        }
    }
    assert!(!out.is_empty(), "no hybrid model to test");
    out
}

/// Worst relative difference between `before` and `after` over every output of `case`.
fn worst_difference(name: &str, before: &Graph, after: &Graph, case: &str) -> f64 {
    let dir = hybrid_dir().join(name).join(case);
    let (inputs, _) = frontend::read_test_case(&dir).unwrap_or_else(|e| panic!("{name}/{case}: {e}"));
    let want = ir::run::run_graph(before, &inputs).unwrap_or_else(|e| panic!("{name}/{case} unfused: {e}"));
    let got = ir::run::run_graph(after, &inputs).unwrap_or_else(|e| panic!("{name}/{case} fused: {e}"));
    let mut worst = 0f64;
    for (output, w) in &want {
        let g = got.get(output).unwrap_or_else(|| panic!("{name}/{case}: output {output} missing"));
        let (d, m) = common::max_abs_diff(g, w);
        let rel = if m > 0.0 { d / m } else { d };
        assert!(!rel.is_nan(), "{name}/{case}: {output} is NaN");
        worst = worst.max(rel);
    }
    worst
}

#[test]
fn the_rules_fold_every_recurrent_layer_and_mixture_of_experts_of_the_hybrid_corpus() {
    let (mut delta_nets, mut convs, mut moes, mut shared_experts) = (0, 0, 0, 0);
    for (name, g) in imported() {
        let (la, conv) = (count(&g, "LinearAttention"), count(&g, "CausalConvWithState"));
        let (fused, report) = rewrite_with(&g, &recurrent_families());
        assert!(report.type_conflicts.is_empty(), "{name}: {:?}", report.type_conflicts);
        assert_eq!(count(&fused, "DeltaNet"), la, "{name}: DeltaNet nodes");
        assert_eq!(count(&fused, "CausalConv"), conv, "{name}: CausalConv nodes");
        assert_eq!(count(&fused, "LinearAttention") + count(&fused, "CausalConvWithState"), 0, "{name}");
        // The builder's queries arrive scaled by 1/√d_k; the factor is now DeltaNet's scale.
        for n in fused.nodes.iter().filter(|n| n.op == "DeltaNet") {
            let q = n.inputs[0].unwrap();
            let producer = fused.nodes.iter().find(|p| p.outputs.contains(&q));
            assert!(producer.is_none_or(|p| p.op != "Mul"), "{name}: {} still reads a scaled query", n.name);
        }
        // The builder's per-head q/k L2 norms (one LpNormalization each) are DeltaNet's now.
        assert_eq!(count(&g, "LpNormalization"), 2 * la, "{name}: q/k norms in the import");
        assert_eq!(count(&fused, "LpNormalization"), 0, "{name}: q/k norms left outside DeltaNet");
        for n in fused.nodes.iter().filter(|n| n.op == "DeltaNet") {
            assert_eq!(n.attrs.float("qk_l2norm_eps").unwrap(), Some(0.0), "{name}: {}", n.name);
        }
        let experts = count(&g, "MoE") + count(&g, "QMoE");
        assert_eq!(count(&fused, "Moe"), experts, "{name}: Moe nodes");
        assert_eq!(count(&fused, "MoE") + count(&fused, "QMoE"), 0, "{name}");
        // Qwen3.5-MoE's gated shared expert (a GatedAdd of a Sigmoid after each MoE) is Moe's too.
        let shared = count(&g, "GatedAdd");
        let with_shared = fused.nodes.iter().filter(|n| n.op == "Moe" && n.inputs.len() == 10).count();
        assert_eq!((with_shared, count(&fused, "GatedAdd")), (shared, 0), "{name}: shared experts");
        assert_eq!(count(&g, "Sigmoid") - count(&fused, "Sigmoid"), shared, "{name}: shared experts' gates");
        assert!(la + conv + experts > 0, "{name}: no recurrent layer and no mixture of experts");
        println!("{name}: {la} DeltaNet, {conv} CausalConv, {experts} Moe ({shared} with a shared expert)");
        (delta_nets, convs, moes) = (delta_nets + la, convs + conv, moes + experts);
        shared_experts += shared;
    }
    assert!(
        delta_nets > 0 && convs > 0 && moes > 0 && shared_experts > 0,
        "the corpus has {delta_nets} delta-rule, {convs} conv and {moes} MoE layers"
    );
}

#[test]
fn fused_ops_evaluate_as_the_builders_spelling_on_onnx_runtime_cases() {
    for (name, g) in imported() {
        let (fused, _) = rewrite_with(&g, &recurrent_families());
        let folded = count(&fused, "DeltaNet") + count(&fused, "CausalConv") + count(&fused, "Moe");
        assert!(folded > 0, "{name}: nothing folded");
        for case in ["prefill", "decode"] {
            let worst = worst_difference(&name, &g, &fused, case);
            println!("{name}/{case}: worst relative difference {worst:.2e}");
            assert!(worst <= FUSED_TOL, "{name}/{case}: fused and unfused differ by {worst:.2e}");
        }
    }
}

/// The reasons recorded under `rule`.
fn reasons<'r>(report: &'r SaturationReport, rule: &str) -> Vec<&'r str> {
    report.declined.iter().filter(|d| d.rule == rule).map(|d| d.reason.as_str()).collect()
}

#[test]
fn a_linear_attention_without_the_gated_delta_rule_is_kept_and_the_decline_says_why() {
    let model = hybrid_dir().join("qwen3.5-builder-fp32/model.onnx");
    let mut g = frontend::import_file(&model).unwrap().graph;
    let la = g.nodes.iter_mut().find(|n| n.op == "LinearAttention").expect("a LinearAttention node");
    la.attrs.set("update_rule", Attr::Str("delta".into()));
    let conv = g.nodes.iter_mut().find(|n| n.op == "CausalConvWithState").expect("a CausalConvWithState node");
    conv.attrs.set("dilation", Attr::Int(2));
    let (fused, report) = rewrite_with(&g, &recurrent_families());
    assert_eq!((count(&fused, "DeltaNet"), count(&fused, "LinearAttention")), (0, 1));
    assert_eq!((count(&fused, "CausalConv"), count(&fused, "CausalConvWithState")), (0, 1));
    let delta = reasons(&report, "delta-net-linear-attention-ms");
    assert!(delta.iter().any(|r| r.contains("update_rule \"delta\"") && r.contains("gated delta rule")), "{delta:?}");
    let conv = reasons(&report, "causal-conv-with-state-ms");
    assert!(conv.iter().any(|r| r.contains("dilation = 2")), "{conv:?}");
}

/// An L1 norm on k is not the L2 norm DeltaNet takes in: the DeltaNet reads both norms' results,
/// and the decline names the norm.
#[test]
fn a_key_norm_other_than_l2_stays_outside_delta_net_and_the_decline_says_why() {
    let model = hybrid_dir().join("qwen3.5-builder-fp32/model.onnx");
    let mut g = frontend::import_file(&model).unwrap().graph;
    let k_norm = g.nodes.iter_mut().find(|n| n.op == "LpNormalization" && n.name.contains("k_l2norm"));
    k_norm.expect("the builder's k L2 norm").attrs.set("p", Attr::Int(1));
    let (fused, report) = rewrite_with(&g, &recurrent_families());
    assert_eq!((count(&fused, "DeltaNet"), count(&fused, "LpNormalization")), (1, 2));
    let delta = fused.nodes.iter().find(|n| n.op == "DeltaNet").unwrap();
    assert_eq!(delta.attrs.float("qk_l2norm_eps").unwrap(), None);
    let why = reasons(&report, "delta-net-qk-l2norm");
    assert!(why.iter().any(|r| r.starts_with("k's LpNormalization has p = 1")), "{why:?}");
}

/// Regression: the class of a folded DeltaNet holds both the node reading `q·c` and the one the
/// rule built over `q`; taking the factor again from the second gave a DeltaNet of scale `s·c²`
/// beside the right one, and extraction chose between them by order.
#[test]
fn the_query_factor_folds_into_the_scale_once_per_delta_net() {
    for (name, g) in imported() {
        let la = count(&g, "LinearAttention");
        let (_, report) = rewrite_with(&g, &recurrent_families());
        let applied: usize = report
            .phases
            .iter()
            .flat_map(|p| &p.iterations)
            .filter_map(|i| i.applied.get("delta-net-query-scale"))
            .sum();
        assert_eq!(applied, la, "{name}: query-scale folds");
    }
}

#[test]
fn a_cuda_only_mixture_of_experts_is_kept_and_the_decline_says_why() {
    let model = hybrid_dir().join("qwen3.5-moe-builder-fp32/model.onnx");
    let mut g = frontend::import_file(&model).unwrap().graph;
    let moe = g.nodes.iter_mut().find(|n| n.op == "MoE").expect("a MoE node");
    moe.attrs.set("use_sparse_mixer", Attr::Int(1));
    let moes = count(&g, "MoE");
    let (fused, report) = rewrite_with(&g, &recurrent_families());
    assert_eq!((count(&fused, "Moe"), count(&fused, "MoE")), (moes - 1, 1));
    let why = reasons(&report, "moe-float-experts");
    assert_eq!(why, ["use_sparse_mixer is a CUDA-only form of MoE"]);
}

/// What the host executor is handed: a compiled bundle's program holds the fused ops, and no
/// builder spelling of a recurrent layer or mixture of experts, so `hybrid_run`'s agreement with
/// ONNX Runtime is the fused ops' lowering.
#[test]
fn compiled_hybrid_programs_hold_the_fused_ops_and_none_of_the_builders_spellings() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, g) in imported() {
        let path = common::hybrid::compile(&name, tmp.path()).unwrap_or_else(|e| panic!("{name}: {e}"));
        let bundle = runtime::bundle::Bundle::open(&path, Some("cpu")).unwrap();
        let ops: Vec<&str> = bundle.program().nodes.iter().map(|n| n.op.as_str()).collect();
        let held = |op: &str| ops.iter().filter(|&&o| o == op).count();
        // A compiled program leaves out what its outputs do not read: it drops the builder's
        // `hidden_states` output, and in these files the logits do not read the last layer's
        // MLP, so a layer may be gone, never all of them.
        for (fused, imported) in [
            ("npuc::DeltaNet", count(&g, "LinearAttention")),
            ("npuc::CausalConv", count(&g, "CausalConvWithState")),
            ("npuc::Moe", count(&g, "MoE") + count(&g, "QMoE")),
        ] {
            let n = held(fused);
            assert!(n <= imported && (n > 0) == (imported > 0), "{name}: {n} {fused} of {imported}");
        }
        let spelled = ["LinearAttention", "CausalConvWithState", "MoE", "QMoE"];
        let left: Vec<_> = ops.iter().filter(|o| spelled.iter().any(|s| o.ends_with(&format!("::{s}")))).collect();
        assert!(left.is_empty(), "{name}: {left:?}");
    }
}

/// A shared expert whose gate is not a sigmoid (here a tanh in its place) is not the term Moe
/// adds: the GatedAdd stays after a Moe without a shared expert, and the graph still evaluates
/// as the import.
#[test]
fn a_shared_expert_gate_other_than_a_sigmoid_stays_outside_moe() {
    let name = "qwen3.5-moe-builder-fp32";
    let g = frontend::import_file(&hybrid_dir().join(name).join("model.onnx")).unwrap().graph;
    let mut tanh = g.clone();
    let gates = tanh.nodes.iter_mut().filter(|n| n.op == "Sigmoid" && n.name.contains("shared_expert_gate"));
    let changed = gates.map(|n| n.op = "Tanh").count();
    assert_eq!(changed, count(&g, "GatedAdd"), "one sigmoid gate per shared expert");
    let (fused, _) = rewrite_with(&tanh, &recurrent_families());
    assert_eq!(count(&fused, "GatedAdd"), changed);
    assert!(fused.nodes.iter().filter(|n| n.op == "Moe").all(|n| n.inputs.len() == 8));
    let worst = worst_difference(name, &tanh, &fused, "decode");
    assert!(worst <= FUSED_TOL, "{name}: fused and unfused differ by {worst:.2e}");
}

//! Pass-by-pass snapshots: the printed graph after each pass of the `cpu` pipeline, for a corpus
//! entry of each exporter (and of the architectures with their own structure: Qwen3's q/k norms,
//! Gemma 3's four norms and GELU gate, Phi-3's packed projections), under
//! `snapshots/<pass>/<entry>.snap`; and the passes by which the other targets' programs differ —
//! `xdna`'s array-int8, array-norms and array-gates and `intel-npu`'s fp16 saturate and final program — under
//! `snapshots/<target>/<pass>/<entry>.snap`; the `saturate` output of hybrid corpus entries (their
//! recurrent layers as DeltaNet and CausalConv, their mixtures of experts as Moe). Weight digests are left out of the text: the corpus is
//! exported afresh on each machine, and a calibration or a quantiser's float rounding may differ
//! in the last bit there while the program is the same. One module per pass; each runs the
//! pipeline up to and including its pass (the passes before it are deterministic, so the input is
//! what the previous module snapshots). Review changes with `cargo insta review`; update
//! deliberately with `INSTA_UPDATE=always cargo test --release --test pass_snapshots`.

mod common;

const FIXTURES: &[&str] = &[
    "llama-optimum",
    "llama-torch-dynamo",
    "llama-torch-dynamo-opset23",
    "llama-builder-fp32",
    "llama-builder-int4",
    "llama-qdq-per-tensor-s8",
    "llama-quark-a8w8",
    "qwen3-optimum",
    "qwen3-builder-int4",
    "qwen3-qdq-per-channel-u8",
    "gemma3-optimum",
    "phi3-builder-int4",
];

/// `text` with the digest of each weight and of each constant printed as one cut off.
fn without_digests(text: String) -> String {
    text.lines()
        .map(|l| {
            let declared = l.trim_start().starts_with("weight %") || l.trim_start().starts_with("const ");
            match (declared, l.rfind(" #")) {
                (true, Some(i)) => &l[..i],
                _ => l,
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Hybrid decoders of `fixtures/hybrid` whose `saturate` output is pinned too (under
/// `snapshots/saturate/`): the recurrent layers' fused ops, DeltaNet and CausalConv, and the
/// mixtures of experts' Moe (float experts in gpt-oss, int4 ones in LFM2-MoE).
const HYBRID_FIXTURES: &[&str] =
    &["qwen3.5-builder-fp32", "lfm2-builder-int4", "gpt-oss-builder-fp32", "lfm2-moe-builder-int4"];

/// The printed graph after `pass` of `target`'s pipeline (or after import for `import`).
fn graph_after(fixture: &str, target: &str, pass: &str) -> String {
    graph_of_model_after(&common::model(fixture), fixture, target, pass)
}

fn graph_of_model_after(path: &std::path::Path, fixture: &str, target: &str, pass: &str) -> String {
    let g = frontend::import_file(path).unwrap_or_else(|e| panic!("{e}")).graph;
    if pass == "import" {
        return without_digests(ir::print::print_graph(&g));
    }
    let target = passes::targets::target(target).unwrap();
    let pipeline = target.pipeline();
    let out = passes::driver::run(&pipeline, g, Some(pass), |_, _| {}).unwrap_or_else(|e| panic!("{fixture}: {e}"));
    without_digests(ir::print::print_graph(&out.graph))
}

fn snapshot_pass(pass: &str) {
    snapshot_target_pass("cpu", pass);
}

fn snapshot_target_pass(target: &str, pass: &str) {
    let folder = match target {
        "cpu" => pass.to_string(),
        _ => format!("{target}/{pass}"),
    };
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(format!("{}/snapshots/{folder}", env!("CARGO_MANIFEST_DIR")));
    settings.set_prepend_module_to_snapshot(false);
    settings.set_omit_expression(true);
    settings.bind(|| {
        for f in FIXTURES {
            insta::assert_snapshot!(*f, graph_after(f, target, pass));
        }
    });
}

#[test]
fn import() {
    snapshot_pass("import");
}

#[test]
fn canonicalize() {
    snapshot_pass("canonicalize");
}

#[test]
fn saturate() {
    snapshot_pass("saturate");
}

#[test]
fn hybrid_saturate() {
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(format!("{}/snapshots/saturate", env!("CARGO_MANIFEST_DIR")));
    settings.set_prepend_module_to_snapshot(false);
    settings.set_omit_expression(true);
    settings.bind(|| {
        for f in HYBRID_FIXTURES {
            let model = common::hybrid::hybrid_dir().join(f).join("model.onnx");
            insta::assert_snapshot!(*f, graph_of_model_after(&model, f, "cpu", "saturate"));
        }
    });
}

#[test]
fn position_tables() {
    snapshot_pass("position-tables");
}

#[test]
fn lower_slices() {
    snapshot_pass("lower-slices");
}

#[test]
fn xdna_array_int8() {
    snapshot_target_pass("xdna", "array-int8");
}

#[test]
fn xdna_array_norms() {
    snapshot_target_pass("xdna", "array-norms");
}

#[test]
fn xdna_array_gates() {
    snapshot_target_pass("xdna", "array-gates");
}

#[test]
fn intel_npu_saturate() {
    snapshot_target_pass("intel-npu", "saturate");
}

#[test]
fn intel_npu_lower_slices() {
    snapshot_target_pass("intel-npu", "lower-slices");
}

/// The builder gathers RoPE's cos/sin from caches of its own: the program's tables hold every
/// position those caches hold when that is more than the pass's default (here a default of 64
/// against the corpus models' caches; Qwen3-0.6B's builder file holds 40,960).
#[test]
fn position_tables_hold_every_position_of_the_models_own_cache() {
    use passes::Pass;
    let g = frontend::import_file(&common::model("llama-builder-fp32")).unwrap().graph;
    let cache = g.weights.iter().find(|(_, w)| w.name == "cos_cache").map(|(_, w)| w.shape[0]);
    let cache = cache.expect("the builder's cos_cache");
    assert!(cache > 64, "a cache of {cache} rows");
    let target = passes::targets::target("cpu").unwrap();
    let saturated = passes::driver::run(&target.pipeline(), g, Some("saturate"), |_, _| {}).unwrap().graph;
    let (_, detail) = passes::position_tables::PositionTables { rows: 64 }.run(saturated).unwrap();
    assert_eq!(detail.data["rows"], cache, "{}", detail.summary);
    assert!(detail.summary.contains(&format!("tabulated over {cache} positions")), "{}", detail.summary);
}

//! Pass-by-pass snapshots: the printed graph after each pass of the `cpu` pipeline, for every
//! tiny fixture form, under `snapshots/<pass>/<fixture>.snap`. One module per pass; each runs the
//! pipeline up to and including its pass (the passes before it are deterministic, so the input is
//! what the previous module snapshots). Review changes with `cargo insta review`; update
//! deliberately with `INSTA_UPDATE=always cargo test --release --test pass_snapshots`.

mod common;

const FIXTURES: &[&str] = &[
    "llama_f1",
    "llama_f2",
    "llama_f3a",
    "llama_f3b",
    "llama_f4",
    "qwen3_f1",
    "qwen3_f2",
    "qwen3_f3a",
    "qwen3_f3b",
    "qwen3_f4",
];

/// The printed graph after `pass` (or after import for `import`).
fn graph_after(fixture: &str, pass: &str) -> String {
    let path = common::fixture(fixture).join("model.onnx");
    let g = frontend::import_file(&path).unwrap_or_else(|e| panic!("{e}")).graph;
    if pass == "import" {
        return ir::print::print_graph(&g);
    }
    let target = passes::targets::target("cpu").unwrap();
    let pipeline = target.pipeline();
    let out = passes::driver::run(&pipeline, g, Some(pass), |_, _| {}).unwrap_or_else(|e| panic!("{fixture}: {e}"));
    ir::print::print_graph(&out.graph)
}

fn snapshot_pass(pass: &str) {
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(format!("{}/snapshots/{pass}", env!("CARGO_MANIFEST_DIR")));
    settings.set_prepend_module_to_snapshot(false);
    settings.set_omit_expression(true);
    settings.bind(|| {
        for f in FIXTURES {
            insta::assert_snapshot!(*f, graph_after(f, pass));
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

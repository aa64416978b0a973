//! The hybrid and mixture-of-experts ops against ONNX Runtime, one node at a time: every case
//! `tools/contrib_node_cases.py` wrote into `fixtures/contrib-node-cases` (ONNX's node-test
//! layout, ONNX Runtime's CPU outputs as the expected values) is imported and run by the
//! reference evaluator, and every output — recurrent and convolution states included — must be
//! within [`REL_TOL`] of the largest |expected| of that output. The worst error of each case is
//! written to `fixtures/contrib-node-cases/summary.txt`.

mod support;

use std::path::{Path, PathBuf};
use support::relative_error;

/// Both sides compute the same f32 values; the evaluator accumulates in f64, ONNX Runtime in f32
/// in its own order.
const REL_TOL: f64 = 1e-5;

fn cases_dir() -> PathBuf {
    let fixtures = std::env::var_os("NPUC_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures"));
    let dir = fixtures.join("contrib-node-cases");
    assert!(dir.join(".complete").is_file(), "{} is missing: run `make fixtures`", dir.display());
    dir
}

/// Imports one case and returns its worst relative error over every output.
fn run_case(dir: &Path) -> Result<f64, String> {
    let imported = frontend::import_file(&dir.join("model.onnx")).map_err(|e| format!("import: {e}"))?;
    let (inputs, expected) =
        frontend::read_test_case(&dir.join("test_data_set_0")).map_err(|e| format!("reading: {e}"))?;
    let got = ir::run::run_graph(&imported.graph, &inputs).map_err(|e| format!("evaluating: {e}"))?;
    let mut worst = 0.0f64;
    for (name, want) in &expected {
        let t = got.get(name).ok_or_else(|| format!("no output `{name}`"))?;
        worst = worst.max(relative_error(t, want).map_err(|e| format!("output `{name}`: {e}"))?);
    }
    Ok(worst)
}

#[test]
fn hybrid_and_moe_ops_match_onnx_runtime_node_by_node() {
    let root = cases_dir();
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.join("model.onnx").is_file())
        .collect();
    cases.sort();
    assert!(cases.len() >= 50, "{} cases in {}", cases.len(), root.display());
    let mut lines = Vec::new();
    let mut failures = Vec::new();
    for case in &cases {
        let name = case.file_name().unwrap().to_string_lossy().into_owned();
        match run_case(case) {
            Ok(err) if err <= REL_TOL => lines.push(format!("{name}: {err:.2e}")),
            Ok(err) => failures.push(format!("{name}: relative error {err:.2e} > {REL_TOL:e}")),
            Err(e) => failures.push(format!("{name}: {e}")),
        }
    }
    lines.extend(failures.iter().map(|f| format!("FAIL {f}")));
    std::fs::write(root.join("summary.txt"), lines.join("\n") + "\n").unwrap();
    assert!(failures.is_empty(), "{} of {} cases fail:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

//! Fixture access for the rule-family tests: import a fixture, rewrite it, and check the
//! rewritten program against ONNX Runtime's recorded outputs with the reference evaluator.

#![allow(dead_code)]

use ir::{Graph, Tensor};
use std::collections::HashMap;
use std::path::PathBuf;

pub fn fixtures_dir() -> PathBuf {
    let dir = std::env::var_os("NPUC_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures"));
    assert!(dir.is_dir(), "fixtures folder {} is missing: run `make fixtures`", dir.display());
    dir
}

/// Imports `fixtures/<name>/model.onnx`.
pub fn import(name: &str) -> Graph {
    let path = fixtures_dir().join(name).join("model.onnx");
    frontend::import_file(&path).unwrap_or_else(|e| panic!("{e}")).graph
}

/// Reads the inputs and expected outputs of one recorded case.
pub fn case(name: &str, case: &str) -> (HashMap<String, Tensor>, Vec<(String, Tensor)>) {
    frontend::read_test_case(&fixtures_dir().join(name).join(case)).unwrap_or_else(|e| panic!("{e}"))
}

/// Runs `g` on both recorded cases of `fixture` and returns the worst max|Δ|/max|ref| over all
/// float outputs.
pub fn worst_relative_error(g: &Graph, fixture: &str) -> f64 {
    let mut worst = 0.0f64;
    for c in ["prefill", "decode"] {
        let (inputs, outputs) = case(fixture, c);
        let got = ir::run::run_graph(g, &inputs).unwrap_or_else(|e| panic!("{fixture}/{c}: {e}"));
        for (name, want) in outputs {
            let t = &got[&name];
            assert_eq!(t.shape, want.shape, "{fixture}/{c}: {name}");
            let (a, b) = (t.to_f64_vec(), want.to_f64_vec());
            let m = b.iter().fold(0.0f64, |m, x| m.max(x.abs()));
            let d = a.iter().zip(&b).fold(0.0f64, |d, (x, y)| d.max((x - y).abs()));
            worst = worst.max(if m > 0.0 { d / m } else { d });
        }
    }
    worst
}

/// Number of nodes with op `op` in `g`.
pub fn count(g: &Graph, op: &str) -> usize {
    g.nodes.iter().filter(|n| n.op == op).count()
}

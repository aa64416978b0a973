//! Imports a model and runs the reference evaluator on test-case folders beside it, printing
//! each output's largest error relative to its largest |expected|.
//!
//!     cargo run -p frontend --release --example check_cases -- MODEL_DIR [CASE ...]
//!
//! `MODEL_DIR` holds `model.onnx`; the cases default to its `prefill` and `decode` folders (the
//! exporter corpus's layout), each with `input_*.pb` and `output_*.pb` in ONNX's node-test form.

#[path = "../tests/support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use support::relative_error;

fn check(graph: &ir::Graph, case: &Path) -> Result<f64, String> {
    let (inputs, expected) = frontend::read_test_case(case).map_err(|e| format!("reading: {e}"))?;
    let got = ir::run::run_graph(graph, &inputs).map_err(|e| format!("evaluating: {e}"))?;
    let mut worst = 0.0f64;
    for (name, want) in &expected {
        let t = got.get(name).ok_or_else(|| format!("no output `{name}`"))?;
        let err = relative_error(t, want).map_err(|e| format!("{name}: {e}"))?;
        println!("  {name}: {err:.2e}");
        worst = worst.max(err);
    }
    Ok(worst)
}

fn main() -> ExitCode {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let Some(model_dir) = args.first() else {
        eprintln!("usage: check_cases MODEL_DIR [CASE ...]");
        return ExitCode::FAILURE;
    };
    let cases =
        if args.len() > 1 { args[1..].to_vec() } else { vec![model_dir.join("prefill"), model_dir.join("decode")] };
    let imported = match frontend::import_file(&model_dir.join("model.onnx")) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("{}: import: {e}", model_dir.display());
            return ExitCode::FAILURE;
        }
    };
    let mut ok = true;
    for case in &cases {
        println!("{}:", case.display());
        match check(&imported.graph, case) {
            Ok(worst) => println!("  worst {worst:.2e}"),
            Err(e) => {
                println!("  FAIL {e}");
                ok = false;
            }
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

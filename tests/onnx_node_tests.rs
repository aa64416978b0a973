//! ONNX's own backend node tests (from the onnx 1.20.0 sdist, unpacked into
//! `fixtures/onnx-node-tests` by `tools/onnx_node_tests.py`): every case is imported and, when
//! npuc takes it, run by the reference evaluator against the case's expected outputs (ONNX's
//! backend tolerances: rtol 1e-3, atol 1e-7; integers and booleans exact). Nothing may panic.
//! The tally is written to `fixtures/onnx-node-tests/summary.txt` (make test prints it) and the
//! failures of ops npuc claims to `failures.txt`.
//!
//! A case is refused when its op is outside npuc's vocabulary, or when the model's opset selects a
//! definition of an op whose signature differs from those npuc implements (`frontend::versions`);
//! or when an axes/split/starts operand is a graph input (npuc compiles static shapes and refuses
//! such a node by name). A refusal for any other reason, or an evaluation that does not match,
//! counts as a failure.

mod common;

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord, Clone, Copy)]
enum Outcome {
    Pass,
    Fail,
    OutsideVocabulary,
    Opset,
    /// Axes, splits or slice bounds given at run time: npuc compiles static shapes and says so.
    RunTimeShapeOperand,
    Panic,
}

/// Whether `got` is `want` within ONNX's backend-test tolerances.
fn close(got: &ir::Tensor, want: &ir::Tensor) -> Result<(), String> {
    if got.shape != want.shape {
        return Err(format!("shape {:?}, expected {:?}", got.shape, want.shape));
    }
    if got.dtype != want.dtype {
        return Err(format!("dtype {}, expected {}", got.dtype, want.dtype));
    }
    let (a, b) = (got.to_f64_vec(), want.to_f64_vec());
    let exact = !want.dtype.is_float();
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        let ok = if exact {
            x == y
        } else if y.is_nan() {
            x.is_nan()
        } else {
            x == y || (x - y).abs() <= 1e-7 + 1e-3 * y.abs()
        };
        if !ok {
            return Err(format!("element {i} is {x}, expected {y}"));
        }
    }
    Ok(())
}

/// Imports and evaluates one case folder.
fn run_case(dir: &Path) -> (Outcome, String) {
    let imported = match frontend::import_file(&dir.join("model.onnx")) {
        Ok(i) => i,
        Err(e) => {
            let outcome = match e.kind {
                frontend::ErrorKind::UnknownOp { .. } => Outcome::OutsideVocabulary,
                frontend::ErrorKind::Opset { .. } | frontend::ErrorKind::OpVersion { .. } => Outcome::Opset,
                frontend::ErrorKind::BadNode { ref detail, .. } if detail.contains("must be a constant") => {
                    Outcome::RunTimeShapeOperand
                }
                _ => Outcome::Fail,
            };
            return (outcome, e.to_string());
        }
    };
    let mut sets: Vec<_> =
        std::fs::read_dir(dir).unwrap().filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.is_dir()).collect();
    sets.sort();
    for set in sets {
        let (inputs, expected) = match frontend::read_test_case(&set) {
            Ok(c) => c,
            Err(e) => return (Outcome::Fail, format!("reading {}: {e}", set.display())),
        };
        let got = match ir::run::run_graph(&imported.graph, &inputs) {
            Ok(g) => g,
            Err(e) => return (Outcome::Fail, format!("evaluating: {e}")),
        };
        for (name, want) in &expected {
            let Some(t) = got.get(name) else { return (Outcome::Fail, format!("no output `{name}`")) };
            if let Err(e) = close(t, want) {
                return (Outcome::Fail, format!("output `{name}`: {e}"));
            }
        }
    }
    (Outcome::Pass, String::new())
}

#[test]
fn onnx_backend_node_tests_pass_or_are_refused_and_nothing_panics() {
    let root = common::fixtures_dir().join("onnx-node-tests");
    assert!(root.join(".complete").is_file(), "{} is missing: run `make fixtures`", root.display());
    let mut cases: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.join("model.onnx").is_file())
        .collect();
    cases.sort();
    assert!(cases.len() > 1500, "{} cases", cases.len());
    let mut tally: BTreeMap<Outcome, usize> = BTreeMap::new();
    let mut failures = Vec::new();
    let mut panics = Vec::new();
    for case in &cases {
        let name = case.file_name().unwrap().to_string_lossy().into_owned();
        let (outcome, why) =
            catch_unwind(AssertUnwindSafe(|| run_case(case))).unwrap_or((Outcome::Panic, "panicked".into()));
        *tally.entry(outcome).or_default() += 1;
        match outcome {
            Outcome::Fail => failures.push(format!("{name}: {why}")),
            Outcome::Panic => panics.push(name),
            _ => {}
        }
    }
    let count = |o| tally.get(&o).copied().unwrap_or(0);
    let summary = format!(
        "onnx node tests ({} cases): {} pass, {} fail, {} refused (op outside the vocabulary), {} refused (op version), {} refused (shape operand given at run time), {} panics\n",
        cases.len(),
        count(Outcome::Pass),
        count(Outcome::Fail),
        count(Outcome::OutsideVocabulary),
        count(Outcome::Opset),
        count(Outcome::RunTimeShapeOperand),
        count(Outcome::Panic)
    );
    std::fs::write(root.join("summary.txt"), &summary).unwrap();
    std::fs::write(root.join("failures.txt"), failures.join("\n") + "\n").unwrap();
    assert!(panics.is_empty(), "{summary}panicked: {panics:?}");
    assert!(count(Outcome::Pass) >= PASS_FLOOR, "{summary}{}", failures.join("\n"));
    assert!(failures.len() <= FAIL_CEILING, "{summary}{}", failures.join("\n"));
}

/// Passes now; fewer is a regression.
const PASS_FLOOR: usize = 1062;
/// Failures now, none an evaluator bug. Attention with a mask and `qk_matmul_output_mode` or
/// softcap (9): the 1.20.0 data predates onnx/onnx#7867, which put the softcap before the mask
/// and made mode 1 the softcapped scores and mode 2 the masked ones, the definition npuc
/// implements. String tensors (2), optional and sequence inputs (2). LpNormalization of an
/// all-zero vector (1): the data expects 0/0 = NaN, npuc gives 0 as ONNX Runtime does (the
/// builder's q/k l2-norms run on ONNX Runtime). More is a regression.
const FAIL_CEILING: usize = 14;

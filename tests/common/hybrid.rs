//! The hybrid corpus (`fixtures/hybrid`, `tools/export_corpus.py --hybrid`): where it is, its
//! index, and how a run's greedy ids are held to ONNX Runtime's.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A greedy step may pick another id only where ONNX Runtime's top two logits are this close
/// (a near-tie that a last-bit difference can flip); the comparison stops there.
pub const TIE_MARGIN: f64 = 1e-3;

pub fn hybrid_dir() -> PathBuf {
    let dir = super::fixtures_dir().join("hybrid");
    assert!(dir.join("index.json").is_file(), "{} has no index.json: run `make corpus`", dir.display());
    dir
}

/// The index's entries.
pub fn index() -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(hybrid_dir().join("index.json")).unwrap();
    let index: serde_json::Value = serde_json::from_str(&text).unwrap();
    index["entries"].as_array().unwrap().clone()
}

/// A case's list of token ids under `key` (`prompt_ids`, `greedy_ids`).
pub fn ids(case: &serde_json::Value, key: &str) -> Vec<u32> {
    case[key].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect()
}

/// `got` equals the case's greedy ids up to the first step where it leaves them, which must be a
/// near-tie in ONNX Runtime's logits ([`TIE_MARGIN`]).
pub fn greedy_agrees(got: &[u32], case: &serde_json::Value) -> Result<(), String> {
    let want = ids(case, "greedy_ids");
    match got.iter().zip(&want).position(|(a, b)| a != b) {
        None => Ok(()),
        Some(i) if case["greedy_margins"][i].as_f64().unwrap_or(1.0) < TIE_MARGIN => Ok(()),
        Some(i) => Err(format!("greedy step {i}: {got:?} against ONNX Runtime's {want:?}")),
    }
}

/// `npuc compile` of entry `name` into `tmp`; the compiler's message when it refuses.
pub fn compile(name: &str, tmp: &Path) -> Result<PathBuf, String> {
    let model = hybrid_dir().join(name).join("model.onnx");
    if !model.is_file() {
        return Err("no model.onnx (the builder refused it)".to_string());
    }
    let bundle = tmp.join(format!("{name}.npub"));
    let out = Command::new(env!("CARGO_BIN_EXE_npuc"))
        .args(["compile", model.to_str().unwrap(), "--target", "cpu", "-o", bundle.to_str().unwrap()])
        .output()
        .unwrap();
    match out.status.success() {
        true => Ok(bundle),
        false => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
    }
}

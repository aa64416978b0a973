//! The host executor refuses at load what it cannot run, naming the node and the op.

use runtime::bundle::{Bundle, BundleWriter, Dtype, ManifestHeader, ModelConfig, Target};
use runtime::exec::{ExecError, ExecOptions, Executor};
use serde_json::{json, Value};

/// A bundle in `dir` whose program is `program`, with one f32 weight `table` [4, 2].
fn bundle_with(dir: &std::path::Path, program: Value) -> Bundle {
    let path = dir.join("tiny.npub");
    let header = ManifestHeader {
        compiler_version: "test".to_string(),
        target: Target::Cpu,
        model: ModelConfig::default(),
        program: serde_json::from_value(program).expect("a program in the documented format"),
    };
    let mut writer = BundleWriter::create(&path, header).unwrap();
    let table: Vec<u8> = (0..8).flat_map(|i| (i as f32).to_le_bytes()).collect();
    writer.add_tensor("table", Dtype::F32, &[4, 2], &table, None).unwrap();
    writer.finish().unwrap();
    Bundle::open(&path, Some("cpu")).unwrap()
}

/// input_ids → Gather(table) → `op` → logits.
fn program_with(op: &str) -> Value {
    json!({
        "format": "npuc-program/1",
        "values": [
            {"name": "input_ids", "dtype": "i64", "shape": ["batch_size", "sequence_length"], "def": "input"},
            {"name": "table", "dtype": "f32", "shape": [4, 2], "def": {"weight": "table"}},
            {"name": "embedded", "dtype": "f32", "shape": ["batch_size", "sequence_length", 2], "def": "node"},
            {"name": "logits", "dtype": "f32", "shape": ["batch_size", "sequence_length", 2], "def": "node"}
        ],
        "nodes": [
            {"name": "embed", "op": "ai.onnx::Gather", "attrs": {"axis": 0}, "inputs": [1, 0], "outputs": [2]},
            {"name": "last_op", "op": op, "attrs": {"axis": -1}, "inputs": [2], "outputs": [3]}
        ],
        "inputs": [0],
        "outputs": [3]
    })
}

fn load_error(program: Value) -> ExecError {
    let tmp = tempfile::tempdir().unwrap();
    let bundle = bundle_with(tmp.path(), program);
    match Executor::new(&bundle, ExecOptions::default()) {
        Ok(_) => panic!("the program was accepted"),
        Err(e) => e,
    }
}

#[test]
fn an_unsupported_op_is_refused_naming_op_and_node() {
    let err = load_error(program_with("ai.onnx::Softmax"));
    assert!(
        matches!(&err, ExecError::UnsupportedOp { node, op } if node == "last_op" && op == "ai.onnx::Softmax"),
        "{err:?}"
    );
    assert_eq!(err.to_string(), "node `last_op`: op ai.onnx::Softmax is not supported by the host executor yet");
}

#[test]
fn a_program_without_attention_is_refused() {
    let err = load_error(program_with("ai.onnx::Identity"));
    assert!(err.to_string().contains("no Attention node"), "{err}");
}

#[test]
fn an_unknown_symbolic_size_is_refused_naming_the_value() {
    let mut program = program_with("ai.onnx::Identity");
    program["values"][2]["shape"][1] = json!("num_images");
    let err = load_error(program);
    assert!(matches!(err, ExecError::Program { .. }), "{err:?}");
    assert!(err.to_string().contains("`embedded`") && err.to_string().contains("num_images"), "{err}");
}

#[test]
fn a_wgemm_whose_codes_are_not_u8_is_refused_naming_the_node() {
    let mut program = program_with("npuc::WGemm");
    program["nodes"][1]["attrs"] = json!({"K": 2, "N": 2, "bits": 4, "block_size": 16});
    program["nodes"][1]["inputs"] = json!([2, 1, 1]);
    let err = load_error(program);
    assert!(matches!(&err, ExecError::Node { node, .. } if node == "last_op"), "{err:?}");
    assert!(err.to_string().contains("`table`) is not a u8 weight"), "{err}");
}

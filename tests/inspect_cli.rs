//! `npuc inspect --json` on the fixtures, checked against what the fixture scripts recorded
//! independently in `meta.json` (op histogram, model config).

mod common;

use serde_json::Value;
use std::collections::BTreeMap;
use std::process::Command;

fn inspect(name: &str) -> (Value, Value) {
    let dir = common::fixture(name);
    let out = Command::new(env!("CARGO_BIN_EXE_npuc"))
        .args(["inspect", "--json"])
        .arg(dir.join("model.onnx"))
        .output()
        .unwrap();
    assert!(out.status.success(), "npuc inspect failed: {}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let meta: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("meta.json")).unwrap()).unwrap();
    (report, meta)
}

fn int(v: &Value, key: &str) -> i64 {
    v[key].as_i64().unwrap_or_else(|| panic!("{key} missing"))
}

/// Node counts by op name (domains merged), as the report gives them.
fn by_op(census: &Value) -> BTreeMap<String, i64> {
    let mut m = BTreeMap::new();
    for (k, v) in census["by_op"].as_object().unwrap() {
        let op = k.rsplit("::").next().unwrap().to_string();
        *m.entry(op).or_insert(0) += v.as_i64().unwrap();
    }
    m
}

/// The GEMMs of the report as (op, K, N, rhs) → count.
fn gemms(report: &Value) -> BTreeMap<(String, String, String, String), i64> {
    report["gemms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            let s = |k: &str| g[k].as_str().unwrap().to_string();
            ((s("op"), s("k"), s("n"), s("rhs")), g["count"].as_i64().unwrap())
        })
        .collect()
}

/// Checks shared by every form: the census before import is the file's, shape arithmetic and
/// constants are gone after it, and the decoder's inputs carry the symbolic dims.
fn common_checks(name: &str) -> (Value, Value) {
    let (r, meta) = inspect(name);
    let hist: BTreeMap<String, i64> = meta["op_histogram"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.trim_start_matches("com.microsoft.").to_string(), v.as_i64().unwrap()))
        .collect();
    assert_eq!(by_op(&r["before"]), hist, "{name}: census before import differs from the file's");
    let after = by_op(&r["after"]);
    for gone in ["Constant", "Identity", "Size"] {
        assert!(!after.contains_key(gone), "{name}: {gone} survived import: {after:?}");
    }
    // What stays of the shape arithmetic computes the causal mask and positions from runtime
    // sizes: one Shape per input whose sizes are read (input_ids, the past), however many layers.
    assert!(after.get("Shape").copied().unwrap_or(0) <= 2, "{name}: {after:?}");
    assert!(int(&r["after"], "nodes") <= int(&r["before"], "nodes"));
    assert_eq!(r["unsupported"].as_array().unwrap().len(), 0);
    let inputs: BTreeMap<&str, &str> = r["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| (i["name"].as_str().unwrap(), i["shape"].as_str().unwrap()))
        .collect();
    assert_eq!(inputs["input_ids"], "[batch_size,sequence_length]");
    let kv = format!("[batch_size,{},past_sequence_length,{}]", int(&meta, "kv_heads"), int(&meta, "head_dim"));
    assert_eq!(inputs["past_key_values.0.key"], kv);
    let outputs: BTreeMap<&str, &str> = r["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| (i["name"].as_str().unwrap(), i["shape"].as_str().unwrap()))
        .collect();
    assert_eq!(outputs["logits"], format!("[batch_size,sequence_length,{}]", int(&meta, "vocab")));
    let present = format!(
        "[batch_size,{},past_sequence_length + sequence_length,{}]",
        int(&meta, "kv_heads"),
        int(&meta, "head_dim")
    );
    assert_eq!(outputs["present.0.key"], present);
    (r, meta)
}

/// The float form: every projection is a MatMul on a weight, the tied lm_head a MatMul on the
/// transposed embedding, attention two activation MatMuls per layer.
fn float_form(name: &str) {
    let (r, meta) = common_checks(name);
    let (layers, hidden, heads, kv, hd, inter, vocab) = (
        int(&meta, "layers"),
        int(&meta, "hidden"),
        int(&meta, "heads"),
        int(&meta, "kv_heads"),
        int(&meta, "head_dim"),
        int(&meta, "intermediate"),
        int(&meta, "vocab"),
    );
    let g = gemms(&r);
    let w =
        |k: i64, n: i64| g.get(&("MatMul".into(), k.to_string(), n.to_string(), "weight".into())).copied().unwrap_or(0);
    let expect = |k: i64, n: i64, count: i64| {
        assert!(w(k, n) >= count, "{name}: MatMul {k}×{n} on a weight: {} < {count}", w(k, n))
    };
    expect(hidden, heads * hd, layers);
    expect(hidden, kv * hd, 2 * layers);
    expect(heads * hd, hidden, layers);
    expect(hidden, inter, 2 * layers);
    expect(inter, hidden, layers);
    let head = g.get(&("MatMul".into(), hidden.to_string(), vocab.to_string(), "weight (transposed)".into()));
    assert_eq!(head, Some(&1), "{name}: tied lm_head");
    assert_eq!(by_op(&r["after"])["MatMul"], 7 * layers + 2 * layers + 1, "{name}: MatMul count");
    assert!(
        int(&r["after"], "nodes") * 2 < int(&r["before"], "nodes"),
        "{name}: import should at least halve an optimum-style graph"
    );
    assert!(r["assumptions"]
        .as_array()
        .unwrap()
        .iter()
        .any(|a| a == "total_sequence_length = past_sequence_length + sequence_length"));
}

#[test]
fn llama_float_form() {
    float_form("llama_f1");
}

#[test]
fn qwen3_float_form() {
    float_form("qwen3_f1");
}

#[test]
fn smollm2_float_form() {
    let (r, _) = inspect("smollm2_f1");
    // 30 layers: 7 projections each plus the tied lm_head; 2 attention MatMuls per layer.
    assert_eq!(by_op(&r["after"])["MatMul"], 30 * 9 + 1);
    float_form("smollm2_f1");
}

#[test]
fn genai_int4_forms() {
    for name in ["llama_f2", "qwen3_f2", "smollm2_f2"] {
        let (r, meta) = common_checks(name);
        let after = by_op(&r["after"]);
        let layers = int(&meta, "layers");
        assert_eq!(after["GroupQueryAttention"], layers, "{name}");
        assert_eq!(after.get("MatMul"), None, "{name}: float MatMuls left");
        assert!(after["MatMulNBits"] > 3 * layers, "{name}");
        assert!(r["gemms"].as_array().unwrap().iter().all(|g| g["op"] == "MatMulNBits"), "{name}");
    }
}

#[test]
fn qdq_forms_keep_their_quantize_dequantize_pairs() {
    for name in ["llama_f3a", "llama_f3b", "qwen3_f3a", "qwen3_f3b"] {
        let (r, meta) = common_checks(name);
        let before = by_op(&r["before"]);
        let after = by_op(&r["after"]);
        // Import folds nothing of the quantisation: that is the rewrites' job.
        assert_eq!(after["QuantizeLinear"], before["QuantizeLinear"], "{name}");
        assert_eq!(after["DequantizeLinear"], before["DequantizeLinear"], "{name}");
        let layers = int(&meta, "layers");
        let quantized = r["gemms"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|g| g["rhs"] == "quantized weight")
            .map(|g| g["count"].as_i64().unwrap())
            .sum::<i64>();
        assert_eq!(quantized, 7 * layers, "{name}: projections on int8 weights");
    }
}

#[test]
fn opset23_forms_keep_the_fused_ops() {
    for name in ["llama_f4", "qwen3_f4"] {
        let (r, meta) = common_checks(name);
        let after = by_op(&r["after"]);
        let layers = int(&meta, "layers");
        assert_eq!(after["Attention"], layers, "{name}");
        assert!(after["RMSNormalization"] > 2 * layers, "{name}");
        assert!(after["RotaryEmbedding"] >= 2 * layers, "{name}");
    }
}

#[test]
fn text_report_names_the_model_and_counts() {
    let dir = common::fixture("llama_f1");
    let out = Command::new(env!("CARGO_BIN_EXE_npuc")).arg("inspect").arg(dir.join("model.onnx")).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("llama_f1/model.onnx"));
    assert!(text.contains("nodes      402 in the file"), "{text}");
    assert!(text.contains("unsupported ops: none"));
}

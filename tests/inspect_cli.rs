//! `npuc inspect --json` on corpus models, checked against what the exporter tool recorded
//! independently (the op histogram onnx reads from the file, in the corpus index) and the
//! checkpoint's config.json.

mod common;

use serde_json::Value;
use std::collections::BTreeMap;
use std::process::Command;

/// `npuc inspect --json` of a corpus entry, and the entry's op histogram from the index (node
/// count per op, domains merged).
fn inspect(name: &str) -> (Value, BTreeMap<String, i64>) {
    let out =
        Command::new(env!("CARGO_BIN_EXE_npuc")).args(["inspect", "--json"]).arg(common::model(name)).output().unwrap();
    assert!(out.status.success(), "npuc inspect failed: {}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let entry = common::index_entry(name);
    let mut hist = BTreeMap::new();
    let recorded =
        entry["op_histogram"].as_object().unwrap_or_else(|| panic!("{name}: no op_histogram: run `make corpus`"));
    for (k, v) in recorded {
        *hist.entry(k.rsplit("::").next().unwrap().to_string()).or_insert(0) += v.as_i64().unwrap();
    }
    (report, hist)
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
fn common_checks(name: &str) -> (Value, common::Config) {
    let (r, hist) = inspect(name);
    let c = common::config(name);
    assert_eq!(by_op(&r["before"]), hist, "{name}: census before import differs from the file's");
    let after = by_op(&r["after"]);
    for gone in ["Constant", "Identity", "Size"] {
        assert!(!after.contains_key(gone), "{name}: {gone} survived import: {after:?}");
    }
    // What stays of the shape arithmetic computes the causal mask and positions from runtime
    // sizes, once, however many layers: 7 Shapes in optimum's graphs of 2 and of 30 layers.
    assert!(after.get("Shape").copied().unwrap_or(0) <= 8, "{name}: {after:?}");
    assert!(int(&r["after"], "nodes") <= int(&r["before"], "nodes"));
    assert_eq!(r["unsupported"].as_array().unwrap().len(), 0);
    let inputs: BTreeMap<&str, &str> = r["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| (i["name"].as_str().unwrap(), i["shape"].as_str().unwrap()))
        .collect();
    assert_eq!(inputs["input_ids"], "[batch_size,sequence_length]");
    let kv = format!("[batch_size,{},past_sequence_length,{}]", c.kv_heads, c.head_dim);
    assert_eq!(inputs["past_key_values.0.key"], kv);
    let outputs: BTreeMap<&str, &str> = r["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| (i["name"].as_str().unwrap(), i["shape"].as_str().unwrap()))
        .collect();
    assert_eq!(outputs["logits"], format!("[batch_size,sequence_length,{}]", c.vocab));
    let present = format!("[batch_size,{},past_sequence_length + sequence_length,{}]", c.kv_heads, c.head_dim);
    assert_eq!(outputs["present.0.key"], present);
    (r, c)
}

/// optimum's float graph: every projection is a MatMul on a weight, a tied lm_head a MatMul on
/// the transposed embedding, attention two activation MatMuls per layer.
fn float_form(name: &str) {
    let (r, c) = common_checks(name);
    let as_i64 = |v: usize| v as i64;
    let (layers, hidden, heads, kv, hd, inter, vocab) = (
        as_i64(c.layers),
        as_i64(c.hidden),
        as_i64(c.heads),
        as_i64(c.kv_heads),
        as_i64(c.head_dim),
        as_i64(c.intermediate),
        as_i64(c.vocab),
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
    let rhs = if c.tied_embeddings { "weight (transposed)" } else { "weight" };
    let head = g.get(&("MatMul".into(), hidden.to_string(), vocab.to_string(), rhs.into()));
    assert!(head >= Some(&1), "{name}: lm_head on a {rhs}");
    // Projections, two attention products per layer, the lm_head, and the RoPE frequencies
    // (inv_freq × positions, which transformers computes as a matrix product).
    assert_eq!(by_op(&r["after"])["MatMul"], 7 * layers + 2 * layers + 1 + 1, "{name}: MatMul count");
    assert!(
        int(&r["after"], "nodes") * 2 < int(&r["before"], "nodes"),
        "{name}: import should at least halve an optimum-style graph"
    );
    // The mask spans the past and the new tokens: one symbolic sum, as the file declares it.
    let mask = r["inputs"].as_array().unwrap().iter().find(|i| i["name"] == "attention_mask").unwrap();
    assert_eq!(mask["shape"], "[batch_size,past_sequence_length + sequence_length]", "{name}");
}

#[test]
fn llama_optimum_float() {
    float_form("llama-optimum");
}

#[test]
fn qwen3_optimum_float() {
    float_form("qwen3-optimum");
}

#[test]
fn smollm2_optimum_float() {
    let (r, _) = inspect("smollm2-optimum");
    // 30 layers: 7 projections and 2 attention MatMuls each, the tied lm_head and the RoPE
    // frequencies.
    assert_eq!(by_op(&r["after"])["MatMul"], 30 * 9 + 2);
    float_form("smollm2-optimum");
}

#[test]
fn builder_int4_graphs() {
    for name in ["llama-builder-int4", "qwen3-builder-int4", "smollm2-builder-int4"] {
        let (r, c) = common_checks(name);
        let after = by_op(&r["after"]);
        let layers = c.layers as i64;
        assert_eq!(after["GroupQueryAttention"], layers, "{name}");
        assert_eq!(after.get("MatMul"), None, "{name}: float MatMuls left");
        assert!(after["MatMulNBits"] > 3 * layers, "{name}");
        assert!(r["gemms"].as_array().unwrap().iter().all(|g| g["op"] == "MatMulNBits"), "{name}");
    }
}

#[test]
fn qdq_forms_keep_their_quantize_dequantize_pairs() {
    for name in ["llama-qdq-per-tensor-s8", "llama-qdq-per-channel-u8", "qwen3-qdq-per-tensor-s8", "qwen3-quark-a8w8"] {
        let (r, c) = common_checks(name);
        let before = by_op(&r["before"]);
        let after = by_op(&r["after"]);
        // Import folds nothing of the quantisation: that is the rewrites' job.
        assert_eq!(after["QuantizeLinear"], before["QuantizeLinear"], "{name}");
        assert_eq!(after["DequantizeLinear"], before["DequantizeLinear"], "{name}");
        let layers = c.layers as i64;
        let quantized = r["gemms"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|g| g["rhs"].as_str().unwrap().starts_with("quantized weight"))
            .map(|g| g["count"].as_i64().unwrap())
            .sum::<i64>();
        // 7 projections per layer and an lm_head of its own; a tied one multiplies by the table's
        // Transpose, which the quantisers see as an activation (Q/DQ of a computed value).
        let head = i64::from(!c.tied_embeddings);
        assert_eq!(quantized, 7 * layers + head, "{name}: projections on int8 weights");
    }
}

#[test]
fn opset23_graphs_keep_the_fused_ops() {
    for name in ["llama-torch-dynamo-opset23", "qwen3-torch-dynamo-opset23"] {
        let (r, c) = common_checks(name);
        let after = by_op(&r["after"]);
        let layers = c.layers as i64;
        assert_eq!(after["Attention"], layers, "{name}");
        assert!(after["RMSNormalization"] > 2 * layers, "{name}");
        assert!(after["RotaryEmbedding"] >= 2 * layers, "{name}");
    }
}

#[test]
fn text_report_names_the_model_and_counts() {
    let out =
        Command::new(env!("CARGO_BIN_EXE_npuc")).arg("inspect").arg(common::model("llama-optimum")).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("llama-optimum/model.onnx"));
    let nodes: i64 = inspect("llama-optimum").1.values().sum();
    assert!(text.contains(&format!("nodes      {nodes} in the file")), "{text}");
    assert!(text.contains("unsupported ops: none"));
}

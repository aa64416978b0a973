//! Shared helpers for the end-to-end tests: where fixtures live and how to read a test case.

#![allow(dead_code)]

pub mod hybrid;
pub mod values;

use ir::Tensor;
use std::collections::HashMap;
use std::path::PathBuf;

/// The fixtures folder `make fixtures` writes (override with `NPUC_FIXTURES`). Tests fail, not
/// skip, when it is missing: a green run must mean the comparisons ran.
pub fn fixtures_dir() -> PathBuf {
    let dir = std::env::var_os("NPUC_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures"));
    assert!(dir.is_dir(), "fixtures folder {} is missing: run `make fixtures` (or `make test`)", dir.display());
    dir
}

/// The exporter corpus `make corpus` writes: models exported by the real tools, each with ONNX
/// Runtime's cases (`tools/export_corpus.py`).
pub fn corpus_dir() -> PathBuf {
    fixtures_dir().join("corpus")
}

/// A corpus entry's folder (`fixtures/corpus/<name>`), which holds its `model.onnx`.
pub fn fixture(name: &str) -> PathBuf {
    let d = corpus_dir().join(name);
    assert!(d.join("model.onnx").is_file(), "corpus entry {} is missing: run `make corpus`", d.display());
    d
}

/// A corpus entry's `model.onnx`.
pub fn model(name: &str) -> PathBuf {
    fixture(name).join("model.onnx")
}

/// What `fixtures/corpus/index.json` records about one entry.
pub struct Entry {
    pub name: String,
    /// `llama`, `qwen2`, `qwen3`, `phi3`, `mistral`, `gemma3` or `smollm2`.
    pub arch: String,
    /// `optimum`, `torch-dynamo`, `builder-int4`, `qdq-per-tensor-s8`, ...
    pub exporter: String,
    pub layers: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// The token the decode case feeds after the prefill case's prompt.
    pub decode_id: u64,
    /// The first greedy case: the prompt (also the prefill case's ids) and ONNX Runtime's 16
    /// greedy ids after it.
    pub prompt_ids: Vec<u64>,
    pub greedy_ids: Vec<u64>,
}

/// Every entry of `fixtures/corpus/index.json`, as the exporter tool wrote them.
pub fn index_entries() -> Vec<serde_json::Value> {
    let path = corpus_dir().join("index.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}: run `make corpus`", path.display()));
    let mut index: serde_json::Value = serde_json::from_str(&text).unwrap();
    std::mem::take(index["entries"].as_array_mut().unwrap())
}

/// Entry `name` of the corpus index, as written; panics naming it when absent.
pub fn index_entry(name: &str) -> serde_json::Value {
    let e = index_entries().into_iter().find(|e| e["name"] == name);
    e.unwrap_or_else(|| panic!("corpus index: no entry `{name}`: run `make corpus`"))
}

/// Reads entry `name` of the corpus index; panics naming it when the exporter made no file.
pub fn entry(name: &str) -> Entry {
    let e = index_entry(name);
    assert!(e["refused"].is_null(), "corpus entry {name}: the exporter refused: {}", e["refused"]);
    let uint = |k: &str| e[k].as_u64().unwrap_or_else(|| panic!("{name}: index has no `{k}`"));
    let ids = |v: &serde_json::Value| v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
    Entry {
        name: name.to_string(),
        arch: e["arch"].as_str().unwrap().to_string(),
        exporter: e["exporter"].as_str().unwrap().to_string(),
        layers: uint("layers") as usize,
        kv_heads: uint("kv_heads") as usize,
        head_dim: uint("head_dim") as usize,
        decode_id: uint("decode_id"),
        prompt_ids: ids(&e["cases"][0]["prompt_ids"]),
        greedy_ids: ids(&e["cases"][0]["greedy_ids"]),
    }
}

pub struct Case {
    pub inputs: HashMap<String, Tensor>,
    /// Expected outputs in graph output order.
    pub outputs: Vec<(String, Tensor)>,
}

/// Reads `input_<i>.pb` / `output_<j>.pb` of one case folder of a corpus entry.
pub fn read_case(entry: &str, case: &str) -> Case {
    let dir = fixture(entry).join(case);
    let (inputs, outputs) = frontend::read_test_case(&dir).unwrap_or_else(|e| panic!("{e}"));
    assert!(!inputs.is_empty() && !outputs.is_empty(), "case {} has no tensors", dir.display());
    Case { inputs, outputs }
}

/// max |a - b| and max |b| over two tensors of the same shape.
pub fn max_abs_diff(got: &Tensor, want: &Tensor) -> (f64, f64) {
    assert_eq!(got.shape, want.shape, "shapes differ");
    let (a, b) = (got.to_f64_vec(), want.to_f64_vec());
    let mut d: f64 = 0.0;
    let mut m: f64 = 0.0;
    for (x, y) in a.iter().zip(&b) {
        d = d.max((x - y).abs());
        m = m.max(y.abs());
    }
    (d, m)
}

/// Writes a copy of `bundle` at `dir` with the same header, without the tensors `drop` picks, and
/// with the model weights `add` (name, stored as their model dtype): a bundle as an older
/// compiler would have written it.
pub fn rewrite_bundle(
    bundle: &runtime::bundle::Bundle,
    dir: &std::path::Path,
    drop: impl Fn(&str) -> bool,
    add: &[&ir::Weight],
) {
    use runtime::bundle::Dtype;
    let mut writer = writer_like(bundle, dir);
    for t in bundle.tensors().filter(|t| !drop(t.name)) {
        writer.add_tensor(t.name, t.dtype, t.shape, t.bytes, t.metadata).unwrap();
    }
    for w in add {
        let dtype = match w.dtype {
            ir::DType::U8 => Dtype::U8,
            ir::DType::I8 => Dtype::I8,
            ir::DType::F32 => Dtype::F32,
            other => panic!("{}: {other:?}", w.name),
        };
        writer.add_tensor(&w.name, dtype, &w.shape, &w.bytes, None).unwrap_or_else(|e| panic!("{}: {e}", w.name));
    }
    writer.finish().unwrap();
}

/// Writes a copy of `bundle` at `dir` — tensors and files — with the files `add` (path, bytes)
/// besides: a bundle that carries artifacts its compiler could not make here.
pub fn copy_bundle_adding_files(bundle: &runtime::bundle::Bundle, dir: &std::path::Path, add: &[(String, Vec<u8>)]) {
    let mut writer = writer_like(bundle, dir);
    for t in bundle.tensors() {
        writer.add_tensor(t.name, t.dtype, t.shape, t.bytes, t.metadata).unwrap();
    }
    for f in bundle.manifest().files.iter().filter(|f| f.path != "weights.safetensors") {
        writer.add_file(&f.path, &bundle.read_file(&f.path).unwrap()).unwrap();
    }
    for (path, bytes) in add {
        writer.add_file(path, bytes).unwrap();
    }
    writer.finish().unwrap();
}

/// A writer for a bundle at `dir` with `bundle`'s header.
fn writer_like(bundle: &runtime::bundle::Bundle, dir: &std::path::Path) -> runtime::bundle::BundleWriter {
    let header = runtime::bundle::ManifestHeader {
        compiler_version: bundle.manifest().compiler_version.clone(),
        target: bundle.target(),
        model: bundle.model().clone(),
        program: bundle.program().clone(),
    };
    runtime::bundle::BundleWriter::create(dir, header).unwrap()
}

/// The tiny random-weight entries one exporter made (every architecture but SmolLM2, which is
/// 135M parameters), in index order; the corpus test holds each refusal to a known reason.
pub fn tiny_entries(exporter: &str) -> Vec<String> {
    let names: Vec<String> = index_entries()
        .iter()
        .filter(|e| e["exporter"] == exporter && e["arch"] != "smollm2" && e["refused"].is_null())
        .map(|e| e["name"].as_str().unwrap().to_string())
        .collect();
    assert!(!names.is_empty(), "corpus index: no entry exported by `{exporter}`");
    names
}

/// The checkpoint's configuration, from the transformers `config.json` the corpus exported
/// (`fixtures/corpus/<arch>-hf`): the facts the exporters started from.
pub struct Config {
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
    pub vocab: usize,
    pub tied_embeddings: bool,
    pub rms_eps: f64,
}

/// The configuration of the checkpoint entry `name` was exported from.
pub fn config(name: &str) -> Config {
    let arch = entry(name).arch;
    let path = corpus_dir().join(format!("{arch}-hf")).join("config.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let c = if v["text_config"].is_object() { &v["text_config"] } else { &v };
    let uint = |k: &str| c[k].as_u64().unwrap_or_else(|| panic!("{}: no `{k}`", path.display())) as usize;
    let (hidden, heads) = (uint("hidden_size"), uint("num_attention_heads"));
    Config {
        layers: uint("num_hidden_layers"),
        hidden,
        heads,
        kv_heads: uint("num_key_value_heads"),
        head_dim: c["head_dim"].as_u64().map_or(hidden / heads, |d| d as usize),
        intermediate: uint("intermediate_size"),
        vocab: uint("vocab_size"),
        // transformers' default when the config leaves it out.
        tied_embeddings: c["tie_word_embeddings"].as_bool().unwrap_or(true),
        rms_eps: c["rms_norm_eps"].as_f64().unwrap(),
    }
}

/// The graph input names of a corpus entry, as the index records them.
pub fn entry_inputs(name: &str) -> Vec<String> {
    let e = index_entry(name);
    e["inputs"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect()
}

/// Largest |got − want| over the largest |want| (logits, states).
pub fn relative_error(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len(), "compared slices differ in length");
    let max = want.iter().fold(0f64, |m, &v| m.max(f64::from(v).abs()));
    got.iter().zip(want).fold(0f64, |m, (&a, &b)| m.max((f64::from(a) - f64::from(b)).abs())) / max
}

//! Corpus access for the rule-family tests: import an entry of `fixtures/corpus` (a model a real
//! exporter wrote: optimum-onnx, torch dynamo, the onnxruntime-genai builder, onnxruntime's
//! quantize_static, AMD Quark), read what `fixtures/corpus/index.json` says of it, rewrite it, and
//! check the rewritten program against ONNX Runtime's recorded outputs on that file with the
//! reference evaluator. Facts about an entry's graph (which products are packed) are read from the
//! graph itself. For the small graphs the tests write by hand: the two builder set-ups they use
//! (`net`, `hand_built`), deterministic inputs, and the comparison of a rewritten graph with its
//! original.

#![allow(dead_code)]

use ir::build::{GraphBuilder, NodeBuilder, ValueType};
use ir::{DType, Dim, Domain, Graph, Node, Tensor, ValueDef, ValueId};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::OnceLock;

pub fn fixtures_dir() -> PathBuf {
    let dir = std::env::var_os("NPUC_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures"));
    assert!(dir.is_dir(), "fixtures folder {} is missing: run `make fixtures`", dir.display());
    dir
}

/// The folder of corpus entry `name`, after checking that the index lists it with a file.
pub fn entry_dir(name: &str) -> PathBuf {
    let _ = meta(name);
    let dir = fixtures_dir().join("corpus").join(name);
    assert!(dir.join("model.onnx").is_file(), "corpus entry {name}: {} is missing: run `make corpus`", dir.display());
    dir
}

/// Imports `fixtures/corpus/<name>/model.onnx`.
pub fn import(name: &str) -> Graph {
    let path = entry_dir(name).join("model.onnx");
    frontend::import_file(&path).unwrap_or_else(|e| panic!("corpus entry {name}: {e}")).graph
}

/// One entry of `fixtures/corpus/index.json`, as written by `tools/export_corpus.py`.
#[derive(serde::Deserialize)]
struct IndexEntry {
    name: String,
    arch: String,
    layers: Option<usize>,
    refused: Option<String>,
}

#[derive(serde::Deserialize)]
struct Index {
    entries: Vec<IndexEntry>,
}

fn index() -> &'static Index {
    static INDEX: OnceLock<Index> = OnceLock::new();
    INDEX.get_or_init(|| {
        let path = fixtures_dir().join("corpus/index.json");
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}: run `make corpus`", path.display()));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    })
}

/// What the rule-family tests read from an entry of the corpus index.
pub struct Meta {
    /// `llama`, `qwen2`, `qwen3`, `phi3`, `mistral`, `gemma3` or `smollm2`.
    pub arch: String,
    /// Decoder layers.
    pub layers: usize,
}

/// Reads entry `name` of `fixtures/corpus/index.json`; panics naming the entry when the index has
/// no such entry or the exporter refused it.
pub fn meta(name: &str) -> Meta {
    let e = index()
        .entries
        .iter()
        .find(|e| e.name == name)
        .unwrap_or_else(|| panic!("corpus entry {name} is not in fixtures/corpus/index.json"));
    if let Some(why) = &e.refused {
        panic!("corpus entry {name}: the exporter refused it ({why}), so it has no model");
    }
    let layers = e.layers.unwrap_or_else(|| panic!("corpus entry {name}: no layers in the index"));
    Meta { arch: e.arch.clone(), layers }
}

/// Reads the inputs and expected outputs (ONNX Runtime's, on the entry's file) of one recorded
/// case, `prefill` or `decode`.
pub fn case(name: &str, case: &str) -> (HashMap<String, Tensor>, Vec<(String, Tensor)>) {
    frontend::read_test_case(&entry_dir(name).join(case)).unwrap_or_else(|e| panic!("corpus entry {name}/{case}: {e}"))
}

/// Runs `g` on both recorded cases of entry `name` and returns the worst max|Δ|/max|ref| over all
/// float outputs.
pub fn worst_relative_error(g: &Graph, name: &str) -> f64 {
    let mut worst = 0.0f64;
    for c in ["prefill", "decode"] {
        let (inputs, outputs) = case(name, c);
        let got = ir::run::run_graph(g, &inputs).unwrap_or_else(|e| panic!("{name}/{c}: {e}"));
        for (output, want) in outputs {
            let t = &got[&output];
            assert_eq!(t.shape, want.shape, "{name}/{c}: {output}");
            worst = worst.max(relative_difference(t, &want));
        }
    }
    worst
}

/// max|a − b| / max|b| (max|a − b| where b is all zeros).
pub fn relative_difference(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (a.to_f64_vec(), b.to_f64_vec());
    let m = b.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let d = a.iter().zip(&b).fold(0.0f64, |d, (x, y)| d.max((x - y).abs()));
    if m > 0.0 {
        d / m
    } else {
        d
    }
}

// ---- what an entry's graph says of itself ----

/// The node defining `v`, if a node does.
pub fn producer(g: &Graph, v: ValueId) -> Option<&Node> {
    match g.value(v).def {
        ValueDef::Node { node, .. } => Some(g.node(node)),
        _ => None,
    }
}

/// The nodes reading `v`.
pub fn readers(g: &Graph, v: ValueId) -> Vec<&Node> {
    g.nodes.iter().filter(|n| n.inputs.contains(&Some(v))).collect()
}

/// How many projections one weight product of an exporter's graph computes: 3 where a
/// GroupQueryAttention reads its output as packed q|k|v (no separate key input), the number of
/// parts where a Split cuts its output, else 1.
pub fn projections_of(g: &Graph, product: &Node) -> usize {
    let out = product.outputs[0];
    let users = readers(g, out);
    if users.iter().any(|n| reads_packed_qkv(n) && n.inputs[0] == Some(out)) {
        return 3;
    }
    match users.as_slice() {
        [split] if split.op == "Split" => split.outputs.len(),
        _ => 1,
    }
}

/// The WGemms the host cost model makes of a builder graph's MatMulNBits, as the `weight-only`
/// family's contract says: a packed product GroupQueryAttention reads whole stays one WGemm, one a
/// Split cuts becomes a WGemm per part.
pub fn host_wgemms(g: &Graph) -> usize {
    let split = |n: &Node| readers(g, n.outputs[0]).iter().any(|r| r.op == "Split");
    g.nodes.iter().filter(|n| n.op == "MatMulNBits").map(|n| if split(n) { projections_of(g, n) } else { 1 }).sum()
}

/// Whether `n` is a GroupQueryAttention reading q|k|v packed in its query input (no key input).
fn reads_packed_qkv(n: &Node) -> bool {
    n.op == "GroupQueryAttention" && n.inputs.get(1).copied().flatten().is_none()
}

/// Number of GroupQueryAttention nodes that read q|k|v packed in one input.
pub fn packed_qkv_attentions(g: &Graph) -> usize {
    g.nodes.iter().filter(|n| reads_packed_qkv(n)).count()
}

/// Number of nodes with op `op` in `g`.
pub fn count(g: &Graph, op: &str) -> usize {
    g.nodes.iter().filter(|n| n.op == op).count()
}

// ---- hand-built graphs ----

/// A hand-built graph called `net` whose ONNX nodes carry `onnx_opset`.
pub fn net(onnx_opset: i64) -> GraphBuilder {
    GraphBuilder::new("net").with_opset(Domain::Onnx, onnx_opset)
}

/// An f32 value of known dims.
pub fn float(dims: &[usize]) -> ValueType {
    ValueType::known(DType::F32, dims)
}

/// A hand-built graph called `hand-built` whose nodes of every domain carry opset 21.
pub fn hand_built() -> GraphBuilder {
    GraphBuilder::new("hand-built")
        .with_opset(Domain::Onnx, 21)
        .with_opset(Domain::Microsoft, 21)
        .with_opset(Domain::Npuc, 21)
}

/// A `dtype` activation `[rows, n]`, its row count the symbol `rows`.
pub fn rows(dtype: DType, n: usize) -> ValueType {
    ValueType::new(dtype, vec![Dim::sym("rows"), Dim::known(n as i64)])
}

/// A node of `domain::op` with one output of type `ty`, both named `<op>_<node index>`.
pub fn indexed_node<'b>(b: &'b mut GraphBuilder, domain: Domain, op: &'static str, ty: ValueType) -> NodeBuilder<'b> {
    let name = format!("{op}_{}", b.node_count());
    b.node(domain, op).name(&name).output(&name, ty)
}

/// Deterministic values for every input of a hand-built graph (all dims known): the integers
/// `ints` gives for an input, else floats in [−2, 2) from one xorshift stream in input order.
pub fn random_feeds(g: &Graph, ints: &HashMap<ValueId, Vec<i64>>) -> HashMap<String, Tensor> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
    };
    g.inputs
        .iter()
        .map(|&i| {
            let v = g.value(i);
            let shape: Vec<usize> = v.shape.iter().map(|d| d.as_known().unwrap() as usize).collect();
            let n = shape.iter().product();
            let t = match ints.get(&i) {
                Some(values) => Tensor::from_i64(v.dtype, shape, values.clone()),
                None => Tensor::from_f32(DType::F32, shape, (0..n).map(|_| next()).collect()),
            };
            (v.name.clone(), t)
        })
        .collect()
}

/// Worst max|Δ|/max|ref| of `after`'s outputs against `before`'s on the [`random_feeds`] of
/// `before` with `ints`.
pub fn worst_difference(before: &Graph, after: &Graph, ints: &HashMap<ValueId, Vec<i64>>) -> f64 {
    let feeds = random_feeds(before, ints);
    let want = ir::run::run_graph(before, &feeds).unwrap();
    let got = ir::run::run_graph(after, &feeds).unwrap();
    let mut worst = 0.0f64;
    for &o in &before.outputs {
        let name = &before.value(o).name;
        assert_eq!(got[name].shape, want[name].shape, "{name}");
        worst = worst.max(relative_difference(&got[name], &want[name]));
    }
    worst
}

/// A deterministic xorshift generator for the property-style tests.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub fn int(&mut self, lo: i64, hi: i64) -> i64 {
        lo + self.below((hi - lo + 1) as u64) as i64
    }

    /// Codes drawn uniformly from an integer dtype's range.
    pub fn codes(&mut self, dtype: ir::DType, n: usize) -> Vec<i64> {
        let (lo, hi) = dtype.int_range().unwrap();
        (0..n).map(|_| self.int(lo, hi)).collect()
    }

    /// A power of two in [2^lo, 2^hi].
    pub fn pow2(&mut self, lo: i32, hi: i32) -> f32 {
        2f32.powi(self.int(lo as i64, hi as i64) as i32)
    }

    /// Floats on a grid of 10⁴ steps in [lo, hi).
    pub fn floats(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| lo + (hi - lo) * (self.next() % 10_000) as f32 / 10_000.0).collect()
    }
}

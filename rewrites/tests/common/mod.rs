//! Fixture access for the rule-family tests: import a fixture, read what its `meta.json` says,
//! rewrite it, and check the rewritten program against ONNX Runtime's recorded outputs with the
//! reference evaluator. For the small graphs the tests write by hand: the two builder set-ups they
//! use (`net`, `hand_built`), deterministic inputs, and the comparison of a rewritten graph with
//! its original.

#![allow(dead_code)]

use ir::build::{GraphBuilder, NodeBuilder, ValueType};
use ir::{DType, Dim, Domain, Graph, Tensor, ValueId};
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

/// What the rule-family tests read from a fixture's `meta.json`.
#[derive(serde::Deserialize)]
pub struct Meta {
    /// `llama` or `qwen3`.
    pub arch: String,
    /// Decoder layers.
    pub layers: usize,
    /// The weight-only quantisation of onnxruntime-genai's forms (f2); absent in the others.
    pub quant: Option<Quant>,
}

/// How onnxruntime-genai packed a form's projections.
#[derive(serde::Deserialize)]
pub struct Quant {
    /// q, k and v are one MatMulNBits over a `qkv_proj` weight.
    pub packed_qkv: bool,
    /// gate and up are one MatMulNBits over a `gate_up_proj` weight.
    pub packed_gate_up: bool,
}

/// Reads `fixtures/<name>/meta.json`.
pub fn meta(name: &str) -> Meta {
    let path = fixtures_dir().join(name).join("meta.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
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
        let (x, y) = (got[name].to_f64_vec(), want[name].to_f64_vec());
        assert_eq!(got[name].shape, want[name].shape, "{name}");
        let m = y.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        let d = x.iter().zip(&y).fold(0.0f64, |d, (p, q)| d.max((p - q).abs()));
        worst = worst.max(d / m);
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

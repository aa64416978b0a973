//! Shared helpers for the end-to-end tests: where fixtures live and how to read a test case.

#![allow(dead_code)]

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

pub fn fixture(name: &str) -> PathBuf {
    let d = fixtures_dir().join(name);
    assert!(d.join("model.onnx").is_file(), "fixture {} is missing: run `make fixtures`", d.display());
    d
}

pub struct Case {
    pub inputs: HashMap<String, Tensor>,
    /// Expected outputs in graph output order.
    pub outputs: Vec<(String, Tensor)>,
}

/// Reads `input_<i>.pb` / `output_<j>.pb` of one case folder.
pub fn read_case(fixture: &str, case: &str) -> Case {
    let dir = fixtures_dir().join(fixture).join(case);
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

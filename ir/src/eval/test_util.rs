//! Helpers for the evaluator's unit tests: building tensors and running one op.

use super::{eval_op, EvalError};
use crate::attr::{Attr, Attrs};
use crate::dtype::DType;
use crate::op::{Domain, OpRef};
use crate::tensor::{Data, Tensor};

pub(crate) fn f32t(shape: &[usize], values: &[f32]) -> Tensor {
    Tensor::from_f32(DType::F32, shape.to_vec(), values.to_vec())
}

pub(crate) fn i64t(shape: &[usize], values: &[i64]) -> Tensor {
    Tensor::from_i64(DType::I64, shape.to_vec(), values.to_vec())
}

pub(crate) fn typed(dtype: DType, shape: &[usize], values: &[i64]) -> Tensor {
    Tensor::from_i64(dtype, shape.to_vec(), values.to_vec())
}

pub(crate) fn booleans(shape: &[usize], values: &[bool]) -> Tensor {
    typed(DType::Bool, shape, &values.iter().map(|&b| b as i64).collect::<Vec<_>>())
}

pub(crate) fn attrs(list: &[(&str, Attr)]) -> Attrs {
    let mut a = Attrs::default();
    for (name, value) in list {
        a.set(name, value.clone());
    }
    a
}

/// Runs one node of the default domain at `opset`.
pub(crate) fn run_at(
    op: &str,
    opset: i64,
    a: &[(&str, Attr)],
    inputs: &[Option<&Tensor>],
    outputs: usize,
) -> Result<Vec<Tensor>, EvalError> {
    run_in(Domain::Onnx, op, opset, a, inputs, outputs)
}

/// Runs one node of the default domain at opset 23.
pub(crate) fn run(
    op: &str,
    a: &[(&str, Attr)],
    inputs: &[Option<&Tensor>],
    outputs: usize,
) -> Result<Vec<Tensor>, EvalError> {
    run_at(op, 23, a, inputs, outputs)
}

/// Runs one com.microsoft node.
pub(crate) fn run_ms(
    op: &str,
    a: &[(&str, Attr)],
    inputs: &[Option<&Tensor>],
    outputs: usize,
) -> Result<Vec<Tensor>, EvalError> {
    run_in(Domain::Microsoft, op, 1, a, inputs, outputs)
}

fn run_in(
    domain: Domain,
    op: &str,
    opset: i64,
    a: &[(&str, Attr)],
    inputs: &[Option<&Tensor>],
    outputs: usize,
) -> Result<Vec<Tensor>, EvalError> {
    let attrs = attrs(a);
    let op_ref = OpRef { node: "n", domain, op, opset, attrs: &attrs };
    eval_op(&op_ref, inputs, outputs)
}

/// Runs a single-output node whose inputs are all present.
pub(crate) fn run1(op: &str, a: &[(&str, Attr)], inputs: &[&Tensor]) -> Tensor {
    let inputs: Vec<Option<&Tensor>> = inputs.iter().map(|&t| Some(t)).collect();
    match run(op, a, &inputs, 1) {
        Ok(mut v) => v.remove(0),
        Err(e) => panic!("{op} failed: {e}"),
    }
}

pub(crate) fn f32s(t: &Tensor) -> Vec<f32> {
    match &t.data {
        Data::F32(v) => v.clone(),
        other => panic!("expected f32 storage, got {other:?}"),
    }
}

pub(crate) fn ints(t: &Tensor) -> Vec<i64> {
    t.as_i64().expect("integer storage").to_vec()
}

/// Asserts element-wise closeness within `tol` (absolute) and equal lengths.
#[track_caller]
pub(crate) fn assert_close(actual: &[f32], expected: &[f32], tol: f32) {
    assert_eq!(actual.len(), expected.len(), "lengths differ: {actual:?} vs {expected:?}");
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        assert!((a - e).abs() <= tol, "element {i}: {a} vs {e} (tol {tol})\nactual {actual:?}\nexpected {expected:?}");
    }
}

/// The message of an evaluation error, for asserting on.
pub(crate) fn err_msg(r: Result<Vec<Tensor>, EvalError>) -> String {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e.msg,
    }
}

/// Deterministic test values `((7i + 5·seed) mod 23 - 11) / 16`: exact in f32, reproduced by the
/// scripts that produced the onnxruntime reference outputs.
pub(crate) fn pattern(n: usize, seed: usize) -> Vec<f32> {
    (0..n).map(|i| (((i * 7 + seed * 5) % 23) as f32 - 11.0) / 16.0).collect()
}

/// Deterministic bytes `(37i + 11·seed) mod 256`.
pub(crate) fn byte_pattern(n: usize, seed: usize) -> Vec<i64> {
    (0..n).map(|i| ((i * 37 + seed * 11) % 256) as i64).collect()
}

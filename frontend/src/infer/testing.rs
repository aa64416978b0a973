//! Helpers for the families' tests: a node to infer, values of symbolic shape, constants, and
//! values whose contents are symbolic sizes.

use super::{infer_node, Ctx, Info, NodeCtx};
use crate::error::ErrorKind;
use ir::{Attr, Attrs, DType, Dim, Domain, Tensor};

/// A node to infer: ai.onnx at opset 23 with one output unless told otherwise.
pub(super) struct TestNode {
    name: &'static str,
    op: &'static str,
    domain: Domain,
    opset: i64,
    attrs: Attrs,
    outputs: usize,
}

impl TestNode {
    pub fn new(name: &'static str, op: &'static str) -> TestNode {
        TestNode { name, op, domain: Domain::Onnx, opset: 23, attrs: Attrs::default(), outputs: 1 }
    }

    /// A com.microsoft op (onnxruntime's contrib ops, opset 1).
    pub fn contrib(name: &'static str, op: &'static str) -> TestNode {
        TestNode { domain: Domain::Microsoft, opset: 1, ..TestNode::new(name, op) }
    }

    pub fn opset(mut self, opset: i64) -> TestNode {
        self.opset = opset;
        self
    }

    pub fn outputs(mut self, outputs: usize) -> TestNode {
        self.outputs = outputs;
        self
    }

    pub fn attr(mut self, name: &str, value: Attr) -> TestNode {
        self.attrs.set(name, value);
        self
    }

    pub fn int(self, name: &str, value: i64) -> TestNode {
        self.attr(name, Attr::Int(value))
    }

    pub fn ints(self, name: &str, values: &[i64]) -> TestNode {
        self.attr(name, Attr::Ints(values.to_vec()))
    }

    /// Inference in `ctx`; `None` inputs are optional inputs left out.
    pub fn infer(&self, ctx: &mut Ctx, inputs: &[Option<&Info>]) -> Result<Vec<Info>, ErrorKind> {
        let n = NodeCtx {
            name: self.name,
            domain: self.domain,
            op: self.op,
            opset: self.opset,
            attrs: &self.attrs,
            num_outputs: self.outputs,
        };
        infer_node(&n, ctx, inputs)
    }

    /// Inference with every input given, in a fresh context.
    pub fn run(&self, inputs: &[&Info]) -> Result<Vec<Info>, ErrorKind> {
        let inputs: Vec<Option<&Info>> = inputs.iter().map(|&i| Some(i)).collect();
        self.infer(&mut Ctx::default(), &inputs)
    }

    /// The output types (see [`typed`]) of an inference that must succeed.
    pub fn types(&self, inputs: &[&Info]) -> Vec<String> {
        match self.run(inputs) {
            Ok(outs) => outs.iter().map(typed).collect(),
            Err(e) => panic!("{} must infer, but: {e}", self.op),
        }
    }

    /// The error text of an inference that must fail.
    pub fn refusal(&self, inputs: &[&Info]) -> String {
        refusal(self.run(inputs))
    }
}

/// The error text of an inference that must fail.
pub(super) fn refusal(result: Result<Vec<Info>, ErrorKind>) -> String {
    match result {
        Ok(outs) => panic!("inferred {:?} where it must refuse", outs.iter().map(typed).collect::<Vec<_>>()),
        Err(e) => e.to_string(),
    }
}

/// A value of unknown contents; each dim is a number or a symbol's name.
pub(super) fn value(dtype: DType, dims: &[&str]) -> Info {
    Info::new(dtype, dims.iter().map(|d| d.parse().map(Dim::known).unwrap_or_else(|_| Dim::sym(d))).collect())
}

/// A constant int64 vector.
pub(super) fn ints(values: &[i64]) -> Info {
    Info::constant(Tensor::from_i64(DType::I64, vec![values.len()], values.to_vec()))
}

/// A constant int64 scalar.
pub(super) fn int(value: i64) -> Info {
    Info::constant(Tensor::scalar_i64(value))
}

/// An int64 vector whose values are these sizes (what `Shape` gives).
pub(super) fn sizes(dims: &[Dim]) -> Info {
    Info::from_dims(DType::I64, dims.to_vec(), false)
}

/// An int64 scalar whose value is this size (what `Gather(Shape(x), i)` gives).
pub(super) fn size(dim: Dim) -> Info {
    Info::from_dims(DType::I64, vec![dim], true)
}

pub(super) fn sym(name: &str) -> Dim {
    Dim::sym(name)
}

/// `a + b`.
pub(super) fn sum(a: &str, b: &str) -> Dim {
    Dim::sym(a).add(&Dim::sym(b)).unwrap()
}

/// `dtype[shape]`, as the printer writes a value's type.
pub(super) fn typed(info: &Info) -> String {
    format!("{}{}", info.dtype, ir::dim::shape_to_string(&info.shape))
}

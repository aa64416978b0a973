//! Import errors. Every variant names the node, tensor or file it is about; the model's path is
//! added by [`Error`].

use std::path::PathBuf;

/// An import failure, with the model file it happened in.
#[derive(Debug, thiserror::Error)]
#[error("{}: {kind}", path.display())]
pub struct Error {
    pub path: PathBuf,
    pub kind: ErrorKind,
}

#[derive(Debug, thiserror::Error)]
pub enum ErrorKind {
    #[error("cannot read the model: {0}")]
    Io(std::io::Error),
    #[error("not an ONNX model (protobuf decoding failed: {0})")]
    Decode(String),
    #[error("the model has no graph")]
    NoGraph,
    #[error("the model declares {0}; npuc reads ONNX IR versions 1 to {max}", max = crate::import::IR_VERSION)]
    IrVersion(String),
    #[error("the model defines local functions ({0}), which npuc does not import")]
    LocalFunctions(String),
    #[error("the model imports opset {domain} version {version}; npuc imports {supported}")]
    Opset { domain: String, version: i64, supported: &'static str },
    #[error("node `{node}`: op {op} as defined since ai.onnx opset {since} (the model imports {opset}) differs from the definitions npuc implements ({implemented})")]
    OpVersion { node: String, op: String, since: i64, opset: i64, implemented: String },
    #[error("node `{node}`: op {domain}::{op} (opset {opset}) is outside npuc's vocabulary")]
    UnknownOp { node: String, op: String, domain: String, opset: i64 },
    #[error("node `{node}` ({op}) has {given} {what}; the op takes {expected}")]
    Arity { node: String, op: String, what: &'static str, given: usize, expected: String },
    #[error("value name `{0}` is defined more than once")]
    DuplicateName(String),
    #[error("node `{node}` reads `{input}`, which no node, input or initializer defines")]
    UndefinedInput { node: String, input: String },
    #[error("the graph has a cycle through nodes {0}")]
    Cycle(String),
    #[error("graph output `{0}` is not produced by any node, input or initializer")]
    OutputNotProduced(String),
    #[error("node `{node}` ({op}): dtype mismatch: {detail}")]
    Dtype { node: String, op: String, detail: String },
    #[error("node `{node}` ({op}): shape mismatch: {detail}")]
    Shape { node: String, op: String, detail: String },
    #[error("node `{node}` ({op}): {detail}")]
    BadNode { node: String, op: String, detail: String },
    #[error("tensor `{tensor}`: {detail}")]
    Tensor { tensor: String, detail: String },
    #[error("tensor `{tensor}`: external data file `{file}`: {detail}")]
    ExternalData { tensor: String, file: String, detail: String },
    #[error("value `{value}`: {detail}")]
    Type { value: String, detail: String },
    #[error("node `{node}` ({op}): folding its constant inputs failed: {detail}")]
    Fold { node: String, op: String, detail: String },
}

impl ErrorKind {
    pub(crate) fn at(self, path: &std::path::Path) -> Error {
        Error { path: path.to_path_buf(), kind: self }
    }
}

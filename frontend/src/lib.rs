//! The ONNX frontend: the only crate that knows protobuf.
//!
//! [`import_file`] memory-maps a model, decodes it, resolves external data inside the model's
//! folder, checks it (vocabulary, arity, names, order, dtypes, shapes), infers symbolic shapes,
//! folds constants and shape arithmetic, and returns the live computation as an [`ir::Graph`]
//! together with an [`ImportReport`] of what it did.

pub mod error;
pub mod import;
pub mod infer;
pub mod tensors;
pub mod versions;

pub mod proto {
    //! Types generated from `proto/onnx.proto`.
    #![allow(clippy::all, missing_docs)]
    include!(concat!(env!("OUT_DIR"), "/onnx.rs"));
}

pub use error::{Error, ErrorKind};
pub use import::{import, import_file, load, ImportReport, Imported, OnnxModel};
pub use tensors::{read_tensor_file, read_test_case};

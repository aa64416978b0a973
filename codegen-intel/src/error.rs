//! The errors of compiling for Intel NPUs, each naming the node, value or weight it is about.

use crate::xml::NetError;

#[derive(Debug, thiserror::Error)]
pub enum IntelError {
    /// A node the target cannot take, and why.
    #[error("node `{node}`: {msg}")]
    Unsupported { node: String, msg: String },
    /// A node whose lowering into the IR failed.
    #[error("node `{node}`: {error}")]
    Lowering { node: String, error: Box<LowerError> },
    /// A constant a node reads that cannot be computed at compile time.
    #[error("node `{node}`: {error}")]
    Constant { node: String, error: ConstantError },
    #[error("node `{node}` reads weight `{weight}` with asymmetric zero points, which the NPU does not support (re-quantise symmetrically instead of rejecting to compile it)")]
    Asymmetric { node: String, weight: String },
    #[error("value `{value}`: {msg}")]
    Shape { value: String, msg: String },
    #[error("the program has {0}")]
    Structure(String),
    #[error("unknown weight format `{0}` (int4, int8, f16)")]
    UnknownWeightFormat(String),
}

/// Why a node has no lowering; [`IntelError::Lowering`] names the node.
#[derive(Debug, thiserror::Error)]
pub enum LowerError {
    #[error("input {0} is missing")]
    MissingInput(usize),
    /// An input that must be known at compile time and is not (`starts`, `axes`, ...).
    #[error("non-constant {0}")]
    NotConstant(&'static str),
    #[error(transparent)]
    Attr(#[from] ir::attr::AttrError),
    #[error(transparent)]
    Tensor(#[from] ir::tensor::TensorError),
    #[error(transparent)]
    Constant(#[from] ConstantError),
    #[error(transparent)]
    Net(#[from] NetError),
    /// An input of the node that could not be lowered (a value, or the node computing it).
    #[error(transparent)]
    Input(Box<IntelError>),
    /// A form of the op the lowering does not take, described.
    #[error("{0}")]
    Form(String),
}

impl From<IntelError> for LowerError {
    fn from(e: IntelError) -> LowerError {
        LowerError::Input(Box::new(e))
    }
}

/// Why a value is not a constant the compiler can compute.
#[derive(Debug, thiserror::Error)]
pub enum ConstantError {
    #[error("`{value}` is not a constant")]
    NotConstant { value: String },
    #[error(transparent)]
    Tensor(#[from] ir::tensor::TensorError),
    #[error(transparent)]
    Eval(#[from] ir::eval::EvalError),
}

//! Errors of the host executor. Each names the node, value or weight it concerns.

use super::program::NodeInfo;
use crate::kernels::KernelError;
use crate::kvcache::KvError;

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The program JSON does not have the `npuc-program/1` shape; `path` says where.
    #[error("program {path}: {problem}")]
    Program { path: String, problem: String },
    /// A node whose op the executor has no implementation for (refused at load).
    #[error("node `{node}`: op {op} is not supported by the host executor yet")]
    UnsupportedOp { node: String, op: String },
    /// A node of a supported op in a form the executor does not run (refused at load), or whose
    /// shapes do not fit once the sequence length is known.
    #[error("node `{node}` ({op}): {problem}")]
    Node { node: String, op: String, problem: String },
    /// A value the executor cannot hold or supply.
    #[error("value `{value}`: {problem}")]
    Value { value: String, problem: String },
    /// A step that would run past the context the executor was created for.
    #[error("{tokens} new tokens at position {position} exceed the context of {max_context} tokens")]
    ContextFull { tokens: usize, position: usize, max_context: usize },
    /// The device a GEMM was offloaded to failed.
    #[error("node `{node}`: the offloaded GEMM failed: {source}")]
    Offload { node: String, source: super::OffloadError },
    /// A chain the offload computes does not fit the program, or it returned the wrong size.
    #[error("the offload's chain at QGemm `{qgemm}`: {problem}")]
    Chain { qgemm: String, problem: String },
    /// Rewinding a sequence of a program with recurrent state, which holds the state after the
    /// sequence's last token only.
    #[error("{seq}: {action} is refused: the program keeps recurrent state (conv/linear-attention) for the sequence's last position only")]
    RecurrentState { seq: crate::kvcache::SeqId, action: &'static str },
    /// A step with no token.
    #[error("a step needs at least one token")]
    EmptyStep,
    #[error(transparent)]
    Kv(#[from] KvError),
    #[error(transparent)]
    Kernel(#[from] KernelError),
}

pub(crate) fn node_err(node: &str, op: &str, problem: impl Into<String>) -> ExecError {
    ExecError::Node { node: node.to_string(), op: op.to_string(), problem: problem.into() }
}

/// The errors of `node`: [`node_err`] with its name and op, for `map_err` and `?`.
pub(crate) fn node_fail<E: std::fmt::Display>(node: &NodeInfo) -> impl Fn(E) -> ExecError + '_ {
    move |problem| node_err(&node.name, &node.op, problem.to_string())
}

pub(crate) fn value_err(value: &str, problem: impl Into<String>) -> ExecError {
    ExecError::Value { value: value.to_string(), problem: problem.into() }
}

//! npuc's typed graph IR.
//!
//! - [`dtype`], [`tensor`]: element types and concrete tensors.
//! - [`dim`]: symbolic dimensions (polynomials over named sizes such as `batch` or `past`).
//! - [`graph`]: the typed DAG every pass works on; weights are leaves that name bytes in a
//!   [`weights::WeightStore`], never copies of them.
//! - [`print`]: the stable, diff-friendly text form every snapshot uses.
//! - [`eval`]: the reference evaluator, the Rust-side oracle for every pass; [`run`] runs a
//!   whole graph with it; [`fused`] gives npuc's fused ops their exact semantics.
//! - [`egraph`]: the egg e-graph form of a graph and the way back.
//! - [`build`]: a checked builder for graphs made by hand (tests, passes that synthesise graphs).

pub mod attr;
pub mod build;
pub mod dim;
pub mod dtype;
pub mod egraph;
pub mod eval;
pub mod fp16sim;
pub mod fused;
pub mod gated_norms;
pub mod graph;
pub mod integer_gate;
pub mod norm_codes;
pub mod op;
pub mod pinned_gate;
pub mod pinned_norm;
pub mod print;
pub mod run;
pub mod tensor;
pub mod weights;

pub use attr::{Attr, Attrs};
pub use dim::Dim;
pub use dtype::DType;
pub use graph::{Graph, Node, NodeId, Value, ValueDef, ValueId};
pub use op::{Domain, OpRef};
pub use tensor::{Data, Tensor};
pub use weights::{Weight, WeightId, WeightStore};

//! The pass pipeline.
//!
//! A [`Pass`] has a name, a contract (its doc comment, also returned by [`Pass::contract`]) and a
//! `run`. A [`Target`] supplies its pipeline; the core never names a target. The [`driver`] runs a
//! pipeline, checks the graph after every pass, can stop after a named pass, and on failure names
//! the pass and keeps the last good graph.

pub mod array_gates;
pub mod array_int8;
pub mod array_norms;
pub mod cost;
pub mod driver;
pub mod passes;
pub mod position_tables;
pub mod targets;

use ir::Graph;

/// What a pass tells the driver besides the new graph: free-form facts for `--json` and the
/// one-line summary (e-graph sizes, stop reasons, counts).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct PassDetail {
    pub summary: String,
    pub data: serde_json::Value,
}

/// Why a pass failed; the driver adds the pass's name.
#[derive(Debug, thiserror::Error)]
pub enum PassError {
    /// `saturate`: a rule merged two e-classes whose dtypes or shapes disagree.
    #[error("a rule merged values of different types ({count} conflicts; first: {first})")]
    TypeConflicts { count: usize, first: String },
    /// `array-int8`: a projection's 4-bit weights are not a MatMulNBits layout (the layout error
    /// is the source).
    #[error("node `{node}` ({op})")]
    ProjectionWeights {
        node: String,
        op: String,
        #[source]
        source: ir::fused::NBitsError,
    },
}

pub trait Pass {
    /// Kebab-case name, as `--stop-after` takes it.
    fn name(&self) -> &'static str;
    /// What the pass expects and what it guarantees, in one paragraph.
    fn contract(&self) -> &'static str;
    fn run(&self, graph: Graph) -> Result<(Graph, PassDetail), PassError>;
}

/// A compilation target: its name and pass pipeline.
pub trait Target {
    fn name(&self) -> &'static str;
    fn pipeline(&self) -> Vec<Box<dyn Pass>>;
}

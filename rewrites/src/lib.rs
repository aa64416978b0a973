//! Rule families for npuc's e-graph, one file each, and the saturation machinery that runs them.
//!
//! A family is a named list of directional egg rewrites (`Family::rules`). Every file starts with
//! a `//!` header stating the identity and the exporter patterns it recognises, then an aligned
//! rule table with a one-line identity comment above each rule, then its tests. Conditions are
//! named functions from [`cond`] (or the family's own file), never inline closures. A rule that
//! cannot apply returns no match and never errors; a group it declines records why
//! ([`ir::egraph::NpuAnalysis::decline`]).
//!
//! [`saturate`] runs a schedule of phases (families + limits) over a graph's e-graph and reports
//! per-iteration sizes, rule applications and the stop reason; [`saturate::extract_graph`] turns
//! the result back into an `ir::Graph` under a cost model.

pub mod cond;
pub mod saturate;

pub use ir::egraph::{EGraph, ENode, NpuAnalysis};

/// A rewrite over npuc's e-graph.
pub type Rewrite = egg::Rewrite<ENode, NpuAnalysis>;

/// A named rule family.
#[derive(Clone, Copy)]
pub struct Family {
    /// Kebab-case family name (`rmsnorm`, `silu-gate`, ...), as `npuc explore --family` takes it.
    pub name: &'static str,
    /// One line: the identity the family folds.
    pub summary: &'static str,
    pub rules: fn() -> Vec<Rewrite>,
}

/// Every family npuc has, in the order the default schedule runs them.
pub fn families() -> Vec<Family> {
    vec![]
}

/// The family called `name`.
pub fn family(name: &str) -> Option<Family> {
    families().into_iter().find(|f| f.name == name)
}

//! The passes every pipeline is built from.

use crate::{Pass, PassDetail, PassError};
use ir::Graph;
use rewrites::saturate::{extract_graph, saturate, Fp16Cost, HostCost, Limits, Phase};
use rewrites::Family;
use std::time::Duration;

/// `canonicalize`: expects a verified imported graph; guarantees the same program with dead nodes
/// removed and Identity nodes bypassed (except those that name a graph output), so later passes
/// and snapshots see only computation.
pub struct Canonicalize;

impl Pass for Canonicalize {
    fn name(&self) -> &'static str {
        "canonicalize"
    }
    fn contract(&self) -> &'static str {
        "Expects a verified imported graph. Guarantees the same program with dead nodes removed and Identity nodes bypassed (except those naming a graph output)."
    }
    fn run(&self, graph: Graph) -> Result<(Graph, PassDetail), PassError> {
        let before = graph.nodes.len();
        let g = graph.pruned();
        let summary = format!("{} nodes removed", before - g.nodes.len());
        Ok((g, PassDetail { summary, data: serde_json::Value::Null }))
    }
}

/// `saturate`: builds the e-graph of the graph, runs the rule schedule (cheap canonical families
/// to saturation, then the fusion families for a bounded number of iterations, each phase with
/// node, iteration and time limits), and extracts the cheapest program under the target's cost
/// model. Guarantees an equivalent program (every rule is an identity of the fused ops' reference
/// semantics) and reports, per phase, the stop reason, iterations and e-graph size, plus every
/// candidate group a rule declined and why. A merge of two classes whose types disagree is a
/// broken rule and fails the pass.
pub struct Saturate {
    pub phases: Vec<Phase>,
    pub cost: CostModel,
}

/// The cost model a [`Saturate`] extracts under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CostModel {
    /// [`HostCost`]: fused ops over their decompositions.
    Host,
    /// [`Fp16Cost`]: as `Host`, and the row-scaled forms over the RmsNorm, SkipRmsNorm and WGemm
    /// they replace.
    Fp16,
}

impl Saturate {
    /// The default schedule over the given families: everything but `attention` first, to
    /// saturation; then `attention` (which needs the fused norms and ropes) for a bounded number of
    /// iterations.
    pub fn with_families(families: Vec<Family>) -> Saturate {
        let (fusion, canonical): (Vec<Family>, Vec<Family>) = families.into_iter().partition(|f| f.name == "attention");
        let mut phases = vec![Phase {
            name: "canonical".into(),
            families: canonical,
            extra_rules: vec![],
            limits: Limits { nodes: 2_000_000, iterations: 30, time: Duration::from_secs(30) },
        }];
        if !fusion.is_empty() {
            phases.push(Phase {
                name: "fusion".into(),
                families: fusion,
                extra_rules: vec![],
                limits: Limits { nodes: 2_000_000, iterations: 8, time: Duration::from_secs(30) },
            });
        }
        Saturate { phases, cost: CostModel::Host }
    }

    /// The schedule of fp16 targets: the default schedule over `families`, then a phase `fp16`
    /// running `fp16_families` (the `fp16-rescale` family rewrites each fused op once; the
    /// iteration limit leaves room for the backoff scheduler to ban and readmit a rule on a model
    /// with many of them), extracting under [`Fp16Cost`].
    pub fn for_fp16(families: Vec<Family>, fp16_families: Vec<Family>) -> Saturate {
        let mut s = Saturate::with_families(families);
        s.phases.push(Phase {
            name: "fp16".into(),
            families: fp16_families,
            extra_rules: vec![],
            limits: Limits { nodes: 2_000_000, iterations: 12, time: Duration::from_secs(30) },
        });
        s.cost = CostModel::Fp16;
        s
    }
}

impl Pass for Saturate {
    fn name(&self) -> &'static str {
        "saturate"
    }
    fn contract(&self) -> &'static str {
        "Expects a canonical graph. Runs the rule schedule on its e-graph (with limits, reporting stop reasons and sizes) and extracts the cheapest equivalent program under the target's cost model."
    }
    fn run(&self, graph: Graph) -> Result<(Graph, PassDetail), PassError> {
        let sat = saturate(&graph, &self.phases, false);
        if !sat.report.type_conflicts.is_empty() {
            return Err(PassError(format!(
                "a rule merged values of different types ({} conflicts; first: {})",
                sat.report.type_conflicts.len(),
                sat.report.type_conflicts[0]
            )));
        }
        let g = match self.cost {
            CostModel::Host => extract_graph(&graph, &sat, HostCost),
            CostModel::Fp16 => extract_graph(&graph, &sat, Fp16Cost),
        };
        let phases: Vec<String> = sat
            .report
            .phases
            .iter()
            .map(|p| format!("{}: {} after {} iterations, {} e-nodes / {} e-classes", p.name, p.stop_reason, p.iterations.len(), p.egraph_nodes, p.egraph_classes))
            .collect();
        let mut summary = phases.join("; ");
        if !sat.report.declined.is_empty() {
            summary.push_str(&format!("; {} groups declined", sat.report.declined.len()));
        }
        let data = serde_json::to_value(&sat.report).unwrap_or(serde_json::Value::Null);
        Ok((g, PassDetail { summary, data }))
    }
}

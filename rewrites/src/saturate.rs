//! Running rule families over a graph's e-graph, and extracting the result.
//!
//! A schedule is a list of phases; each phase runs its families with its own limits (cheap
//! canonical families to saturation, fusion families for a bounded number of iterations), egg's
//! backoff scheduler keeping any one rule from flooding the e-graph. Every phase reports its stop
//! reason, its per-iteration e-graph size and rule applications.

use crate::{Family, Rewrite};
use egg::{CostFunction, Id, Runner, StopReason};
use ir::egraph::{self, Declined, EGraph, ENode, Head, Seeded};
use ir::{Domain, Graph};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub nodes: usize,
    pub iterations: usize,
    pub time: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { nodes: 2_000_000, iterations: 30, time: Duration::from_secs(20) }
    }
}

#[derive(Clone)]
pub struct Phase {
    pub name: String,
    pub families: Vec<Family>,
    /// Rules outside any family (`npuc explore --rules`).
    pub extra_rules: Vec<Rewrite>,
    pub limits: Limits,
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct IterationReport {
    pub egraph_nodes: usize,
    pub egraph_classes: usize,
    /// Rule name → number of applications in this iteration (rules that applied only).
    pub applied: BTreeMap<String, usize>,
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct PhaseReport {
    pub name: String,
    pub families: Vec<String>,
    pub stop_reason: String,
    pub iterations: Vec<IterationReport>,
    pub egraph_nodes: usize,
    pub egraph_classes: usize,
    pub time_ms: f64,
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct SaturationReport {
    pub phases: Vec<PhaseReport>,
    /// Candidate groups rules declined, with the reason.
    pub declined: Vec<DeclinedReport>,
    /// Merges of classes whose types disagreed: each one is a broken rule.
    pub type_conflicts: Vec<String>,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct DeclinedReport {
    pub rule: String,
    pub class: usize,
    pub reason: String,
}

/// The e-graph after a schedule ran, with what is needed to extract from it.
pub struct Saturated {
    pub egraph: EGraph,
    pub root: Id,
    pub names: std::collections::HashMap<Id, String>,
    pub report: SaturationReport,
}

fn stop_text(r: &Option<StopReason>) -> String {
    match r {
        Some(StopReason::Saturated) => "saturated".into(),
        Some(StopReason::IterationLimit(n)) => format!("iteration limit ({n})"),
        Some(StopReason::NodeLimit(n)) => format!("node limit ({n})"),
        Some(StopReason::TimeLimit(t)) => format!("time limit ({t:.1} s)"),
        Some(StopReason::Other(s)) => s.clone(),
        None => "not run".into(),
    }
}

/// Seeds the e-graph of `graph` and runs `phases` over it in order.
pub fn saturate(graph: &Graph, phases: &[Phase], explanations: bool) -> Saturated {
    let Seeded { egraph, root, classes } = egraph::seed(graph, explanations);
    let seeded = Seeded { egraph, root, classes };
    let mut names = egraph::class_names(graph, &seeded, &seeded.egraph);
    let Seeded { mut egraph, root, .. } = seeded;
    let mut report = SaturationReport::default();
    for phase in phases {
        let mut rules: Vec<Rewrite> = phase.families.iter().flat_map(|f| (f.rules)()).collect();
        rules.extend(phase.extra_rules.iter().cloned());
        let start = Instant::now();
        let mut runner = Runner::default()
            .with_node_limit(phase.limits.nodes)
            .with_iter_limit(phase.limits.iterations)
            .with_time_limit(phase.limits.time)
            .with_scheduler(egg::BackoffScheduler::default())
            .with_egraph(egraph);
        if explanations {
            runner = runner.with_explanations_enabled();
        }
        let runner = runner.run(&rules);
        let iterations = runner
            .iterations
            .iter()
            .map(|it| IterationReport {
                egraph_nodes: it.egraph_nodes,
                egraph_classes: it.egraph_classes,
                applied: it.applied.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            })
            .collect();
        let stop_reason = stop_text(&runner.stop_reason);
        egraph = runner.egraph;
        report.phases.push(PhaseReport {
            name: phase.name.clone(),
            families: phase.families.iter().map(|f| f.name.to_string()).collect(),
            stop_reason,
            iterations,
            egraph_nodes: egraph.total_number_of_nodes(),
            egraph_classes: egraph.number_of_classes(),
            time_ms: start.elapsed().as_secs_f64() * 1e3,
        });
    }
    names = names.into_iter().map(|(k, v)| (egraph.find(k), v)).collect();
    report.declined = egraph
        .analysis
        .declined
        .iter()
        .map(|Declined { rule, class, reason }| DeclinedReport {
            rule: rule.clone(),
            class: usize::from(egraph.find(*class)),
            reason: reason.clone(),
        })
        .collect();
    report.type_conflicts = egraph.analysis.type_conflicts.clone();
    Saturated { egraph, root, names, report }
}

/// The host cost model: fused ops cost 1, every other op 2, opaque fused ops of other domains
/// ([`is_opaque`]) [`OPAQUE_COST`], leaves and projections nothing.
///
/// A cost is the pair (critical path, tree sum), compared in that order. The path — own cost plus
/// the most expensive child — is what decides: a fused op reads a subset of the inputs of the
/// decomposition it replaces and costs less than its two or more ops, so it always has the shorter
/// path. The tree sum only breaks ties. A plain tree sum cannot decide alone: it counts a shared
/// value once per use, so on a deep model (every residual read twice per layer) it doubles each
/// layer and reaches magnitudes where a difference of 1 is lost in f64, and fused and unfused
/// choices tie.
pub struct HostCost;

/// What [`HostCost`] charges for an opaque op: more than any lowering of one adds to a path.
pub const OPAQUE_COST: f64 = 1000.0;

/// True for ops of other domains that stand for a whole sub-program npuc lowers into its own
/// fused and layout ops (GroupQueryAttention, RotaryEmbedding, opset-23 Attention) and that no
/// target runs: [`HostCost`] prices them above any such lowering, however many ops it needs.
pub fn is_opaque(enode: &ENode) -> bool {
    matches!(
        &enode.head,
        Head::Op { domain: Domain::Microsoft, op: "GroupQueryAttention" | "RotaryEmbedding", .. }
            | Head::Op { domain: Domain::Onnx, op: "Attention" | "RotaryEmbedding", .. }
    )
}

/// (critical path, tree sum).
#[derive(Clone, Copy, Debug, PartialEq, PartialOrd)]
pub struct PathCost {
    pub path: f64,
    pub sum: f64,
}

impl CostFunction<ENode> for HostCost {
    type Cost = PathCost;

    fn cost<C>(&mut self, enode: &ENode, mut costs: C) -> PathCost
    where
        C: FnMut(Id) -> PathCost,
    {
        let own = match &enode.head {
            _ if is_opaque(enode) => OPAQUE_COST,
            Head::Op { domain: Domain::Npuc, .. } => 1.0,
            Head::Op { .. } => 2.0,
            _ => 0.0,
        };
        let mut path: f64 = 0.0;
        let mut sum = own;
        for &c in &enode.children {
            let k = costs(c);
            path = path.max(k.path);
            sum += k.sum;
        }
        PathCost { path: own + path, sum }
    }
}

/// The cost model of fp16 targets: [`HostCost`], except that the ops the `fp16-rescale`
/// family replaces — `RmsNorm`, `SkipRmsNorm`, `WGemm`, `LpNormalization` and `GatedRMSNorm`, whose fp16 intermediates overflow or
/// flush to zero (see [`crate::fp16_rescale`]) — cost [`FP16_UNSCALED_COST`] more, on the path and
/// in the tree sum alike.
///
/// Each rule of that family puts the row-scaled op in the very class of the op it replaces, over
/// the same children (a WGemm with a bias: an Add of the bias to one), so the two differ only in
/// their own cost and any surcharge already makes the row-scaled one the class's best node. The surcharge is far larger than that so the choice can
/// never hinge on anything else: it exceeds the whole critical path of any program without an
/// unscaled op (a path adds at most [`OPAQUE_COST`] per opaque op, and a decoder has a few
/// thousand ops), so no class can prefer a cheaper-looking alternative whose best form still runs
/// an unscaled op. Where no rule applied the unscaled op is its class's only form and is kept:
/// the surcharge then only marks it.
pub struct Fp16Cost;

/// What [`Fp16Cost`] adds for each op [`is_fp16_unscaled`] names.
pub const FP16_UNSCALED_COST: f64 = 1e9;

/// True for the ops that overflow or underflow in fp16 unless rescaled.
pub fn is_fp16_unscaled(enode: &ENode) -> bool {
    matches!(
        &enode.head,
        Head::Op { domain: Domain::Npuc, op: "RmsNorm" | "SkipRmsNorm" | "WGemm", .. }
            | Head::Op { domain: Domain::Onnx, op: "LpNormalization", .. }
            | Head::Op { domain: Domain::Microsoft, op: "GatedRMSNorm", .. }
    )
}

impl CostFunction<ENode> for Fp16Cost {
    type Cost = PathCost;

    fn cost<C>(&mut self, enode: &ENode, costs: C) -> PathCost
    where
        C: FnMut(Id) -> PathCost,
    {
        let host = HostCost.cost(enode, costs);
        if is_fp16_unscaled(enode) {
            PathCost { path: host.path + FP16_UNSCALED_COST, sum: host.sum + FP16_UNSCALED_COST }
        } else {
            host
        }
    }
}

/// Extracts the best program of a saturated e-graph under `cost` and rebuilds it as a graph.
pub fn extract_graph<CF: CostFunction<ENode>>(template: &Graph, sat: &Saturated, cost: CF) -> Graph {
    let program = egraph::extract(&sat.egraph, sat.root, cost);
    egraph::to_graph(template, &sat.egraph, &program, &sat.names)
}

/// Runs `families` to saturation (within default limits) and extracts with the host cost model:
/// what a family's tests use.
pub fn rewrite_with(graph: &Graph, families: &[Family]) -> (Graph, SaturationReport) {
    let phase =
        Phase { name: "test".into(), families: families.to_vec(), extra_rules: vec![], limits: Limits::default() };
    let sat = saturate(graph, &[phase], false);
    let g = extract_graph(graph, &sat, HostCost);
    (g, sat.report)
}

//! Runs a pipeline: checks the graph after every pass, stops after a named pass on request, and
//! on failure names the pass and keeps the last good graph.

use crate::{Pass, PassDetail};
use ir::Graph;
use std::time::Instant;

#[derive(Clone, Debug, serde::Serialize)]
pub struct PassReport {
    pub index: usize,
    pub name: String,
    pub nodes_before: usize,
    pub nodes_after: usize,
    pub time_ms: f64,
    pub detail: PassDetail,
}

#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("no pass named `{name}` in this pipeline (passes: {available})")]
    UnknownPass { name: String, available: String },
    #[error("pass `{pass}` failed: {message}")]
    PassFailed {
        pass: String,
        message: String,
        /// The graph after the last pass that succeeded (the input if the first pass failed).
        last_good: Box<Graph>,
        reports: Vec<PassReport>,
    },
}

pub struct Outcome {
    pub graph: Graph,
    pub reports: Vec<PassReport>,
}

/// Runs `pipeline` on `graph`. `after_each` sees every pass's report and resulting graph (for
/// dumps). With `stop_after`, the pipeline ends after that pass.
pub fn run(
    pipeline: &[Box<dyn Pass>],
    graph: Graph,
    stop_after: Option<&str>,
    mut after_each: impl FnMut(&PassReport, &Graph),
) -> Result<Outcome, DriverError> {
    if let Some(name) = stop_after {
        if !pipeline.iter().any(|p| p.name() == name) {
            let available: Vec<&str> = pipeline.iter().map(|p| p.name()).collect();
            return Err(DriverError::UnknownPass { name: name.into(), available: available.join(", ") });
        }
    }
    let mut graph = graph;
    let mut reports = Vec::new();
    for (index, pass) in pipeline.iter().enumerate() {
        let before = graph.nodes.len();
        let start = Instant::now();
        let last_good = graph.clone();
        let fail = |message: String, reports: Vec<PassReport>, last_good: Graph| DriverError::PassFailed {
            pass: pass.name().into(),
            message,
            last_good: Box::new(last_good),
            reports,
        };
        let (next, detail) = match pass.run(graph) {
            Ok(r) => r,
            Err(e) => return Err(fail(e.0, reports, last_good)),
        };
        if let Err(e) = next.verify() {
            return Err(fail(format!("the graph it produced is broken: {e}"), reports, last_good));
        }
        if next.outputs.len() != last_good.outputs.len() || next.inputs.len() != last_good.inputs.len() {
            return Err(fail("the graph's inputs or outputs changed".into(), reports, last_good));
        }
        let report = PassReport {
            index,
            name: pass.name().into(),
            nodes_before: before,
            nodes_after: next.nodes.len(),
            time_ms: start.elapsed().as_secs_f64() * 1e3,
            detail,
        };
        after_each(&report, &next);
        reports.push(report);
        graph = next;
        if stop_after == Some(pass.name()) {
            break;
        }
    }
    Ok(Outcome { graph, reports })
}

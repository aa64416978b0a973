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
            Err(e) => return Err(fail(with_causes(&e), reports, last_good)),
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

/// `e` followed by its causes, each after `: `, as `{:#}` prints an error chain.
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(&format!(": {c}"));
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{PassDetail, PassError};
    use ir::graph::{Graph, Node, NodeId, Value, ValueDef, ValueId};
    use ir::{Attrs, DType, Dim, Domain};

    /// y = Neg(x).
    fn tiny() -> Graph {
        let x = Value { name: "x".into(), dtype: DType::F32, shape: vec![Dim::known(2)], def: ValueDef::Input };
        let y = Value {
            name: "y".into(),
            dtype: DType::F32,
            shape: vec![Dim::known(2)],
            def: ValueDef::Node { node: NodeId(0), output: 0 },
        };
        Graph {
            name: "tiny".into(),
            values: vec![x, y],
            nodes: vec![Node {
                name: "neg".into(),
                domain: Domain::Onnx,
                op: "Neg",
                opset: 18,
                attrs: Attrs::default(),
                inputs: vec![Some(ValueId(0))],
                outputs: vec![ValueId(1)],
            }],
            inputs: vec![ValueId(0)],
            outputs: vec![ValueId(1)],
            weights: Default::default(),
            assumptions: vec![],
        }
    }

    struct Keep(&'static str);
    impl Pass for Keep {
        fn name(&self) -> &'static str {
            self.0
        }
        fn contract(&self) -> &'static str {
            "returns its input"
        }
        fn run(&self, g: Graph) -> Result<(Graph, PassDetail), PassError> {
            Ok((g, PassDetail::default()))
        }
    }

    /// Breaks the graph: its node reads a value defined after it.
    struct Break;
    impl Pass for Break {
        fn name(&self) -> &'static str {
            "break"
        }
        fn contract(&self) -> &'static str {
            "produces an invalid graph"
        }
        fn run(&self, mut g: Graph) -> Result<(Graph, PassDetail), PassError> {
            g.nodes[0].inputs[0] = Some(ValueId(1));
            Ok((g, PassDetail::default()))
        }
    }

    #[test]
    fn stops_after_the_named_pass() {
        let p: Vec<Box<dyn Pass>> = vec![Box::new(Keep("a")), Box::new(Keep("b")), Box::new(Keep("c"))];
        let out = run(&p, tiny(), Some("b"), |_, _| {}).unwrap();
        let names: Vec<&str> = out.reports.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
    }

    #[test]
    fn an_unknown_stop_pass_lists_the_pipeline() {
        let p: Vec<Box<dyn Pass>> = vec![Box::new(Keep("a"))];
        let e = run(&p, tiny(), Some("zz"), |_, _| {}).err().unwrap();
        assert_eq!(e.to_string(), "no pass named `zz` in this pipeline (passes: a)");
    }

    #[test]
    fn a_broken_graph_names_the_pass_and_keeps_the_last_good_one() {
        let p: Vec<Box<dyn Pass>> = vec![Box::new(Keep("a")), Box::new(Break), Box::new(Keep("c"))];
        match run(&p, tiny(), None, |_, _| {}) {
            Err(DriverError::PassFailed { pass, message, last_good, reports }) => {
                assert_eq!(pass, "break");
                assert!(message.contains("before it is defined"), "{message}");
                assert_eq!(last_good.nodes[0].inputs[0], Some(ValueId(0)));
                assert_eq!(reports.len(), 1);
            }
            other => panic!("expected a failure, got {:?}", other.map(|o| o.reports.len())),
        }
    }
}

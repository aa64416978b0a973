//! `npuc explore`.

use anyhow::{anyhow, bail, Context, Result};
use ir::egraph::{ENode, Head};
use ir::graph::{Graph, ValueDef, ValueId};
use rewrites::saturate::{extract_graph, saturate, HostCost, Limits, Phase};
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;

pub struct Options {
    pub model: PathBuf,
    pub families: Vec<String>,
    pub rules: Option<PathBuf>,
    pub layer: Option<usize>,
    pub explain: Option<String>,
    pub why: bool,
    pub dot: Option<PathBuf>,
    pub json: bool,
}

pub fn run(o: Options) -> Result<ExitCode> {
    let imported = frontend::import_file(&o.model).with_context(|| format!("importing {}", o.model.display()))?;
    let mut graph = imported.graph.pruned();
    if let Some(n) = o.layer {
        graph = graph.layer(n).ok_or_else(|| anyhow!("no node of {} is named after layer {n} (`layers.{n}/`)", o.model.display()))?;
    }
    let families = if o.families.is_empty() {
        rewrites::families()
    } else {
        o.families
            .iter()
            .map(|name| {
                rewrites::family(name).ok_or_else(|| {
                    let known: Vec<&str> = rewrites::families().iter().map(|f| f.name).collect();
                    anyhow!("unknown rule family `{name}` (families: {})", known.join(", "))
                })
            })
            .collect::<Result<_>>()?
    };
    let extra_rules = match &o.rules {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            rewrites::user::parse_rules(&text).map_err(|e| anyhow!("{}: {e}", path.display()))?
        }
        None => vec![],
    };
    let phase = Phase { name: "explore".into(), families, extra_rules, limits: Limits::default() };
    let sat = saturate(&graph, &[phase], o.explain.is_some());
    let extracted = extract_graph(&graph, &sat, HostCost);
    let report = &sat.report;

    // Names for classes: original values first, so reports speak the model's names.
    let mut class_names: HashMap<usize, String> = HashMap::new();
    for (c, n) in &sat.names {
        class_names.insert(usize::from(sat.egraph.find(*c)), n.clone());
    }

    if o.json {
        let out = serde_json::json!({
            "model": o.model.display().to_string(),
            "layer": o.layer,
            "report": report,
            "nodes_before": graph.nodes.len(),
            "nodes_after": extracted.nodes.len(),
            "ops_after": extracted.op_census(),
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        for p in &report.phases {
            println!("families: {}", p.families.join(", "));
            println!("{:>4} {:>10} {:>10}  rules applied", "iter", "e-nodes", "e-classes");
            for (i, it) in p.iterations.iter().enumerate() {
                let applied: Vec<String> = it.applied.iter().map(|(r, n)| format!("{r}×{n}")).collect();
                println!("{:>4} {:>10} {:>10}  {}", i, it.egraph_nodes, it.egraph_classes, applied.join(" "));
            }
            println!("stop: {}; {} e-nodes, {} e-classes, {:.1} ms", p.stop_reason, p.egraph_nodes, p.egraph_classes, p.time_ms);
        }
        println!("program: {} nodes → {} nodes", graph.nodes.len(), extracted.nodes.len());
        for (op, n) in extracted.op_census().iter().filter(|(op, _)| op.starts_with("npuc::")) {
            println!("  {op} ×{n}");
        }
    }
    if o.why {
        if report.declined.is_empty() {
            println!("no rule declined a candidate group");
        }
        for d in &report.declined {
            let at = class_names.get(&d.class).cloned().unwrap_or_else(|| format!("class {}", d.class));
            println!("declined  {:<28} at {at}: {}", d.rule, d.reason);
        }
    }
    if let Some(name) = &o.explain {
        explain(&graph, &sat, name)?;
    }
    if let Some(path) = &o.dot {
        sat.egraph.dot().to_dot(path).with_context(|| format!("writing {}", path.display()))?;
        let svg = path.with_extension("svg");
        match std::process::Command::new("dot").arg("-Tsvg").arg(path).arg("-o").arg(&svg).status() {
            Ok(s) if s.success() => eprintln!("wrote {} and {}", path.display(), svg.display()),
            Ok(s) => eprintln!("wrote {}; graphviz `dot` failed ({s}) to render SVG", path.display()),
            Err(_) => eprintln!("wrote {}; install graphviz (`apt-get install graphviz`) to render it as SVG", path.display()),
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The original expression that defines `value` in `g`, as a RecExpr (shared subterms once).
fn original_term(g: &Graph, value: ValueId, analysis: &mut ir::egraph::NpuAnalysis) -> egg::RecExpr<ENode> {
    let mut expr = egg::RecExpr::default();
    let mut memo: HashMap<ValueId, egg::Id> = HashMap::new();
    let mut absent = None;
    // Post-order over the defining DAG, iteratively.
    let mut stack = vec![(value, false)];
    while let Some((v, expanded)) = stack.pop() {
        if memo.contains_key(&v) {
            continue;
        }
        let val = g.value(v);
        match &val.def {
            ValueDef::Node { node, output } => {
                let n = g.node(*node);
                if !expanded {
                    stack.push((v, true));
                    for &i in n.inputs.iter().flatten() {
                        stack.push((i, false));
                    }
                    continue;
                }
                let children: Vec<egg::Id> = n
                    .inputs
                    .iter()
                    .map(|i| match i {
                        Some(i) => memo[i],
                        None => *absent.get_or_insert_with(|| expr.add(ENode::leaf(Head::Absent))),
                    })
                    .collect();
                let op = expr.add(ENode::op(n.domain, n.op, n.attrs.clone(), children));
                let id = if n.outputs.len() > 1 { expr.add(ENode { head: Head::Proj(*output), children: vec![op] }) } else { op };
                memo.insert(v, id);
            }
            ValueDef::Input => {
                let id = expr.add(ENode::leaf(Head::Input(val.name.as_str().into())));
                memo.insert(v, id);
            }
            ValueDef::Weight(w) => {
                let id = expr.add(ENode::leaf(Head::Weight(*w)));
                memo.insert(v, id);
            }
            ValueDef::Const(t) => {
                let c = analysis.intern(t.clone());
                let id = expr.add(ENode::leaf(Head::Const(c)));
                memo.insert(v, id);
            }
        }
    }
    expr
}

fn explain(graph: &Graph, sat: &rewrites::saturate::Saturated, name: &str) -> Result<()> {
    let by_name = graph.value_by_name();
    let &v = by_name.get(name).ok_or_else(|| anyhow!("no value named `{name}` in the graph explored"))?;
    if matches!(graph.value(v).def, ValueDef::Const(_)) {
        bail!("`{name}` is a constant; nothing rewrote it");
    }
    let mut egraph = sat.egraph.clone();
    let left = original_term(graph, v, &mut egraph.analysis);
    let class = egraph.lookup_expr(&left).ok_or_else(|| anyhow!("`{name}` is not in the e-graph as written"))?;
    let extractor = egg::Extractor::new(&egraph, HostCost);
    let (_, right) = extractor.find_best(class);
    if left == right {
        println!("`{name}` is extracted as written: no rule changed it");
        return Ok(());
    }
    let mut explanation = egraph.explain_equivalence(&left, &right);
    println!("rewrite chain for `{name}`:");
    for step in explanation.make_flat_explanation().iter() {
        let rule = step.forward_rule.or(step.backward_rule).map(|r| r.to_string()).unwrap_or_else(|| "start".into());
        let text = step.get_recexpr().to_string();
        let shown = if text.len() > 200 { format!("{}…", &text[..200]) } else { text };
        println!("  [{rule}] {shown}");
    }
    Ok(())
}

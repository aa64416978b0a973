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
    pub html: Option<PathBuf>,
    pub json: bool,
}

pub fn run(o: Options) -> Result<ExitCode> {
    let imported = frontend::import_file(&o.model).with_context(|| format!("importing {}", o.model.display()))?;
    let mut graph = imported.graph.pruned();
    if let Some(n) = o.layer {
        graph = graph
            .layer(n)
            .ok_or_else(|| anyhow!("no node of {} is named after layer {n} (`layers.{n}/`)", o.model.display()))?;
    }
    let phase = Phase {
        name: "explore".into(),
        families: families(&o)?,
        extra_rules: user_rules(&o)?,
        limits: Limits::default(),
    };
    let sat = saturate(&graph, &[phase], o.explain.is_some());
    let extracted = extract_graph(&graph, &sat, HostCost);

    // Names for classes: original values first, so reports speak the model's names.
    let mut class_names: HashMap<usize, String> = HashMap::new();
    for (c, n) in &sat.names {
        class_names.insert(usize::from(sat.egraph.find(*c)), n.clone());
    }
    if o.json {
        let out = serde_json::json!({
            "model": o.model.display().to_string(),
            "layer": o.layer,
            "report": sat.report,
            "nodes_before": graph.nodes.len(),
            "nodes_after": extracted.nodes.len(),
            "ops_after": extracted.op_census(),
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print_report(&sat.report, &graph, &extracted);
    }
    if o.why {
        print_declines(&sat.report, &class_names);
    }
    if let Some(name) = &o.explain {
        explain(&graph, &sat, name)?;
    }
    if let Some(path) = &o.dot {
        write_dot(&sat, path)?;
    }
    if let Some(path) = &o.html {
        write_html(path, &o, &sat, &extracted, &class_names)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// The families `--families` names, or every default family.
fn families(o: &Options) -> Result<Vec<rewrites::Family>> {
    if o.families.is_empty() {
        return Ok(rewrites::families());
    }
    o.families
        .iter()
        .map(|name| {
            rewrites::family(name).ok_or_else(|| {
                let known: Vec<&str> =
                    rewrites::families().iter().chain(&rewrites::fp16_families()).map(|f| f.name).collect();
                anyhow!("unknown rule family `{name}` (families: {})", known.join(", "))
            })
        })
        .collect()
}

/// The rules of the `--rules` file, if one is given.
fn user_rules(o: &Options) -> Result<Vec<rewrites::Rewrite>> {
    let Some(path) = &o.rules else { return Ok(vec![]) };
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    rewrites::user::parse_rules(&text).map_err(|e| anyhow!("{}: {e}", path.display()))
}

/// Each phase's iterations (e-graph sizes, rules applied), its stop, and the fused ops extracted.
fn print_report(report: &rewrites::saturate::SaturationReport, graph: &ir::Graph, extracted: &ir::Graph) {
    for p in &report.phases {
        println!("families: {}", p.families.join(", "));
        println!("{:>4} {:>10} {:>10}  rules applied", "iter", "e-nodes", "e-classes");
        for (i, it) in p.iterations.iter().enumerate() {
            let applied: Vec<String> = it.applied.iter().map(|(r, n)| format!("{r}×{n}")).collect();
            println!("{:>4} {:>10} {:>10}  {}", i, it.egraph_nodes, it.egraph_classes, applied.join(" "));
        }
        println!(
            "stop: {}; {} e-nodes, {} e-classes, {:.1} ms",
            p.stop_reason, p.egraph_nodes, p.egraph_classes, p.time_ms
        );
    }
    println!("program: {} nodes → {} nodes", graph.nodes.len(), extracted.nodes.len());
    for (op, n) in extracted.op_census().iter().filter(|(op, _)| op.starts_with("npuc::")) {
        println!("  {op} ×{n}");
    }
}

/// Every candidate group a rule declined, where, and why.
fn print_declines(report: &rewrites::saturate::SaturationReport, class_names: &HashMap<usize, String>) {
    if report.declined.is_empty() {
        println!("no rule declined a candidate group");
    }
    for d in &report.declined {
        let at = class_names.get(&d.class).cloned().unwrap_or_else(|| format!("class {}", d.class));
        println!("declined  {:<28} at {at}: {}", d.rule, d.reason);
    }
}

/// The e-graph as Graphviz text, and as SVG when graphviz is installed.
fn write_dot(sat: &rewrites::saturate::Saturated, path: &std::path::Path) -> Result<()> {
    sat.egraph.dot().to_dot(path).with_context(|| format!("writing {}", path.display()))?;
    let svg = path.with_extension("svg");
    match std::process::Command::new("dot").arg("-Tsvg").arg(path).arg("-o").arg(&svg).status() {
        Ok(s) if s.success() => eprintln!("wrote {} and {}", path.display(), svg.display()),
        Ok(s) => eprintln!("wrote {}; graphviz `dot` failed ({s}) to render SVG", path.display()),
        Err(_) => {
            eprintln!("wrote {}; install graphviz (`apt-get install graphviz`) to render it as SVG", path.display())
        }
    }
    Ok(())
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// A self-contained HTML report; the e-graph drawing is embedded when graphviz renders it.
fn write_html(
    path: &std::path::Path,
    o: &Options,
    sat: &rewrites::saturate::Saturated,
    extracted: &Graph,
    class_names: &HashMap<usize, String>,
) -> Result<()> {
    use std::fmt::Write;
    let mut h = String::new();
    let title = format!("npuc explore {}", o.model.display());
    let _ =
        write!(h, "<!doctype html><meta charset=utf-8><title>{}</title><h1>{}</h1>", escape(&title), escape(&title));
    for p in &sat.report.phases {
        let _ = write!(
            h,
            "<h2>families: {}</h2><table border=1><tr><th>iteration<th>e-nodes<th>e-classes<th>rules applied</tr>",
            escape(&p.families.join(", "))
        );
        for (i, it) in p.iterations.iter().enumerate() {
            let applied: Vec<String> = it.applied.iter().map(|(r, n)| format!("{r}×{n}")).collect();
            let _ = write!(
                h,
                "<tr><td>{i}<td>{}<td>{}<td>{}</tr>",
                it.egraph_nodes,
                it.egraph_classes,
                escape(&applied.join(" "))
            );
        }
        let _ = write!(h, "</table><p>stop: {}</p>", escape(&p.stop_reason));
    }
    let _ = write!(h, "<h2>declined</h2><ul>");
    for d in &sat.report.declined {
        let at = class_names.get(&d.class).cloned().unwrap_or_else(|| format!("class {}", d.class));
        let _ = write!(h, "<li><b>{}</b> at {}: {}", escape(&d.rule), escape(&at), escape(&d.reason));
    }
    let _ = write!(h, "</ul><h2>extracted program</h2><pre>{}</pre>", escape(&ir::print::print_graph(extracted)));
    let dot_text = sat.egraph.dot().to_string();
    let svg = std::process::Command::new("dot")
        .arg("-Tsvg")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .ok()
        .and_then(|mut child| {
            use std::io::Write as _;
            child.stdin.take()?.write_all(dot_text.as_bytes()).ok()?;
            let out = child.wait_with_output().ok()?;
            out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
        });
    match svg {
        Some(svg) => {
            let _ = write!(h, "<h2>e-graph</h2>{svg}");
        }
        None => {
            let _ = write!(h, "<h2>e-graph</h2><p>graphviz (`dot`) is not installed; install it to draw the e-graph here. Graphviz source:</p><pre>{}</pre>", escape(&dot_text));
        }
    }
    std::fs::write(path, h).with_context(|| format!("writing {}", path.display()))
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
                let id = if n.outputs.len() > 1 {
                    expr.add(ENode { head: Head::Proj(*output), children: vec![op] })
                } else {
                    op
                };
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
    // Explanations are trees: a value deep in a model expands to an exponential term.
    const MAX_EXPLAINED_TREE: u64 = 20_000;
    if tree_size(&left) > MAX_EXPLAINED_TREE {
        bail!("`{name}` unfolds to a term of more than {MAX_EXPLAINED_TREE} nodes; explain it within one layer (--layer N)");
    }
    let class = egraph.lookup_expr(&left).ok_or_else(|| anyhow!("`{name}` is not in the e-graph as written"))?;
    let extractor = egg::Extractor::new(&egraph, HostCost);
    let (_, right) = extractor.find_best(class);
    if left == right {
        println!("`{name}` is extracted as written: no rule changed it");
        return Ok(());
    }
    let mut explanation = egraph.explain_equivalence(&left, &right);
    println!("rewrite chain for `{name}`: each step, the rule that fired and the term it produced");
    let mut last: Option<String> = None;
    for (i, step) in explanation.make_flat_explanation().iter().enumerate() {
        if i == 0 {
            println!("  start: {}", shorten(&step.remove_rewrites().to_string()));
            continue;
        }
        let mut fired = Vec::new();
        rewritten_subterms(step, &mut fired);
        for (rule, term) in fired {
            let line = format!("  {rule}: {}", shorten(&term));
            if last.as_deref() != Some(line.as_str()) {
                println!("{line}");
                last = Some(line);
            }
        }
    }
    Ok(())
}

/// The subterms of an explanation step where a rule fired, with the rule's name.
fn rewritten_subterms(t: &egg::FlatTerm<ENode>, out: &mut Vec<(String, String)>) {
    if let Some(rule) = t.forward_rule.or(t.backward_rule) {
        let dir = if t.forward_rule.is_some() { "" } else { " (backwards)" };
        out.push((format!("{rule}{dir}"), t.remove_rewrites().to_string()));
        return;
    }
    for c in &t.children {
        rewritten_subterms(c, out);
    }
}

fn shorten(s: &str) -> String {
    if s.chars().count() > 240 {
        format!("{}…", s.chars().take(240).collect::<String>())
    } else {
        s.to_string()
    }
}

/// Nodes of the tree a RecExpr (a DAG) unfolds to, saturating.
fn tree_size(expr: &egg::RecExpr<ENode>) -> u64 {
    let mut sizes: Vec<u64> = Vec::with_capacity(expr.len());
    for node in expr.as_ref() {
        let s = node.children.iter().fold(1u64, |acc, &c| acc.saturating_add(sizes[usize::from(c)]));
        sizes.push(s);
    }
    sizes.last().copied().unwrap_or(0)
}

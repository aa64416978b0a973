//! `npuc passes`.

use anyhow::{anyhow, bail, Context, Result};
use passes::cost::{self, StepSizes};
use passes::driver::{self, DriverError};
use std::path::Path;
use std::process::ExitCode;

pub struct Options<'a> {
    pub model: &'a Path,
    pub target: &'a str,
    pub stop_after: Option<&'a str>,
    pub dump_dir: Option<&'a Path>,
    pub json: bool,
    /// A test case folder to evaluate the final program on.
    pub check: Option<&'a Path>,
    /// Evaluate the check with the fp16 simulation.
    pub fp16_sim: bool,
}

pub fn run(o: Options) -> Result<ExitCode> {
    // Read the case first: a wrong folder should fail before the pipeline runs.
    let case = o.check.map(read_case).transpose()?;
    let t = crate::targets::target(o.target)?;
    let start = std::time::Instant::now();
    let imported = frontend::import_file(o.model).with_context(|| format!("importing {}", o.model.display()))?;
    let import_ms = start.elapsed().as_secs_f64() * 1e3;
    let weight_bytes: u64 = imported.graph.weights.iter().map(|(_, w)| w.bytes.len() as u64).sum();
    if let Some(dir) = o.dump_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::write(dir.join("00-import.ir"), ir::print::print_graph(&imported.graph))?;
    }
    if !o.json && o.dump_dir.is_none() {
        println!("== 00 import ({} nodes)", imported.graph.nodes.len());
        print!("{}", ir::print::print_graph(&imported.graph));
    }
    let mut io_error = None;
    let result = driver::run(&t.pipeline(), imported.graph, o.stop_after, |report, graph| {
        if let Err(e) = show_pass(&o, report, graph) {
            io_error.get_or_insert(e);
        }
    });
    if let Some(e) = io_error {
        bail!("writing the pass dumps: {e}");
    }
    let outcome = match result {
        Ok(outcome) => outcome,
        Err(DriverError::PassFailed { pass, message, last_good, reports }) => {
            if let Some(dir) = o.dump_dir {
                let file = dir.join(format!("{:02}-last-good.ir", reports.len()));
                std::fs::write(file, ir::print::print_graph(&last_good))?;
            }
            bail!("pass `{pass}` failed: {message}")
        }
        Err(e) => return Err(e.into()),
    };
    let check = match &case {
        Some((inputs, expected)) => Some(check_program(&outcome.graph, inputs, expected, o.fp16_sim)?),
        None => None,
    };
    let costs = step_costs(&outcome.graph);
    if !o.json {
        if let Some(c) = &check {
            print_check(c, o.fp16_sim);
        }
        print_costs(&costs);
        return Ok(ExitCode::SUCCESS);
    }
    let out = serde_json::json!({
        "model": o.model.display().to_string(),
        "target": o.target,
        "import_ms": import_ms,
        "total_ms": start.elapsed().as_secs_f64() * 1e3,
        "weight_bytes": weight_bytes,
        "peak_rss_bytes": peak_rss_bytes(),
        "passes": outcome.reports,
        "check": check,
        "step_cost": costs.iter().map(|(what, s, c)| serde_json::json!({"step": what, "sizes": s, "cost": c})).collect::<Vec<_>>(),
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(ExitCode::SUCCESS)
}

type TestCase = (std::collections::HashMap<String, ir::Tensor>, Vec<(String, ir::Tensor)>);

/// The inputs and expected outputs of an ONNX test case folder.
fn read_case(dir: &Path) -> Result<TestCase> {
    if !dir.is_dir() {
        bail!("test case folder {} does not exist", dir.display());
    }
    let case = frontend::read_test_case(dir).with_context(|| format!("reading the test case {}", dir.display()))?;
    if case.0.is_empty() || case.1.is_empty() {
        bail!("{} holds no input_N.pb and output_N.pb files (ONNX test data)", dir.display());
    }
    Ok(case)
}

/// One pass's line on stderr, and its graph printed or dumped.
fn show_pass(o: &Options, report: &driver::PassReport, graph: &ir::Graph) -> std::io::Result<()> {
    if let Some(dir) = o.dump_dir {
        let file = format!("{:02}-{}.ir", report.index + 1, report.name);
        std::fs::write(dir.join(&file), ir::print::print_graph(graph))?;
    }
    if o.json {
        return Ok(());
    }
    eprintln!(
        "{:02} {:<14} {:>6} → {:<6} nodes {:>9.1} ms  {}",
        report.index + 1,
        report.name,
        report.nodes_before,
        report.nodes_after,
        report.time_ms,
        report.detail.summary
    );
    if o.dump_dir.is_none() {
        println!("== {:02} {} ({} nodes)", report.index + 1, report.name, report.nodes_after);
        print!("{}", ir::print::print_graph(graph));
    }
    Ok(())
}

/// The cost of a decode step at past 512 and of a 64-row prefill block.
fn step_costs(g: &ir::Graph) -> [(&'static str, StepSizes, cost::StepCost); 2] {
    let decode = StepSizes { rows: 1, past: 512 };
    let prefill = StepSizes { rows: 64, past: 0 };
    [("decode", decode, cost::step_cost(g, decode)), ("prefill", prefill, cost::step_cost(g, prefill))]
}

fn print_costs(costs: &[(&'static str, StepSizes, cost::StepCost)]) {
    for (what, s, c) in costs {
        eprintln!(
            "{what} step ({} rows, {} past): {:.1} MMAC, {:.2} MB of weights read, {:.2} MB of KV read",
            s.rows,
            s.past,
            c.macs as f64 / 1e6,
            c.weight_bytes as f64 / 1e6,
            c.kv_bytes as f64 / 1e6
        );
    }
}

/// Peak resident set size of this process (Linux `VmHWM`), if the system reports it.
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// One output of `--check`: its error against the expected tensor.
#[derive(serde::Serialize)]
struct OutputCheck {
    name: String,
    /// max |got − want| / max |want|.
    max_rel_diff: f64,
    /// Values of the result that are ±∞ or NaN.
    non_finite: usize,
    /// For `logits`: the worst KL(softmax(want) ‖ softmax(got)) over positions.
    worst_kl: Option<f64>,
    /// For `logits`: positions whose largest logit is the expected one, and positions.
    top1: Option<(usize, usize)>,
}

/// Runs the program on the case's inputs (reference evaluator, or the fp16 simulation) and
/// compares every expected output that the program produces.
fn check_program(
    g: &ir::Graph,
    inputs: &std::collections::HashMap<String, ir::Tensor>,
    expected: &[(String, ir::Tensor)],
    fp16_sim: bool,
) -> Result<Vec<OutputCheck>> {
    let got = if fp16_sim { ir::fp16sim::run_graph_fp16(g, inputs) } else { ir::run::run_graph(g, inputs) }
        .map_err(|e| anyhow!("evaluating the program on the case: {e}"))?;
    let mut out = Vec::new();
    for (name, want) in expected {
        let Some(t) = got.get(name) else { bail!("the program has no output `{name}` that the case expects") };
        if t.shape != want.shape {
            bail!("output `{name}` has shape {:?}, the case expects {:?}", t.shape, want.shape);
        }
        let (a, b) = (t.to_f64_vec(), want.to_f64_vec());
        let scale = b.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        let diff =
            a.iter().zip(&b).fold(0.0f64, |m, (x, y)| if (x - y).abs() > m || x.is_nan() { (x - y).abs() } else { m });
        let logits = name == "logits" && !want.shape.is_empty();
        let rows = || {
            let v = *want.shape.last().unwrap();
            b.chunks(v).zip(a.chunks(v))
        };
        let worst_kl = logits.then(|| rows().map(|(p, q)| kl(p, q)).fold(0.0, f64::max));
        let argmax = |r: &[f64]| r.iter().enumerate().fold(0, |m, (i, v)| if *v > r[m] { i } else { m });
        let top1 = logits.then(|| (rows().filter(|(p, q)| argmax(p) == argmax(q)).count(), rows().count()));
        out.push(OutputCheck {
            name: name.clone(),
            max_rel_diff: if scale > 0.0 { diff / scale } else { diff },
            non_finite: a.iter().filter(|v| !v.is_finite()).count(),
            worst_kl,
            top1,
        });
    }
    Ok(out)
}

/// KL(softmax(p) ‖ softmax(q)); ∞ when q holds a non-finite value.
fn kl(p: &[f64], q: &[f64]) -> f64 {
    if q.iter().any(|v| !v.is_finite()) {
        return f64::INFINITY;
    }
    let lse = |r: &[f64]| {
        let m = r.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        m + r.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
    };
    let (lp, lq) = (lse(p), lse(q));
    p.iter().zip(q).map(|(x, y)| (x - lp).exp() * ((x - lp) - (y - lq))).sum()
}

fn print_check(checks: &[OutputCheck], fp16_sim: bool) {
    let how = if fp16_sim { "fp16 simulation" } else { "reference evaluator" };
    eprintln!("check ({how}) against the case's expected outputs:");
    for c in checks {
        let kl = c.worst_kl.map(|k| format!("  worst KL {k:.2e}")).unwrap_or_default();
        let top1 = c.top1.map(|(a, n)| format!("  top-1 {a}/{n}")).unwrap_or_default();
        let bad = if c.non_finite > 0 { format!("  {} non-finite", c.non_finite) } else { String::new() };
        eprintln!("  {:<24} max|Δ|/max|ref| {:.2e}{kl}{top1}{bad}", c.name, c.max_rel_diff);
    }
}

//! `npuc inspect`.

use anyhow::{Context, Result};
use ir::graph::{Graph, ValueDef, ValueId};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;

#[derive(Serialize)]
struct Report {
    model: String,
    file_bytes: u64,
    ir_version: i64,
    producer: String,
    opsets: Vec<(String, i64)>,
    unsupported: Vec<frontend::import::UnsupportedOp>,
    before: Census,
    after: Census,
    folded_nodes: usize,
    dead_nodes: usize,
    assumptions: Vec<String>,
    gemms: Vec<Gemm>,
    weights: Vec<WeightBytes>,
    inputs: Vec<Io>,
    outputs: Vec<Io>,
}

#[derive(Serialize)]
struct Census {
    nodes: usize,
    by_op: BTreeMap<String, usize>,
}

#[derive(Serialize)]
struct Gemm {
    op: String,
    /// Rows of the activation operand, symbolic.
    m: String,
    k: String,
    n: String,
    /// Where the right-hand operand comes from: `weight`, `weight (transposed)`, `quantized
    /// weight`, `quantized weight (transposed)`, `activation`.
    rhs: String,
    count: usize,
}

#[derive(Serialize)]
struct WeightBytes {
    dtype: String,
    tensors: usize,
    bytes: u64,
}

#[derive(Serialize)]
struct Io {
    name: String,
    dtype: String,
    shape: String,
}

pub fn run(path: &Path, json: bool, print: bool) -> Result<ExitCode> {
    let spinner = (!json && std::io::stderr().is_terminal()).then(|| {
        let s = indicatif::ProgressBar::new_spinner();
        s.set_message(format!("importing {}", path.display()));
        s.enable_steady_tick(std::time::Duration::from_millis(100));
        s
    });
    let model = frontend::load(path)?;
    let unsupported = frontend::import::unsupported_ops(&model);
    if !unsupported.is_empty() {
        if let Some(s) = &spinner {
            s.finish_and_clear();
        }
        if json {
            println!("{}", serde_json::json!({ "model": path.display().to_string(), "unsupported": unsupported }));
        } else {
            eprintln!("{}: {} node(s) use ops outside npuc's vocabulary:", path.display(), unsupported.len());
            for u in &unsupported {
                eprintln!("  node `{}`: {}::{} (opset {})", u.node, u.domain, u.op, u.opset);
            }
        }
        return Ok(ExitCode::FAILURE);
    }
    let imported = frontend::import(&model).with_context(|| format!("importing {}", path.display()))?;
    if let Some(s) = &spinner {
        s.finish_and_clear();
    }
    let g = &imported.graph;
    let r = &imported.report;
    let report = Report {
        model: path.display().to_string(),
        file_bytes: model.file_bytes,
        ir_version: r.ir_version,
        producer: r.producer.clone(),
        opsets: r.opsets.clone(),
        unsupported: vec![],
        before: Census { nodes: r.onnx_nodes, by_op: r.onnx_census.iter().cloned().collect() },
        after: Census { nodes: r.ir_nodes, by_op: r.ir_census.iter().cloned().collect() },
        folded_nodes: r.folded_nodes,
        dead_nodes: r.dead_nodes,
        assumptions: r.assumptions.clone(),
        gemms: gemms(g),
        weights: weights(g),
        inputs: g.inputs.iter().map(|&v| io(g, v)).collect(),
        outputs: g.outputs.iter().map(|&v| io(g, v)).collect(),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_text(&report);
        if print {
            println!();
            print!("{}", ir::print::print_graph(g));
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn io(g: &Graph, v: ValueId) -> Io {
    let v = g.value(v);
    Io { name: v.name.clone(), dtype: v.dtype.to_string(), shape: ir::dim::shape_to_string(&v.shape) }
}

/// Where an operand comes from, looking through one Transpose (a tied lm_head reads the
/// embedding table, float or dequantised, transposed).
fn operand_kind(g: &Graph, v: ValueId) -> &'static str {
    let ValueDef::Node { node, .. } = g.value(v).def else { return direct_kind(g, v) };
    let n = g.node(node);
    match (n.op, n.inputs.first().copied().flatten()) {
        ("Transpose", Some(src)) => match direct_kind(g, src) {
            "weight" => "weight (transposed)",
            "quantized weight" => "quantized weight (transposed)",
            _ => "activation",
        },
        _ => direct_kind(g, v),
    }
}

/// A weight, a dequantised weight, or an activation.
fn direct_kind(g: &Graph, v: ValueId) -> &'static str {
    match &g.value(v).def {
        ValueDef::Weight(_) | ValueDef::Const(_) => "weight",
        ValueDef::Node { node, .. } => {
            let n = g.node(*node);
            match (n.op, n.inputs.first().copied().flatten()) {
                ("DequantizeLinear", Some(src)) if matches!(g.value(src).def, ValueDef::Weight(_)) => {
                    "quantized weight"
                }
                _ => "activation",
            }
        }
        ValueDef::Input => "activation",
    }
}

fn gemms(g: &Graph) -> Vec<Gemm> {
    let mut counts: BTreeMap<(String, String, String, String, String), usize> = BTreeMap::new();
    for n in &g.nodes {
        let (Some(a), b) = (n.inputs.first().copied().flatten(), n.inputs.get(1).copied().flatten()) else { continue };
        let a_shape = &g.value(a).shape;
        let rows = |s: &[ir::Dim]| {
            let lead: Vec<String> = s[..s.len().saturating_sub(1)].iter().map(|d| d.to_string()).collect();
            if lead.is_empty() {
                "1".to_string()
            } else {
                lead.join("×")
            }
        };
        let key = match n.op {
            "MatMul" | "MatMulInteger" => {
                let Some(b) = b else { continue };
                let bs = &g.value(b).shape;
                if a_shape.is_empty() || bs.len() < 2 {
                    continue;
                }
                let k = a_shape[a_shape.len() - 1].to_string();
                let nn = bs[bs.len() - 1].to_string();
                (n.op.to_string(), rows(a_shape), k, nn, operand_kind(g, b).to_string())
            }
            "Gemm" => {
                let Some(b) = b else { continue };
                let bs = &g.value(b).shape;
                let tb = n.attrs.int_or("transB", 0).unwrap_or(0) != 0;
                let (k, nn) = if tb { (&bs[1], &bs[0]) } else { (&bs[0], &bs[1]) };
                (n.op.to_string(), rows(a_shape), k.to_string(), nn.to_string(), operand_kind(g, b).to_string())
            }
            "MatMulNBits" => {
                let k = n.attrs.int_or("K", 0).unwrap_or(0).to_string();
                let nn = n.attrs.int_or("N", 0).unwrap_or(0).to_string();
                let bits = n.attrs.int_or("bits", 4).unwrap_or(4);
                (n.op.to_string(), rows(a_shape), k, nn, format!("weight (int{bits} blocks)"))
            }
            _ => continue,
        };
        *counts.entry(key).or_default() += 1;
    }
    counts.into_iter().map(|((op, m, k, n, rhs), count)| Gemm { op, m, k, n, rhs, count }).collect()
}

fn weights(g: &Graph) -> Vec<WeightBytes> {
    let mut by: BTreeMap<String, (usize, u64)> = BTreeMap::new();
    for (_, w) in g.weights.iter() {
        let e = by.entry(w.dtype.to_string()).or_default();
        e.0 += 1;
        e.1 += w.bytes.len() as u64;
    }
    by.into_iter().map(|(dtype, (tensors, bytes))| WeightBytes { dtype, tensors, bytes }).collect()
}

fn print_text(r: &Report) {
    println!("model      {} ({} bytes)", r.model, r.file_bytes);
    println!(
        "ir         version {}, produced by {}",
        r.ir_version,
        if r.producer.is_empty() { "?" } else { &r.producer }
    );
    let opsets: Vec<String> = r.opsets.iter().map(|(d, v)| format!("{d} {v}")).collect();
    println!("opsets     {}", opsets.join(", "));
    println!(
        "nodes      {} in the file → {} after import ({} folded to constants, {} dead)",
        r.before.nodes, r.after.nodes, r.folded_nodes, r.dead_nodes
    );
    println!("unsupported ops: none");
    for a in &r.assumptions {
        println!("assumed    {a}");
    }
    println!();
    println!("{:<44} {:>8} {:>8}", "op (domain::op)", "before", "after");
    let mut ops: Vec<&String> = r.before.by_op.keys().chain(r.after.by_op.keys()).collect();
    ops.sort();
    ops.dedup();
    for op in ops {
        println!(
            "{:<44} {:>8} {:>8}",
            op,
            r.before.by_op.get(op).copied().unwrap_or(0),
            r.after.by_op.get(op).copied().unwrap_or(0)
        );
    }
    println!();
    println!("GEMMs (rows × K × N, right-hand operand, count)");
    for gm in &r.gemms {
        println!("  {:<14} [{}] × {} × {}  {:<22} ×{}", gm.op, gm.m, gm.k, gm.n, gm.rhs, gm.count);
    }
    println!();
    println!("weights");
    for w in &r.weights {
        println!("  {:<6} {:>5} tensors {:>14} bytes", w.dtype, w.tensors, w.bytes);
    }
    println!();
    for i in &r.inputs {
        println!("input      {} : {}{}", i.name, i.dtype, i.shape);
    }
    for o in &r.outputs {
        println!("output     {} : {}{}", o.name, o.dtype, o.shape);
    }
}

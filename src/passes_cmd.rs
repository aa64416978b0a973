//! `npuc passes`.

use anyhow::{anyhow, bail, Context, Result};
use passes::driver::{self, DriverError};
use std::path::Path;
use std::process::ExitCode;

pub fn run(model: &Path, target: &str, stop_after: Option<&str>, dump_dir: Option<&Path>, json: bool) -> Result<ExitCode> {
    let t = passes::targets::target(target)
        .ok_or_else(|| anyhow!("unknown target `{target}` (targets: {})", passes::targets::TARGET_NAMES.join(", ")))?;
    let start = std::time::Instant::now();
    let imported = frontend::import_file(model).with_context(|| format!("importing {}", model.display()))?;
    let import_ms = start.elapsed().as_secs_f64() * 1e3;
    let weight_bytes: u64 = imported.graph.weights.iter().map(|(_, w)| w.bytes.len() as u64).sum();
    if let Some(dir) = dump_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::write(dir.join("00-import.ir"), ir::print::print_graph(&imported.graph))?;
    }
    if !json && dump_dir.is_none() {
        println!("== 00 import ({} nodes)", imported.graph.nodes.len());
        print!("{}", ir::print::print_graph(&imported.graph));
    }
    let pipeline = t.pipeline();
    let mut io_error = None;
    let result = driver::run(&pipeline, imported.graph, stop_after, |report, graph| {
        let file = format!("{:02}-{}.ir", report.index + 1, report.name);
        if let Some(dir) = dump_dir {
            if let Err(e) = std::fs::write(dir.join(&file), ir::print::print_graph(graph)) {
                io_error.get_or_insert(e);
            }
        }
        if !json {
            eprintln!(
                "{:02} {:<14} {:>6} → {:<6} nodes {:>9.1} ms  {}",
                report.index + 1,
                report.name,
                report.nodes_before,
                report.nodes_after,
                report.time_ms,
                report.detail.summary
            );
            if dump_dir.is_none() {
                println!("== {:02} {} ({} nodes)", report.index + 1, report.name, report.nodes_after);
                print!("{}", ir::print::print_graph(graph));
            }
        }
    });
    if let Some(e) = io_error {
        bail!("writing the pass dumps: {e}");
    }
    match result {
        Ok(outcome) => {
            if json {
                let out = serde_json::json!({
                    "model": model.display().to_string(),
                    "target": target,
                    "import_ms": import_ms,
                    "total_ms": start.elapsed().as_secs_f64() * 1e3,
                    "weight_bytes": weight_bytes,
                    "peak_rss_bytes": peak_rss_bytes(),
                    "passes": outcome.reports,
                });
                println!("{}", serde_json::to_string_pretty(&out)?);
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(DriverError::PassFailed { pass, message, last_good, reports }) => {
            if let Some(dir) = dump_dir {
                std::fs::write(dir.join(format!("{:02}-last-good.ir", reports.len())), ir::print::print_graph(&last_good))?;
            }
            bail!("pass `{pass}` failed: {message}")
        }
        Err(e) => Err(e.into()),
    }
}

/// Peak resident set size of this process (Linux `VmHWM`), if the system reports it.
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

//! `npuc compile --target xdna`: the designs and the host plan in the bundle.
//!
//! Every projection GEMM of the compiled program gets designs (see `codegen_aie::plan`): the
//! bundle carries `xdna/plan.json` (which node calls which design, column chunks, the host
//! threshold below which a call stays on the host, each design's tiling and predicted
//! utilisation), and per design `xdna/<name>.mlir` (generic form) and `xdna/<name>.pretty.mlir`
//! (the custom form mlir-aie's `aie-opt`/`aiecc` take). When `aiecc` is not on PATH the bundle
//! says so: it carries designs, not device artifacts.

use anyhow::{anyhow, Context, Result};
use codegen_aie::plan::{self, PlanOptions};
use codegen_aie::Device;
use ir::graph::Graph;
use runtime::bundle::BundleWriter;
use serde_json::{json, Value};

pub const PLAN_FILE: &str = "xdna/plan.json";

/// The device `--device` names (default npu1).
pub fn device(name: Option<&str>) -> Result<Device> {
    let name = name.unwrap_or("npu1");
    Device::parse(name)
        .ok_or_else(|| anyhow!("unknown XDNA device `{name}` (devices: {})", codegen_aie::device::DEVICES.join(", ")))
}

fn aiecc_on_path() -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("aiecc").is_file() || d.join("aiecc.py").is_file()))
}

/// Plans the program's projections for `device`, writes designs and plan into the bundle, and
/// returns the summary `--json` prints.
pub fn add_to_bundle(g: &Graph, device: Device, w: &mut BundleWriter) -> Result<Value> {
    let plan = plan::plan(g, PlanOptions::new(device)).context("planning the XDNA designs")?;
    for d in plan.designs.values() {
        let (generic, pretty) = plan::design_files(&d.name);
        w.add_file(&generic, d.generic().as_bytes()).with_context(|| format!("storing {generic}"))?;
        w.add_file(&pretty, d.pretty().as_bytes()).with_context(|| format!("storing {pretty}"))?;
    }
    let mut plan_json = plan.to_json();
    let artifacts = if aiecc_on_path() {
        "aiecc is on PATH; building device artifacts from the designs is not wired yet: the bundle carries the designs"
    } else {
        "aiecc is not on PATH: the bundle carries the designs, not device artifacts"
    };
    plan_json["artifacts"] = json!(artifacts);
    w.add_file(PLAN_FILE, serde_json::to_string_pretty(&plan_json)?.as_bytes()).context("storing the XDNA plan")?;
    let designs: Vec<Value> = plan
        .designs
        .values()
        .map(|d| {
            let t = &d.tiling;
            json!({
                "name": d.name,
                "shape": [t.shape.m, t.shape.k, t.shape.n],
                "padded": [t.padded.m, t.padded.k, t.padded.n],
                "tile": [t.m, t.k, t.n],
                "l1_bytes": t.l1_bytes,
                "l2_bytes": t.l2_bytes,
                "predicted_utilisation": t.utilisation,
            })
        })
        .collect();
    Ok(json!({
        "device": device.name(),
        "host_threshold_rows": plan.options.host_threshold_rows,
        "projections": plan.gemms.len(),
        "projections_with_designs": plan.gemms.iter().filter(|g| !g.chunks.is_empty()).count(),
        "designs": designs,
        "artifacts": artifacts,
    }))
}

/// Human-readable lines for the compile summary.
pub fn summary_lines(v: &Value) -> Vec<String> {
    let mut out = vec![format!(
        "xdna ({}): {} of {} projection GEMMs have designs; calls below {} rows run on the host; {}",
        v["device"].as_str().unwrap_or("?"),
        v["projections_with_designs"],
        v["projections"],
        v["host_threshold_rows"],
        v["artifacts"].as_str().unwrap_or("")
    )];
    for d in v["designs"].as_array().into_iter().flatten() {
        let dims = |k: &str| {
            d[k].as_array().map(|a| a.iter().map(|x| x.to_string()).collect::<Vec<_>>().join("x")).unwrap_or_default()
        };
        out.push(format!(
            "  {:<34} padded {:<16} tile {:<10} L1 {:>6} B  L2 {:>7} B  predicted utilisation {:>5.1} %",
            d["name"].as_str().unwrap_or("?"),
            dims("padded"),
            dims("tile"),
            d["l1_bytes"],
            d["l2_bytes"],
            100.0 * d["predicted_utilisation"].as_f64().unwrap_or(0.0)
        ));
    }
    out
}

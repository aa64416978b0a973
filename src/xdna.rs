//! `npuc compile --target xdna`: the designs and the host plan in the bundle.
//!
//! Every projection GEMM of the compiled program gets designs (see `codegen_aie::plan`): the
//! bundle carries `xdna/plan.json` (which node calls which design, column chunks, the threshold
//! below which a call runs on the GEMV designs in blocks of 8 rows, each design's tiling and
//! predicted utilisation), and per design `xdna/<name>.mlir` (generic form) and `xdna/<name>.pretty.mlir`
//! (the custom form mlir-aie's `aie-opt`/`aiecc` take), and per array program (decode's MLP as
//! one command, `codegen_aie::sequence`) the same two files. A design carries its cores' code as MLIR
//! functions (`codegen_aie::kernels`), so mlir-aie's `aiecc.py` with the Peano compiler builds
//! it with nothing else: the plan records, per design, the exact command (`build`, run in the
//! bundle's folder; `codegen_aie::plan::build_args`), and the compile summary prints them. When
//! `aiecc.py` (or `aiecc`) is on PATH, npuc runs that command on every design in a scratch folder
//! and the instruction stream, xclbin and PDI it writes go into the bundle as
//! `xdna/<name>.insts.bin`, `.xclbin` and `.pdi`; a design aiecc fails on keeps its error in the
//! plan. Without aiecc the bundle says it carries designs only, and which commands build the
//! rest. When
//! MLIR 22's `mlir-opt` is installed (`codegen_aie::mlir`), every design is verified by it first
//! and the plan says so; a design MLIR rejects fails the compile.

use anyhow::{anyhow, Context, Result};
use codegen_aie::plan::{self, PlanOptions, PLAN_FILE};
use codegen_aie::Device;
use ir::graph::Graph;
use runtime::bundle::BundleWriter;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The device `--device` names (default npu1).
pub fn device(name: Option<&str>) -> Result<Device> {
    let name = name.unwrap_or("npu1");
    Device::parse(name)
        .ok_or_else(|| anyhow!("unknown XDNA device `{name}` (devices: {})", codegen_aie::device::DEVICES.join(", ")))
}

/// mlir-aie's compiler driver, if PATH has it.
fn aiecc() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).flat_map(|d| [d.join(plan::AIECC), d.join("aiecc")]).find(|p| p.is_file())
}

/// What aiecc builds for one design.
struct Artifacts {
    insts: Vec<u8>,
    xclbin: Vec<u8>,
    pdi: Vec<u8>,
}

/// Runs aiecc on one design's custom form with the plan's build command, in a scratch folder
/// laid out as the bundle is; returns its artifacts, or the tail of what aiecc said.
fn build_artifacts(tool: &Path, name: &str, pretty: &str) -> Result<Artifacts, String> {
    let dir = std::env::temp_dir().join(format!("npuc-aiecc-{}-{name}", std::process::id()));
    let result = (|| {
        std::fs::create_dir_all(dir.join("xdna")).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let (_, design) = plan::design_files(name);
        std::fs::write(dir.join(&design), pretty).map_err(|e| e.to_string())?;
        let out = Command::new(tool)
            .current_dir(&dir)
            .args(plan::build_args(name))
            .output()
            .map_err(|e| format!("running {}: {e}", tool.display()))?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            let tail: Vec<&str> = err.lines().rev().take(5).collect();
            return Err(format!(
                "aiecc failed ({}): {}",
                out.status,
                tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
            ));
        }
        let read = |ext: &str| {
            let f = format!("xdna/{name}.{ext}");
            std::fs::read(dir.join(&f)).map_err(|e| format!("aiecc wrote no {f}: {e}"))
        };
        Ok(Artifacts { insts: read("insts.bin")?, xclbin: read("xclbin")?, pdi: read("pdi")? })
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// Every design's and array program's name and texts (generic, custom).
fn texts(plan: &plan::Plan) -> Vec<(String, String, String)> {
    let designs = plan.designs.values().map(|d| (d.name.clone(), d.generic(), d.pretty()));
    let programs = plan.array_programs.values().map(|p| (p.name.clone(), p.generic(), p.pretty()));
    designs.chain(programs).collect()
}

/// MLIR 22's verifier over every text when mlir-opt is installed; a text it rejects is a
/// compiler bug, so the compile fails naming it. What the plan records about it.
fn verify_with_mlir(texts: &[(String, String, String)], designs: usize) -> Result<String> {
    let version = match codegen_aie::mlir::version() {
        Ok(version) => version,
        Err(e) => return Ok(format!("not verified by MLIR ({e})")),
    };
    for (name, generic, _) in texts {
        codegen_aie::mlir::verify_generic(generic)
            .with_context(|| format!("design {name} does not verify in MLIR ({version})"))?;
    }
    let programs = texts.len() - designs;
    Ok(format!("{designs} designs and {programs} array programs verified by MLIR ({version})"))
}

/// Plans the program's projections for `device`, writes designs and plan into the bundle, and
/// returns the summary `--json` prints.
pub fn add_to_bundle(g: &Graph, device: Device, w: &mut BundleWriter) -> Result<Value> {
    let plan = plan::plan(g, PlanOptions::new(device)).context("planning the XDNA designs")?;
    let texts = texts(&plan);
    for (name, generic_text, pretty_text) in &texts {
        let (generic, pretty) = plan::design_files(name);
        w.add_file(&generic, generic_text.as_bytes()).with_context(|| format!("storing {generic}"))?;
        w.add_file(&pretty, pretty_text.as_bytes()).with_context(|| format!("storing {pretty}"))?;
    }
    let mut plan_file = plan.to_plan_file();
    let verified = verify_with_mlir(&texts, plan.designs.len())?;
    plan_file.mlir = Some(verified.clone());
    let artifacts = match aiecc() {
        None => format!(
            "{0} is not on PATH: the bundle carries the designs, not device artifacts; each design's build command makes them (below, and `build` in {PLAN_FILE}), and with {0} on PATH npuc compile runs them and stores what they write",
            plan::AIECC
        ),
        Some(tool) => {
            let mut built = 0;
            for (d, entry) in plan.designs.values().zip(plan_file.designs.iter_mut()) {
                match build_artifacts(&tool, &d.name, &d.pretty()) {
                    Ok(Artifacts { insts, xclbin, pdi }) => {
                        let (i, x) = (format!("xdna/{}.insts.bin", d.name), format!("xdna/{}.xclbin", d.name));
                        let p = format!("xdna/{}.pdi", d.name);
                        w.add_file(&i, &insts).with_context(|| format!("storing {i}"))?;
                        w.add_file(&x, &xclbin).with_context(|| format!("storing {x}"))?;
                        w.add_file(&p, &pdi).with_context(|| format!("storing {p}"))?;
                        entry.insts = Some(i);
                        entry.xclbin = Some(x);
                        entry.pdi = Some(p);
                        built += 1;
                    }
                    Err(e) => entry.aiecc_error = Some(e),
                }
            }
            format!("aiecc ({}) built device artifacts for {built} of {} designs", tool.display(), plan.designs.len())
        }
    };
    plan_file.artifacts = Some(artifacts.clone());
    w.add_file(PLAN_FILE, &plan_file.encode()).context("storing the XDNA plan")?;
    let designs: Vec<Value> = plan
        .designs
        .values()
        .map(|d| {
            let t = &d.tiling;
            json!({
                "name": d.name,
                "kind": match d.kind {
                    codegen_aie::design::Kind::Gemm => "gemm",
                    codegen_aie::design::Kind::Gemv => "gemv",
                    codegen_aie::design::Kind::QGemv { .. } => "qgemv",
                },
                "shape": [t.shape.m, t.shape.k, t.shape.n],
                "padded": [t.padded.m, t.padded.k, t.padded.n],
                "tile": [t.m, t.k, t.n],
                "build": plan::build_command(&d.name),
                "l1_bytes": t.l1_bytes,
                "l2_bytes": t.l2_bytes,
                "predicted_utilisation": t.utilisation,
            })
        })
        .collect();
    Ok(json!({
        "device": device.name(),
        "cost_model": cost_model(g, &plan),
        "host_threshold_rows": plan.options.host_threshold_rows,
        "gemv_rows": plan.gemv_rows,
        "projections": plan.gemms.len(),
        "projections_with_designs": plan.gemms.iter().filter(|g| !g.chunks.is_empty()).count(),
        "designs": designs,
        "chains": chains_summary(&plan),
        "mlir": verified,
        "artifacts": artifacts,
    }))
}

/// Decode's chained projections (each a run of nodes one qgemv design call a column chunk
/// computes) and why each other projection is not one.
fn chains_summary(plan: &plan::Plan) -> Value {
    let chained: Vec<Value> = plan
        .chains
        .iter()
        .map(|c| {
            json!({
                "qgemm": c.site.qgemm,
                "feed": c.site.feed.operand(),
                "pairs": c.site.pairs,
                "sum": c.site.sum,
                "nodes": c.site.nodes.len(),
                "designs": c.chunks.iter().map(|d| d.design.as_str()).collect::<Vec<_>>(),
            })
        })
        .collect();
    let unchained: Vec<Value> =
        plan.unchained.iter().map(|(node, reason)| json!({ "qgemm": node, "reason": reason })).collect();
    let programs: Vec<Value> = plan
        .programs
        .iter()
        .map(|p| json!({ "name": p.name, "chains": p.chains().iter().map(|&c| &plan.chains[c].site.qgemm).collect::<Vec<_>>() }))
        .collect();
    json!({ "rows": plan::CHAIN_ROWS, "chained": chained, "unchained": unchained, "programs": programs })
}

/// Prompt tokens of the cost model's prefill (the context published NPU rates are quoted at).
const COST_PROMPT_TOKENS: usize = 1024;

/// The nodes writing a graph output, and the QGemms whose sum does (`array-int8` adds a
/// projection's passes: the lm_head's QGemms write the logits through those Adds).
fn output_writers(g: &Graph) -> Vec<&str> {
    let producer = |v: ir::ValueId| match g.value(v).def {
        ir::graph::ValueDef::Node { node, .. } => Some(g.node(node)),
        _ => None,
    };
    let is_pass_sum = |n: &ir::Node| {
        n.op == "Add"
            && n.inputs.iter().flatten().all(|&v| producer(v).is_some_and(|p| matches!(p.op, "QGemm" | "Add")))
    };
    let mut pending: Vec<ir::ValueId> = g.outputs.clone();
    let mut names = Vec::new();
    while let Some(n) = pending.pop().and_then(producer) {
        names.push(n.name.as_str());
        if is_pass_sum(n) {
            pending.extend(n.inputs.iter().flatten());
        }
    }
    names
}

/// The cost model's prediction (`codegen_aie::cost`) for a prefill of [`COST_PROMPT_TOKENS`],
/// the projections writing a graph output (the lm_head) computed for the last row only, as the
/// executor does, and its assumptions; and per device (`npu1`, `npu2`: the program planned for
/// each) the decode prediction.
fn cost_model(g: &Graph, plan: &plan::Plan) -> Value {
    let outputs = output_writers(g);
    let last_row_only = |s: &codegen_aie::gemm::GemmSite| outputs.contains(&s.node.as_str());
    let p = codegen_aie::cost::predict(plan, COST_PROMPT_TOKENS, &last_row_only);
    let device = plan.options.device;
    let decode: Vec<Value> = [Device::Npu1, Device::Npu2]
        .into_iter()
        .map(|d| {
            let prediction = if d == device {
                Ok(p)
            } else {
                plan::plan(g, PlanOptions::new(d))
                    .map(|other| codegen_aie::cost::predict(&other, COST_PROMPT_TOKENS, &last_row_only))
            };
            match prediction {
                Ok(p) => decode_entry(d, &p),
                Err(e) => json!({ "device": d.name(), "error": e.to_string() }),
            }
        })
        .collect();
    json!({
        "prediction": p,
        "decode_by_device": decode,
        "clock_hz": device.clock_hz(),
        "dispatch_seconds": codegen_aie::cost::DISPATCH_SECONDS,
        "shim_bytes_per_second": device.shim_bytes_per_second(),
        "shim_burst_bytes": codegen_aie::gemv::SHIM_BURST_BYTES,
    })
}

/// One device's decode prediction and the assumptions it rests on.
fn decode_entry(d: Device, p: &codegen_aie::cost::Prediction) -> Value {
    json!({
        "device": d.name(),
        "calls_per_token": p.decode_calls,
        "chained_projections": p.decode_chains,
        "array_seconds": p.decode_array_seconds,
        "dispatch_seconds": p.decode_dispatch_seconds,
        "decode_tok_s": p.decode_tok_s,
        "decode_tok_s_bound": p.decode_tok_s_bound,
        "weight_bytes_per_token": p.decode_weight_bytes,
        "clock_hz": d.clock_hz(),
        "shim_bytes_per_second": d.shim_bytes_per_second(),
        "weight_streams": codegen_aie::gemv::streams(d),
    })
}

/// Human-readable lines for the compile summary.
pub fn summary_lines(v: &Value) -> Vec<String> {
    let mut out = vec![format!(
        "xdna ({}): {} of {} projection GEMMs have designs; calls below {} rows run on the GEMV designs in blocks of {}; {}; {}",
        v["device"].as_str().unwrap_or("?"),
        v["projections_with_designs"],
        v["projections"],
        v["host_threshold_rows"],
        v["gemv_rows"],
        v["mlir"].as_str().unwrap_or(""),
        v["artifacts"].as_str().unwrap_or("")
    )];
    let c = &v["cost_model"];
    let p = &c["prediction"];
    let num = |x: &Value| x.as_f64().unwrap_or(0.0);
    out.push(format!(
        "  cost model ({:.1} GHz, {:.0} µs per call; host work not counted): prefill of {} tokens {:.1} ms on the array in {} calls + {:.1} ms of dispatch, {:.0} tok/s; decode reads {:.1} MB of int8 weights per token, the floor {:.0} tok/s over {:.0} GB/s of shim DMA",
        num(&c["clock_hz"]) / 1e9,
        num(&c["dispatch_seconds"]) * 1e6,
        p["prompt_tokens"],
        num(&p["prefill_array_seconds"]) * 1e3,
        p["prefill_calls"],
        num(&p["prefill_dispatch_seconds"]) * 1e3,
        num(&p["prefill_tok_s"]),
        num(&p["decode_weight_bytes"]) / 1e6,
        num(&p["decode_tok_s_bound"]),
        num(&c["shim_bytes_per_second"]) / 1e9,
    ));
    for d in c["decode_by_device"].as_array().into_iter().flatten() {
        out.push(match d["error"].as_str() {
            Some(e) => format!("  decode on {}: no plan ({e})", d["device"].as_str().unwrap_or("?")),
            None => format!(
                "  decode on {} ({} projections chained on qgemv designs, the rest on GEMV designs; {} weight streams, {}-byte shim bursts): {} calls per token, {:.2} ms on the array + {:.2} ms of dispatch: {:.1} tok/s (floor {:.1})",
                d["device"].as_str().unwrap_or("?"),
                d["chained_projections"],
                d["weight_streams"],
                c["shim_burst_bytes"],
                d["calls_per_token"],
                num(&d["array_seconds"]) * 1e3,
                num(&d["dispatch_seconds"]) * 1e3,
                num(&d["decode_tok_s"]),
                num(&d["decode_tok_s_bound"]),
            ),
        });
    }
    out.extend(chain_lines(&v["chains"]));
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
    out.push(format!(
        "  device artifacts: in the bundle's folder, with mlir-aie's {} and the Peano compiler (PEANO_INSTALL_DIR) installed, per design:",
        plan::AIECC
    ));
    for d in v["designs"].as_array().into_iter().flatten() {
        out.push(format!("    {}", d["build"].as_str().unwrap_or("?")));
    }
    out
}

/// The summary's lines on decode's chained projections.
fn chain_lines(c: &Value) -> Vec<String> {
    let chained = c["chained"].as_array().map_or(0, Vec::len);
    let unchained = c["unchained"].as_array().cloned().unwrap_or_default();
    let programs = c["programs"].as_array().map_or(0, Vec::len);
    let layers = c["programs"]
        .as_array()
        .map_or(0, |ps| ps.iter().filter(|p| p["chains"].as_array().is_some_and(|c| c.len() == 3)).count());
    let sums = c["chained"].as_array().map_or(0, |cs| cs.iter().filter(|c| c["sum"].is_string()).count());
    let mut out = vec![format!(
        "  decode steps of {} row: {chained} projections chained (quantisation, GEMV and passes' sum in one qgemv call a chunk; {sums} of them add the residual stream in front of their norm too), {programs} MLPs as one array program each (gate/up, then down on the row it wrote: one command; {layers} of them with the attention's output projection in front, writing the row the gate/up design adds to the residual stream), {} projections not chained:",
        c["rows"],
        unchained.len()
    )];
    out.extend(
        unchained
            .iter()
            .map(|u| format!("    {}: {}", u["qgemm"].as_str().unwrap_or("?"), u["reason"].as_str().unwrap_or("?"))),
    );
    out
}

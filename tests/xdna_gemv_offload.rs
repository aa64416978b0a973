//! Decode on the array: an xdna bundle's plan routes calls under the threshold (a decode step's
//! one row, a short verify block) to its GEMV designs in blocks of 8 rows, and through the
//! amdxdna ioctls (against the driver model, whose firmware runs each design's text in the
//! interpreter) every decode step's projection calls run on those designs — and only those —
//! with the host int8 program's logits bit for bit.

mod common;

use runtime::bundle::xdna::{DesignKind, XdnaPlan, PLAN_FILE, PLAN_FORMAT};
use runtime::bundle::Bundle;
use std::path::Path;
use std::process::Command;

/// `npuc compile MODEL --target xdna --device npu1` into `dir`.
fn compile(name: &str, dir: &Path) -> Bundle {
    let out = dir.join(format!("{name}.npub"));
    let model = common::model(name);
    let args =
        ["compile", model.to_str().unwrap(), "--target", "xdna", "--device", "npu1", "-o", out.to_str().unwrap()];
    let run = Command::new(env!("CARGO_BIN_EXE_npuc")).args(args).output().unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(stdout.contains("decode on npu1 (GEMV designs") && stdout.contains("decode on npu2"), "{stdout}");
    Bundle::open(&out, Some("xdna")).unwrap()
}

#[test]
fn the_compile_summary_predicts_decode_on_npu1_and_npu2_under_the_bandwidth_floor() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::model("llama-optimum");
    let out = tmp.path().join("llama.npub");
    let args = ["compile", model.to_str().unwrap(), "--target", "xdna", "-o", out.to_str().unwrap(), "--json"];
    let run = Command::new(env!("CARGO_BIN_EXE_npuc")).args(args).output().unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let summary: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    let decode = summary["xdna"]["cost_model"]["decode_by_device"].as_array().unwrap().clone();
    let devices: Vec<&str> = decode.iter().map(|d| d["device"].as_str().unwrap()).collect();
    assert_eq!(devices, ["npu1", "npu2"]);
    let rate = |d: &serde_json::Value, k: &str| d[k].as_f64().unwrap();
    for d in &decode {
        assert!(rate(d, "decode_tok_s") > 0.0 && rate(d, "decode_tok_s") < rate(d, "decode_tok_s_bound"), "{d}");
        let calls = d["calls_per_token"].as_f64().unwrap();
        assert!((rate(d, "dispatch_seconds") - calls * 20e-6).abs() < 1e-9, "{d}");
    }
    assert!(rate(&decode[1], "decode_tok_s") > rate(&decode[0], "decode_tok_s"), "npu2 decodes faster");
    assert_eq!(decode[0]["calls_per_token"], decode[1]["calls_per_token"], "one GEMV call per chunk on either");
}

#[test]
fn every_projection_has_a_gemv_design_and_decode_rows_are_routed_to_it() {
    let tmp = tempfile::tempdir().unwrap();
    let bundle = compile("llama-optimum", tmp.path());
    let plan = XdnaPlan::decode(&bundle.read_file(PLAN_FILE).unwrap()).unwrap();
    assert_eq!((plan.format.as_str(), plan.gemv_rows, plan.host_threshold_rows), (PLAN_FORMAT, 8, 16));
    for rows in [1, 8] {
        assert_eq!(plan.route(rows), Some(vec![(8, rows)]), "{rows} rows: one GEMV block");
    }
    assert_eq!(plan.route(12), Some(vec![(8, 8), (8, 4)]));
    assert_eq!(plan.route(16).unwrap()[0].0, plan.decode_rows, "16 rows go to the GEMM designs");
    for g in &plan.gemms {
        let calls = plan.calls(g, g.site.passes).unwrap_or_else(|| panic!("{} has no GEMV design", g.site.node));
        let covered: usize = calls.iter().map(|c| c.cols).sum();
        assert_eq!(covered, g.site.n, "{}: one row's GEMV blocks cover every column once", g.site.node);
        for c in calls {
            let (name, d) = (c.design, plan.design(c.design).unwrap());
            assert_eq!((d.kind, d.tiling.shape.m, d.tiling.shape.k), (DesignKind::Gemv, 8, g.site.k), "{name}");
            assert_eq!((c.first, c.used, c.block_rows), (0, g.site.passes, 8), "{name}");
            assert!(d.tiling.shape.n >= c.cols && d.array_columns == 4, "{name}");
            let text = String::from_utf8(bundle.read_file(&d.file).unwrap()).unwrap();
            assert!(text.contains("@gemv_i8_i32") && text.contains("npuc.design = \"gemv\""), "{name}");
        }
    }
}

/// The design each command ran, by the `aie.device`'s name in the PDI (a design's text here).
#[cfg(feature = "xrt")]
fn recording_sim(ran: std::sync::Arc<std::sync::Mutex<Vec<String>>>) -> codegen_aie::amdxdna::sim::Sim {
    use codegen_aie::amdxdna::sim::{npu1_metadata, Firmware, Sim};
    let firmware: Firmware = Box::new(move |pdi, _insts, buffers| {
        let text = std::str::from_utf8(pdi)?;
        // The device's attributes close its region: `}) {device = 4 : i32, sym_name = "NAME"}`.
        let attrs = text.split("{device = ").nth(1).and_then(|s| s.split("sym_name = \"").nth(1));
        let design = attrs.and_then(|s| s.split('"').next()).unwrap_or("?");
        ran.lock().unwrap().push(design.to_string());
        let ins: Vec<Vec<i8>> =
            buffers[..buffers.len() - 1].iter().map(|b| b.iter().map(|&x| x as i8).collect()).collect();
        let refs: Vec<&[i8]> = ins.iter().map(|v| v.as_slice()).collect();
        let (c, _) = codegen_aie::interp::run(text, &refs)?;
        Ok(c.iter().flat_map(|v| v.to_le_bytes()).collect())
    });
    Sim::new(npu1_metadata(), firmware)
}

/// Bit patterns of two logit vectors that differ.
#[cfg(feature = "xrt")]
fn differing(a: &[f32], b: &[f32]) -> usize {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count()
}

/// A 20-token prefill (GEMM designs), three one-token decode steps and a 6-token step (its
/// stacked activation passes two GEMV blocks) on the host and through the driver model: equal
/// logits, and the designs each step ran are GEMMs for the prefill and GEMVs for the rest, one
/// command per QGemm call and column chunk and block.
#[cfg(feature = "xrt")]
#[test]
fn decode_steps_run_their_projections_on_the_gemv_designs_with_the_host_logits() {
    use runtime::exec::{ExecOptions, Executor};
    use std::sync::{Arc, Mutex};
    let tmp = tempfile::tempdir().unwrap();
    let compiled = compile("llama-optimum", tmp.path());
    let plan = XdnaPlan::decode(&compiled.read_file(PLAN_FILE).unwrap()).unwrap();
    let add: Vec<(String, Vec<u8>)> = plan
        .designs
        .iter()
        .flat_map(|d| [(d.pdi_file(), compiled.read_file(&d.file).unwrap()), (d.insts_file(), vec![0u8; 64])])
        .collect();
    let with = tmp.path().join("with_artifacts.npub");
    common::copy_bundle_adding_files(&compiled, &with, &add);
    let bundle = Bundle::open(&with, Some("xdna")).unwrap();
    let options = || ExecOptions { threads: 2, max_context: 128, ..ExecOptions::default() };
    let ran = Arc::new(Mutex::new(Vec::new()));
    let npu = xdna_driver::Npu::with_driver(recording_sim(ran.clone())).unwrap();
    let mut host = Executor::new(&bundle, options()).unwrap();
    let mut array = Executor::new(&bundle, options()).unwrap();
    array.set_offload(Box::new(runtime::xdna::XdnaOffload::new(npu, &bundle).unwrap()));
    // Commands of a step: every call's blocks (its rows are the tokens times its stacked
    // passes) over its column chunks, as the plan lists them.
    let commands = |tokens: usize| -> usize {
        plan.gemms.iter().map(|g| plan.calls(g, tokens * g.site.passes).unwrap().len()).sum()
    };
    assert!(plan.gemms.iter().any(|g| g.site.passes == 2), "the activations' passes are stacked");
    let qgemms = plan.gemms.len() as u64;
    let prompt: Vec<u32> = (0..20).map(|i| (i * 37 + 5) % 500).collect();
    let verify: Vec<u32> = (0..6).map(|i| (i * 41 + 3) % 500).collect();
    assert!(commands(6) > commands(1), "a 6-token step's stacked passes take two GEMV blocks");
    let steps: [(&[u32], &str); 5] =
        [(&prompt, "gemm_"), (&[7], "gemv_"), (&[11], "gemv_"), (&[13], "gemv_"), (&verify, "gemv_")];
    for (tokens, kind) in steps {
        let want = host.step(tokens).unwrap().to_vec();
        let before = array.offloaded_calls();
        let got = array.step(tokens).unwrap().to_vec();
        assert_eq!(differing(&got, &want), 0, "{} tokens: logits that differ from the host's", tokens.len());
        assert_eq!(array.offloaded_calls() - before, qgemms, "{} tokens: every QGemm call offloaded", tokens.len());
        let mut names = std::mem::take(&mut *ran.lock().unwrap());
        assert_eq!(names.len(), commands(tokens.len()), "{} tokens: commands", tokens.len());
        names.sort_unstable();
        names.dedup();
        assert!(names.iter().all(|n| n.starts_with(kind)), "{} tokens ran {names:?}", tokens.len());
    }
}

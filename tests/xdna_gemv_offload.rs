//! Decode on the array: an xdna bundle's plan routes calls under the threshold (a decode step's
//! one row, a short verify block) to its GEMV designs in blocks of 8 rows, and a one-row step's
//! chained projections (quantisation, GEMV and the passes' sum) to one qgemv design call each;
//! through the amdxdna ioctls (against the driver model, whose firmware runs each design's text
//! in the interpreter) every decode step's projections run on those designs — and only those —
//! with the host int8 program's logits bit for bit.

mod common;

use runtime::bundle::xdna::{DesignKind, XdnaPlan, PLAN_FILE, PLAN_FORMAT};
use runtime::bundle::Bundle;
use std::collections::BTreeSet;
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
    assert!(stdout.contains("decode on npu1 (") && stdout.contains("decode on npu2 ("), "{stdout}");
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
    assert_eq!(decode[0]["calls_per_token"], decode[1]["calls_per_token"], "one call per chunk on either");
    // The calls the cost model counts are the runtime's for a one-row step: a chained
    // projection's chunks, every other one's GEMV blocks, as the bundle's plan routes them.
    let bundle = Bundle::open(&out, Some("xdna")).unwrap();
    let plan = XdnaPlan::decode(&bundle.read_file(PLAN_FILE).unwrap()).unwrap();
    let chained = |node: &str| plan.chains.iter().any(|c| c.qgemm == node);
    let gemv: usize =
        plan.gemms.iter().filter(|g| !chained(&g.site.node)).map(|g| plan.calls(g, g.site.passes).unwrap().len()).sum();
    let chunks: usize = plan.chains.iter().map(|c| c.chunks.len()).sum();
    assert_eq!(decode[0]["calls_per_token"], gemv + chunks);
    assert_eq!(decode[0]["chained_projections"], plan.chains.len());
    assert!(plan.chains.len() == 4 && gemv == 5, "o and down chained, q/k/v, gate/up and the lm_head not");
    // The others are fed by norms whose γ (random, as the fixture's weights) is not bfloat16.
    let unchained = summary["xdna"]["chains"]["unchained"].as_array().unwrap();
    assert_eq!(unchained.len(), 5);
    for u in unchained {
        assert!(u["reason"].as_str().unwrap().contains("is not bfloat16, which a core multiplies by"), "{u}");
    }
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
    use codegen_aie::amdxdna::sim::{npu1_metadata, run_design, Firmware, Sim};
    let firmware: Firmware = Box::new(move |pdi, _insts, buffers| {
        let text = std::str::from_utf8(pdi)?;
        // The device's attributes close its region: `}) {device = 4 : i32, sym_name = "NAME"}`.
        let attrs = text.split("{device = ").nth(1).and_then(|s| s.split("sym_name = \"").nth(1));
        let design = attrs.and_then(|s| s.split('"').next()).unwrap_or("?");
        ran.lock().unwrap().push(design.to_string());
        run_design(pdi, buffers)
    });
    Sim::new(npu1_metadata(), firmware)
}

/// `compiled` with each design's and program's text as its PDI (what the driver model's
/// firmware runs) and an instruction stream of 64 zero bytes, as `with_artifacts.npub` in `dir`.
#[cfg(feature = "xrt")]
fn with_design_texts(compiled: &Bundle, plan: &XdnaPlan, dir: &Path) -> Bundle {
    with_artifacts(compiled, plan, dir, true)
}

/// [`with_design_texts`], the programs' artifacts only with `programs`.
#[cfg(feature = "xrt")]
fn with_artifacts(compiled: &Bundle, plan: &XdnaPlan, dir: &Path, programs: bool) -> Bundle {
    let designs = plan.designs.iter().map(|d| (d.pdi_file(), d.insts_file(), &d.file));
    let mut names = BTreeSet::new();
    let with_programs = programs;
    let programs = plan
        .programs
        .iter()
        .filter(|p| with_programs && names.insert(&p.name))
        .map(|p| (p.pdi_file(), p.insts_file(), &p.file));
    let add: Vec<(String, Vec<u8>)> = designs
        .chain(programs)
        .flat_map(|(pdi, insts, text)| [(pdi, compiled.read_file(text).unwrap()), (insts, vec![0u8; 64])])
        .collect();
    let with = dir.join("with_artifacts.npub");
    common::copy_bundle_adding_files(compiled, &with, &add);
    Bundle::open(&with, Some("xdna")).unwrap()
}

/// Bit patterns of two logit vectors that differ.
#[cfg(feature = "xrt")]
fn differing(a: &[f32], b: &[f32]) -> usize {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count()
}

/// A 20-token prefill (GEMM designs), three one-token decode steps and a 6-token step (its
/// stacked activation passes two GEMV blocks) on the host and through the driver model: equal
/// logits, and the designs each step ran are GEMMs for the prefill, and for the rest qgemv
/// designs for the chains (one-row ones, or the 8-row block's for the 6-token step) and GEMVs
/// for the other projections, one command per call, column chunk and block.
#[cfg(feature = "xrt")]
#[test]
fn decode_steps_run_their_projections_on_the_gemv_designs_with_the_host_logits() {
    use runtime::exec::{ExecOptions, Executor};
    use std::sync::{Arc, Mutex};
    let tmp = tempfile::tempdir().unwrap();
    let compiled = compile("llama-optimum", tmp.path());
    let plan = XdnaPlan::decode(&compiled.read_file(PLAN_FILE).unwrap()).unwrap();
    let bundle = with_design_texts(&compiled, &plan, tmp.path());
    let options = || ExecOptions { threads: 2, max_context: 128, ..ExecOptions::default() };
    let ran = Arc::new(Mutex::new(Vec::new()));
    let npu = xdna_driver::Npu::with_driver(recording_sim(ran.clone())).unwrap();
    let mut host = Executor::new(&bundle, options()).unwrap();
    let mut array = Executor::new(&bundle, options()).unwrap();
    array.set_offload(Box::new(runtime::xdna::XdnaOffload::new(npu, &bundle).unwrap())).unwrap();
    // Commands of a step: a one-row step's chains one call a column chunk; every other call's
    // blocks (its rows are the tokens times its stacked passes) over its column chunks, as the
    // plan lists them.
    // A one-row step's chains on their one-row designs, a verify step's (up to 8 rows) on their
    // block's designs, one of 9-15 rows on them a block at a time.
    let chained = |g: &&runtime::bundle::xdna::PlanGemm| plan.chains.iter().any(|c| c.qgemm == g.site.node);
    let chain_chunks = |tokens: usize| -> usize {
        let of = |c: &runtime::bundle::xdna::PlanChain| match tokens {
            1 => c.chunks.len(),
            2..=8 => c.block_chunks.len(),
            9..=15 => 2 * c.block_chunks.len(),
            _ => 0,
        };
        plan.chains.iter().map(of).sum()
    };
    let commands = |tokens: usize| -> usize {
        let gemms = plan.gemms.iter().filter(|g| tokens > 15 || !chained(g));
        let gemv: usize = gemms.map(|g| plan.calls(g, tokens * g.site.passes).unwrap().len()).sum();
        gemv + chain_chunks(tokens)
    };
    assert_eq!(plan.chains.len(), 4, "o and down of both layers are chained");
    assert!(plan.chains.iter().all(|c| c.block_rows == 8 && !c.block_chunks.is_empty()), "{:?}", plan.chains);
    assert!(plan.gemms.iter().any(|g| g.site.passes == 2), "the activations' passes are stacked");
    let qgemms = plan.gemms.len() as u64;
    let prompt: Vec<u32> = (0..20).map(|i| (i * 37 + 5) % 500).collect();
    let verify: Vec<u32> = (0..6).map(|i| (i * 41 + 3) % 500).collect();
    let long_verify: Vec<u32> = (0..12).map(|i| (i * 43 + 9) % 500).collect();
    assert!(commands(6) > commands(1), "a 6-token step's stacked passes take two GEMV blocks");
    let chains = plan.chains.len() as u64;
    let (gemm, gemv, qgemv) = (DesignKind::Gemm, DesignKind::Gemv, DesignKind::Qgemv);
    let steps: [(&[u32], &[DesignKind]); 6] = [
        (&prompt, &[gemm]),
        (&[7], &[gemv, qgemv]),
        (&[11], &[gemv, qgemv]),
        (&[13], &[gemv, qgemv]),
        (&verify, &[gemv, qgemv]),
        // Its other projections' 12 tokens in two passes are 24 rows: the GEMM designs'.
        (&long_verify, &[gemm, qgemv]),
    ];
    for (tokens, kinds) in steps {
        let want = host.step(tokens).unwrap().to_vec();
        let before = (array.offloaded_calls(), array.offloaded_chains());
        let got = array.step(tokens).unwrap().to_vec();
        let n = tokens.len();
        assert_eq!(differing(&got, &want), 0, "{n} tokens: logits that differ from the host's");
        let step_chains = if n <= 15 { chains } else { 0 };
        assert_eq!(array.offloaded_chains() - before.1, step_chains, "{n} tokens: chains");
        assert_eq!(array.offloaded_calls() - before.0, qgemms - step_chains, "{n} tokens: every other QGemm call");
        let mut names = std::mem::take(&mut *ran.lock().unwrap());
        assert_eq!(names.len(), commands(n), "{n} tokens: commands");
        names.sort_unstable();
        names.dedup();
        let ran_kinds: BTreeSet<DesignKind> = names.iter().map(|name| plan.design(name).unwrap().kind).collect();
        assert_eq!(ran_kinds, kinds.iter().copied().collect(), "{n} tokens ran {names:?}");
    }
}

/// SmolLM2's xdna bundle (γ of bfloat16 values, as it was trained): every projection of a
/// decode step chained — q/k/v and gate/up fed by their norms (and the residual sums in front
/// of them), o by the attention's rows, down by the gate, the lm_head by the final norm — each
/// layer's o, gate/up and down one array program, and the
/// step's logits through the driver model equal the host's bit for bit. The prompt runs on the host (its GEMM designs would take the
/// interpreter minutes); the offload is installed for the decode steps.
#[cfg(feature = "xrt")]
#[test]
fn smollm2s_decode_steps_run_every_projection_chained_and_each_layer_after_attention_as_one_program_with_the_host_logits(
) {
    use runtime::bundle::xdna::QgemvFeed;
    use runtime::exec::{ExecOptions, Executor};
    use std::sync::{Arc, Mutex};
    let tmp = tempfile::tempdir().unwrap();
    let compiled = compile("smollm2-optimum", tmp.path());
    let plan = XdnaPlan::decode(&compiled.read_file(PLAN_FILE).unwrap()).unwrap();
    let feeds: BTreeSet<QgemvFeed> = plan.chains.iter().map(|c| c.feed).collect();
    assert_eq!(plan.chains.len(), plan.gemms.len(), "every projection chained");
    assert_eq!(feeds, [QgemvFeed::Rows, QgemvFeed::Norm, QgemvFeed::Gate, QgemvFeed::SumNorm].into_iter().collect());
    // Every norm-fed chain but the first layer's q/k/v (the embedding's rows, no sum) takes the
    // residual Add in front of its norm: 29 q/k/v, 30 gate/up, the lm_head.
    let sums: Vec<&str> = plan.chains.iter().filter_map(|c| c.sum.as_deref()).collect();
    assert_eq!(sums.len(), 60, "{sums:?}");
    let bundle = with_design_texts(&compiled, &plan, tmp.path());
    let options = || ExecOptions { threads: 2, max_context: 64, ..ExecOptions::default() };
    let ran = Arc::new(Mutex::new(Vec::new()));
    let npu = xdna_driver::Npu::with_driver(recording_sim(ran.clone())).unwrap();
    let mut host = Executor::new(&bundle, options()).unwrap();
    let mut array = Executor::new(&bundle, options()).unwrap();
    let prompt = [1u32, 9690, 314, 253, 2113];
    assert_eq!(differing(array.step(&prompt).unwrap(), host.step(&prompt).unwrap()), 0);
    let offload = runtime::xdna::XdnaOffload::new(npu, &bundle).unwrap();
    // A program runs its one-row designs only: a verify step of more rows runs its phases'
    // nodes off it (their projections on the GEMV designs), the other chains on their blocks
    // (steps of up to 15 rows, a block of 8 at a time).
    let units = runtime::exec::GemmOffload::chains(&offload);
    let rows: BTreeSet<(usize, usize)> = units.iter().map(|u| (u.qgemms.len(), u.rows)).collect();
    assert_eq!(rows, [(1, 15), (3, 1)].into_iter().collect(), "chains on 8-row blocks, programs one row");
    array.set_offload(Box::new(offload)).unwrap();
    for token in [28, 1392] {
        let want = host.step(&[token]).unwrap().to_vec();
        let got = array.step(&[token]).unwrap().to_vec();
        assert_eq!(differing(&got, &want), 0, "token {token}: logits that differ from the host's");
    }
    // Each layer's o, gate/up and down one program (o writing the row gate/up adds to the
    // residual stream, down on the row gate/up wrote), the other chains a call a chunk: q/k/v
    // and the lm_head's three chunks.
    assert_eq!(plan.programs.len(), 30, "one program a layer");
    assert!(plan.programs.iter().all(|p| p.chains.len() == 3), "o, gate/up and down in each");
    let in_program = |c: usize| plan.programs.iter().any(|p| p.chains.contains(&c));
    let alone: Vec<usize> = (0..plan.chains.len()).filter(|&c| !in_program(c)).collect();
    assert_eq!(array.offloaded_chains(), 2 * (plan.programs.len() + alone.len()) as u64);
    assert_eq!(array.offloaded_calls(), 0, "no projection left to the GEMV designs");
    let chunks: usize = alone.iter().map(|&c| plan.chains[c].chunks.len()).sum();
    let ran = std::mem::take(&mut *ran.lock().unwrap());
    assert_eq!(ran.len(), 2 * (plan.programs.len() + chunks), "one command a program and a chain's chunk");
    assert_eq!(ran.len(), 2 * (30 + 30 + 3), "a program and q/k/v a layer, the lm_head's chunks");
    assert_eq!(ran.iter().filter(|d| d.starts_with("layer_")).count(), 2 * plan.programs.len(), "{ran:?}");
    // Without the programs' artifacts, each layer runs as its three chains, and the offload says so.
    let designs_only = tmp.path().join("designs_only");
    std::fs::create_dir(&designs_only).unwrap();
    let bundle = with_artifacts(&compiled, &plan, &designs_only, false);
    let npu = xdna_driver::Npu::with_driver(recording_sim(Arc::new(Mutex::new(Vec::new())))).unwrap();
    let offload = runtime::xdna::XdnaOffload::new(npu, &bundle).unwrap();
    assert_eq!(offload.unbuilt_programs.len(), plan.programs.len());
    use runtime::exec::GemmOffload;
    assert_eq!(offload.chains().len(), plan.chains.len(), "every chain its own call");
}

/// An offload that computes no product and asks for the chains it is given.
struct AsksFor(Vec<runtime::exec::OffloadChain>);

impl runtime::exec::GemmOffload for AsksFor {
    fn products(
        &mut self,
        _: &str,
        _: runtime::kernels::qgemm::QActivations<'_>,
        _: usize,
        _: runtime::kernels::qgemm::QGemmWeights<'_>,
    ) -> Result<Option<Vec<i32>>, runtime::exec::OffloadError> {
        Ok(None)
    }

    fn chains(&self) -> Vec<runtime::exec::OffloadChain> {
        self.0.clone()
    }
}

#[test]
fn an_offloads_chain_that_does_not_fit_the_program_is_refused_naming_why() {
    use runtime::exec::{ExecOptions, Executor, OffloadChain};
    let tmp = tempfile::tempdir().unwrap();
    let bundle = compile("llama-optimum", tmp.path());
    let plan = XdnaPlan::decode(&bundle.read_file(PLAN_FILE).unwrap()).unwrap();
    let c = &plan.chains[0];
    let good = OffloadChain {
        nodes: c.nodes.clone(),
        qgemms: vec![c.qgemm.clone()],
        inputs: c.inputs.clone(),
        outputs: vec![c.output.clone()],
        rows: 1,
    };
    let mut exec = Executor::new(&bundle, ExecOptions::default()).unwrap();
    exec.set_offload(Box::new(AsksFor(vec![good.clone()]))).unwrap();
    let refused = |chain: OffloadChain| {
        let mut exec = Executor::new(&bundle, ExecOptions::default()).unwrap();
        exec.set_offload(Box::new(AsksFor(vec![chain]))).unwrap_err().to_string()
    };
    // The passes' sum left out: its Slices' outputs are read outside the chain.
    let err = refused(OffloadChain { nodes: c.nodes[..c.nodes.len() - 1].to_vec(), ..good.clone() });
    assert!(err.contains(&format!("QGemm `{}`", c.qgemm)) && err.contains("which the chain computes"), "{err}");
    let err = refused(OffloadChain { inputs: vec!["no_such_value".into()], ..good.clone() });
    assert!(err.contains("`no_such_value` is no value of the program"), "{err}");
    let err =
        refused(OffloadChain { nodes: c.nodes.iter().filter(|n| **n != c.qgemm).cloned().collect(), ..good.clone() });
    assert!(err.contains("is no QGemm op of the chain"), "{err}");
    let err = refused(OffloadChain { qgemms: vec![], ..good.clone() });
    assert!(err.contains("names no QGemm"), "{err}");
    let err = refused(OffloadChain { outputs: vec![], ..good });
    assert!(err.contains("writes no output"), "{err}");
}

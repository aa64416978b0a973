//! `npuc bench`: prefill and decode rates of a bundle on the host executor (or, with
//! `--backend openvino`, an intel-npu bundle's IR on OpenVINO), repeated, with median/min/max.
//! The prompt is synthetic (token ids cycled from 1), so runs are comparable across machines and
//! need no tokenizer; decode never stops early. The greedy tokens of the last run are reported:
//! two backends computing the same numbers give the same tokens.

use anyhow::{Context, Result};
use runtime::bundle::Bundle;
use runtime::exec::{ExecOptions, Executor};
use runtime::kernels::wgemm::WGemmPrecision;
use runtime::kvcache::KvStorage;
use serde_json::json;
use std::path::PathBuf;
use std::process::ExitCode;

pub struct Options {
    pub bundle: PathBuf,
    pub prompt_len: usize,
    pub gen_len: usize,
    pub threads: usize,
    pub repetitions: usize,
    pub int8_activations: bool,
    pub kv_storage: KvStorage,
    pub json: bool,
    pub backend: crate::run_openvino::BackendArgs,
}

/// The synthetic prompt: ids cycled from 1 below `vocab`.
fn synthetic_prompt(len: usize, vocab: usize) -> Vec<u32> {
    let vocab = vocab.max(2) as u32;
    (0..len as u32).map(|i| 1 + i % (vocab - 1)).collect()
}

/// (median, min, max) of a non-empty sample.
fn spread(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

/// Prefill and decode rates of `o.repetitions` greedy runs after one untimed run (which warms
/// caches and page tables), and the tokens of the last.
fn measure(exec: &mut Executor, prompt: &[u32], o: &Options) -> Result<(Vec<f64>, Vec<f64>, Vec<u32>)> {
    exec.generate_greedy(prompt, 2, &[], |_| {})?;
    let (mut prefill, mut decode, mut tokens) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..o.repetitions {
        exec.reset()?;
        let (generated, stats) = exec.generate_greedy(prompt, o.gen_len, &[], |_| {})?;
        prefill.push(stats.prefill_tok_s());
        decode.push(stats.decode_tok_s());
        tokens = generated;
    }
    Ok((prefill, decode, tokens))
}

pub fn run(o: Options) -> Result<ExitCode> {
    anyhow::ensure!(
        o.prompt_len > 0 && o.gen_len > 1 && o.repetitions > 0,
        "--prompt-len, --gen-len (> 1) and --repetitions must be positive"
    );
    let bundle = Bundle::open(&o.bundle, None).with_context(|| format!("opening {}", o.bundle.display()))?;
    let offload = match o.backend.backend.as_str() {
        "openvino" => return bench_openvino(&o, &bundle),
        "xrt" => Some(crate::xdna_run::xrt_offload(&bundle)?),
        _ => None,
    };
    let options = ExecOptions {
        threads: o.threads,
        max_context: o.prompt_len + o.gen_len,
        kv_storage: o.kv_storage,
        ..ExecOptions::default()
    };
    let load_started = std::time::Instant::now();
    let mut exec =
        Executor::new(&bundle, options).with_context(|| format!("loading the program of {}", o.bundle.display()))?;
    if let Some(offload) = offload {
        exec.set_offload(offload);
    }
    let load_ms = load_started.elapsed().as_secs_f64() * 1e3;
    let packed_at_load = exec.wgemm_bytes_packed_at_load();
    let q_packed_at_load = exec.qgemm_bytes_packed_at_load();
    let precision = if o.int8_activations { WGemmPrecision::Int8Activations } else { WGemmPrecision::Exact };
    exec.set_wgemm_precision(precision);
    let prompt = synthetic_prompt(o.prompt_len, exec.vocab());
    let (prefill, decode, tokens) = measure(&mut exec, &prompt, &o)?;
    let (pm, pmin, pmax) = spread(prefill);
    let (dm, dmin, dmax) = spread(decode);
    let weight_bytes = exec.gemm_weight_bytes_per_token();
    let weight_gb_s = weight_bytes as f64 * dm / 1e9;
    if o.json {
        let out = json!({
            "bundle": o.bundle.display().to_string(),
            "backend": "host",
            "tokens": tokens,
            "prompt_len": o.prompt_len, "gen_len": o.gen_len, "threads": o.threads,
            "repetitions": o.repetitions, "wgemm_precision": format!("{precision:?}"),
            "kv_dtype": format!("{:?}", o.kv_storage),
            "prefill_tok_s": { "median": pm, "min": pmin, "max": pmax },
            "decode_tok_s": { "median": dm, "min": dmin, "max": dmax },
            "gemm_weight_bytes_per_token": weight_bytes,
            "decode_weight_gb_s": weight_gb_s,
            "load_ms": load_ms,
            "wgemm_bytes_packed_at_load": packed_at_load,
            "qgemm_bytes_packed_at_load": q_packed_at_load,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "{}: prompt {} + {} generated, {} thread(s), {} runs, WGemm {:?}",
            o.bundle.display(),
            o.prompt_len,
            o.gen_len,
            o.threads,
            o.repetitions,
            precision
        );
        println!("prefill tok/s  median {pm:8.1}  min {pmin:8.1}  max {pmax:8.1}");
        println!("decode  tok/s  median {dm:8.1}  min {dmin:8.1}  max {dmax:8.1}");
        println!(
            "GEMM weights read per decode token: {:.1} MB, {weight_gb_s:.1} GB/s at the median decode rate",
            weight_bytes as f64 / 1e6
        );
        println!(
            "program loaded in {load_ms:.1} ms; weights packed at load: WGemm {:.1} MB, QGemm {:.1} MB",
            packed_at_load as f64 / 1e6,
            q_packed_at_load as f64 / 1e6
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `--backend openvino`: the same measurement on the bundle's IR segments (each compiled before
/// the untimed warm-up), prefill as one step over the prompt, decode one token a step.
#[cfg(feature = "openvino")]
fn bench_openvino(o: &Options, bundle: &Bundle) -> Result<ExitCode> {
    let (mut session, networks, compile_ms) =
        crate::run_openvino::open_session(&o.backend, bundle, o.prompt_len + o.gen_len, o.threads)?;
    let prompt = synthetic_prompt(o.prompt_len, bundle.model().vocab);
    session.generate_greedy(&prompt, 2, &[], |_| {})?;
    let (mut prefill, mut decode, mut tokens) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..o.repetitions {
        session.reset()?;
        let started = std::time::Instant::now();
        let mut logits = session.step(&prompt)?;
        let prefill_s = started.elapsed().as_secs_f64();
        let mut generated = vec![runtime::exec::argmax(&logits)];
        let started = std::time::Instant::now();
        while generated.len() < o.gen_len {
            logits = session.step(&generated[generated.len() - 1..])?;
            generated.push(runtime::exec::argmax(&logits));
        }
        prefill.push(prompt.len() as f64 / prefill_s);
        decode.push((o.gen_len - 1) as f64 / started.elapsed().as_secs_f64());
        tokens = generated;
    }
    let (pm, pmin, pmax) = spread(prefill);
    let (dm, dmin, dmax) = spread(decode);
    if o.json {
        let out = json!({
            "bundle": o.bundle.display().to_string(),
            "backend": "openvino", "device": session.device(), "tokens": tokens,
            "prompt_len": o.prompt_len, "gen_len": o.gen_len, "threads": o.threads, "repetitions": o.repetitions,
            "prefill_tok_s": { "median": pm, "min": pmin, "max": pmax },
            "decode_tok_s": { "median": dm, "min": dmin, "max": dmax },
            "networks": networks, "compile_ms": compile_ms,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "{} on openvino {}: prompt {} + {} generated, {} thread(s), {} runs; {networks} networks compiled in {compile_ms:.0} ms",
            o.bundle.display(),
            session.device(),
            o.prompt_len,
            o.gen_len,
            o.threads,
            o.repetitions
        );
        println!("prefill tok/s  median {pm:8.1}  min {pmin:8.1}  max {pmax:8.1}");
        println!("decode  tok/s  median {dm:8.1}  min {dmin:8.1}  max {dmax:8.1}");
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(not(feature = "openvino"))]
fn bench_openvino(_: &Options, _: &Bundle) -> Result<ExitCode> {
    anyhow::bail!("this npuc was built without the `openvino` feature: rebuild with `--features openvino`")
}

//! `npuc bench`: prefill and decode rates of a bundle on the host executor, repeated, with
//! median/min/max. The prompt is synthetic (token ids cycled from 1), so runs are comparable
//! across machines and need no tokenizer; decode never stops early.

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
}

/// (median, min, max) of a non-empty sample.
fn spread(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

pub fn run(o: Options) -> Result<ExitCode> {
    anyhow::ensure!(
        o.prompt_len > 0 && o.gen_len > 1 && o.repetitions > 0,
        "--prompt-len, --gen-len (> 1) and --repetitions must be positive"
    );
    let bundle = Bundle::open(&o.bundle, None).with_context(|| format!("opening {}", o.bundle.display()))?;
    let options = ExecOptions {
        threads: o.threads,
        max_context: o.prompt_len + o.gen_len,
        kv_storage: o.kv_storage,
        ..ExecOptions::default()
    };
    let load_started = std::time::Instant::now();
    let mut exec =
        Executor::new(&bundle, options).with_context(|| format!("loading the program of {}", o.bundle.display()))?;
    let load_ms = load_started.elapsed().as_secs_f64() * 1e3;
    let packed_at_load = exec.wgemm_bytes_packed_at_load();
    let q_packed_at_load = exec.qgemm_bytes_packed_at_load();
    let precision = if o.int8_activations { WGemmPrecision::Int8Activations } else { WGemmPrecision::Exact };
    exec.set_wgemm_precision(precision);
    let vocab = exec.vocab().max(2) as u32;
    let prompt: Vec<u32> = (0..o.prompt_len as u32).map(|i| 1 + i % (vocab - 1)).collect();
    // One untimed run warms caches and page tables.
    exec.generate_greedy(&prompt, 2, &[], |_| {})?;
    let (mut prefill, mut decode) = (Vec::new(), Vec::new());
    for _ in 0..o.repetitions {
        exec.reset()?;
        let (_, stats) = exec.generate_greedy(&prompt, o.gen_len, &[], |_| {})?;
        prefill.push(stats.prefill_tok_s());
        decode.push(stats.decode_tok_s());
    }
    let (pm, pmin, pmax) = spread(prefill);
    let (dm, dmin, dmax) = spread(decode);
    let weight_bytes = exec.gemm_weight_bytes_per_token();
    let weight_gb_s = weight_bytes as f64 * dm / 1e9;
    if o.json {
        let out = json!({
            "bundle": o.bundle.display().to_string(),
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

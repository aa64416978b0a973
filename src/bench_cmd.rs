//! `npuc bench`: prefill and decode rates of a bundle on the host executor (or, with
//! `--backend openvino`, an intel-npu bundle's IR on OpenVINO), repeated, with median/min/max.
//! The prompt is synthetic (token ids cycled from 1), so runs are comparable across machines and
//! need no tokenizer, or a text file's (`--prompt-file`, through the chat template with
//! `--chat`); decode never stops early. The greedy tokens of the last run are reported: two
//! backends computing the same numbers give the same tokens. With `--speculate`, each
//! repetition runs plain and speculative greedy decoding back to back, and both rates, their
//! ratio and the acceptance are reported; the two must give the same tokens.

use crate::run_cmd::Speculation;
use anyhow::{Context, Result};
use runtime::bundle::Bundle;
use runtime::exec::{Drafter, ExecOptions, Executor, OpProfile, PhaseProfile, SpeculationStats};
use runtime::kernels::wgemm::WGemmPrecision;
use runtime::kvcache::KvStorage;
use runtime::sample::Sampler;
use serde_json::json;
use std::path::PathBuf;
use std::process::ExitCode;

/// `npuc bench`'s options.
#[derive(clap::Args, Debug)]
pub struct Options {
    /// The bundle directory (NAME.npub).
    pub bundle: PathBuf,
    /// Prompt tokens.
    #[arg(long, default_value_t = 64)]
    pub prompt_len: usize,
    /// Tokens to generate per run.
    #[arg(long, default_value_t = 64)]
    pub gen_len: usize,
    /// Threads of the kernels, the caller included.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Timed runs.
    #[arg(long, default_value_t = 5)]
    pub repetitions: usize,
    /// Quantise activations to int8 per block in weight-only GEMMs (faster, not exact).
    #[arg(long)]
    pub int8_activations: bool,
    /// How the KV cache stores K and V: f32, f16 or int8.
    #[arg(long = "kv-dtype", default_value = "f32", value_parser = crate::run_cmd::parse_kv_dtype)]
    pub kv_storage: KvStorage,
    /// Hybrid models: tokens a prefill's gated delta-rule layer takes at once; 0 or 1 runs token
    /// by token.
    #[arg(long, default_value_t = runtime::exec::DEFAULT_DELTA_CHUNK)]
    pub delta_chunk: usize,
    /// Rows a prompt's prefill runs at once: longer prompts run as several steps, so memory
    /// stays bounded; 0 runs the whole prompt in one step.
    #[arg(long, default_value_t = runtime::exec::DEFAULT_PREFILL_CHUNK)]
    pub prefill_chunk: usize,
    /// Print the results as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub backend: crate::run_openvino::BackendArgs,
    /// Use this text file as the prompt (through the bundle's tokenizer) instead of
    /// --prompt-len synthetic tokens.
    #[arg(long)]
    pub prompt_file: Option<PathBuf>,
    /// With --prompt-file: render the text as one user message of the bundle's chat template.
    #[arg(long, requires = "prompt_file")]
    pub chat: bool,
    #[command(flatten)]
    pub speculate: crate::run_cmd::SpeculateArgs,
    /// After the timed runs, one more run that times every op, and where the time goes: each op
    /// kind's calls and milliseconds per decode token and per prefill (host executor).
    #[arg(long)]
    pub profile: bool,
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

/// The prompt: `--prompt-file`'s text through the bundle's tokenizer (and chat template with
/// `--chat`), or the synthetic one of `--prompt-len` tokens.
fn bench_prompt(o: &Options, bundle: &Bundle, vocab: usize) -> Result<Vec<u32>> {
    let Some(path) = &o.prompt_file else { return Ok(synthetic_prompt(o.prompt_len, vocab)) };
    let body = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let text = crate::run_cmd::Text::required(bundle, path)?;
    let rendered = if o.chat { crate::run_cmd::render_chat(bundle, body.trim_end())? } else { body };
    let ids = text.encode(&rendered, !o.chat).with_context(|| format!("tokenising {}", path.display()))?;
    anyhow::ensure!(!ids.is_empty(), "{} is empty after tokenisation", path.display());
    Ok(ids)
}

/// The rates of one way of decoding over the repetitions, and the tokens of the last run.
#[derive(Default)]
struct Rates {
    prefill: Vec<f64>,
    decode: Vec<f64>,
    tokens: Vec<u32>,
    speculation: SpeculationStats,
}

/// Prompt tokens of the untimed warm-up run at most: enough to touch every weight and grow the
/// step buffers, without doubling a long-context bench's time with a second long prefill.
const WARM_UP_TOKENS: usize = 256;

/// Prefill and decode rates of `o.repetitions` greedy runs after one untimed run (which warms
/// caches and page tables), and with a drafter the same for speculative runs, each right after
/// its plain twin so that both see the same machine.
fn measure(exec: &mut Executor, prompt: &[u32], o: &Options, drafter: Option<DrafterSource>) -> Result<(Rates, Rates)> {
    exec.generate_greedy(&prompt[..prompt.len().min(WARM_UP_TOKENS)], 2, &[], |_| {})?;
    let (mut plain, mut spec) = (Rates::default(), Rates::default());
    for _ in 0..o.repetitions {
        exec.reset()?;
        let (generated, stats) = exec.generate_greedy(prompt, o.gen_len, &[], |_| {})?;
        plain.prefill.push(stats.prefill_tok_s());
        plain.decode.push(stats.decode_tok_s());
        plain.tokens = generated;
        if let Some(source) = &drafter {
            let mut lookup;
            let mut mtp;
            let d: &mut dyn Drafter = match source.0 {
                Speculation::Lookup(l) => {
                    lookup = l;
                    &mut lookup
                }
                Speculation::Mtp(k) => {
                    mtp = crate::run_cmd::mtp_drafter(&o.bundle, source.1, source.2.clone(), k)?;
                    &mut mtp
                }
            };
            exec.reset()?;
            let mut greedy = Sampler::greedy();
            let (generated, stats, s) = exec.generate_speculative(prompt, o.gen_len, &[], d, &mut greedy, |_| {})?;
            spec.prefill.push(stats.prefill_tok_s());
            spec.decode.push(stats.decode_tok_s());
            spec.tokens = generated;
            spec.speculation = s;
        }
    }
    anyhow::ensure!(
        drafter.is_none() || spec.tokens == plain.tokens,
        "speculative decoding gave other tokens than plain greedy decoding: {:?} against {:?}",
        spec.tokens,
        plain.tokens
    );
    Ok((plain, spec))
}

/// The drafter `--speculate` names, and what a fresh MTP head per run loads from.
type DrafterSource<'b> = (Speculation, &'b Bundle, ExecOptions);

/// `speculation` in `--json`: the speculative runs' rates, the decode ratio to plain decoding
/// and what the drafter achieved in the last run.
fn speculation_json(plain: &Rates, spec: &Rates) -> serde_json::Value {
    let (pm, pmin, pmax) = spread(spec.prefill.clone());
    let (dm, dmin, dmax) = spread(spec.decode.clone());
    let s = &spec.speculation;
    json!({
        "prefill_tok_s": { "median": pm, "min": pmin, "max": pmax },
        "decode_tok_s": { "median": dm, "min": dmin, "max": dmax },
        "decode_ratio": dm / spread(plain.decode.clone()).0,
        "verify_steps": s.verify_steps, "drafted": s.drafted, "accepted": s.accepted,
        "acceptance": s.acceptance(),
        "tokens_per_weight_pass": spec.tokens.len().saturating_sub(1) as f64 / s.verify_steps.max(1) as f64,
    })
}

pub fn run(o: Options) -> Result<ExitCode> {
    anyhow::ensure!(
        o.prompt_len > 0 && o.gen_len > 1 && o.repetitions > 0,
        "--prompt-len, --gen-len (> 1) and --repetitions must be positive"
    );
    let drafter = o.speculate.speculation(&o.backend.backend)?;
    let bundle = Bundle::open(&o.bundle, None).with_context(|| format!("opening {}", o.bundle.display()))?;
    let prompt = bench_prompt(&o, &bundle, bundle.model().vocab)?;
    let offload = match o.backend.backend.as_str() {
        "openvino" => {
            anyhow::ensure!(drafter.is_none(), "--speculate runs on the host backend");
            anyhow::ensure!(!o.profile, "--profile times the host executor's ops; OpenVINO runs its IR whole");
            return bench_openvino(&o, &bundle, &prompt);
        }
        "xrt" => Some(crate::xdna_run::xrt_offload(&bundle)?),
        _ => None,
    };
    let options = ExecOptions {
        threads: o.threads,
        max_context: prompt.len() + o.gen_len,
        kv_storage: o.kv_storage,
        delta_chunk: o.delta_chunk,
        prefill_chunk: o.prefill_chunk,
        ..ExecOptions::default()
    };
    let load_started = std::time::Instant::now();
    let mut exec = Executor::new(&bundle, options.clone())
        .with_context(|| format!("loading the program of {}", o.bundle.display()))?;
    if let Some(offload) = offload {
        exec.set_offload(offload).with_context(|| format!("offloading {}'s projections", o.bundle.display()))?;
    }
    let load_ms = load_started.elapsed().as_secs_f64() * 1e3;
    let precision = if o.int8_activations { WGemmPrecision::Int8Activations } else { WGemmPrecision::Exact };
    exec.set_wgemm_precision(precision);
    let (plain, spec) = measure(&mut exec, &prompt, &o, drafter.map(|d| (d, &bundle, options)))?;
    let memory = Memory::after_runs(&bundle, &exec);
    let moe_read = moe_bytes_per_decode_token(&mut exec, &prompt, o.gen_len)?;
    let profile = if o.profile { Some(profile_run(&mut exec, &prompt, o.gen_len)?) } else { None };
    let host = Host { exec: &exec, precision, load_ms, prompt_len: prompt.len(), moe_read, memory };
    let speculation = drafter.map(|_| speculation_json(&plain, &spec));
    if o.json {
        let mut out = host_json(&o, &host, &plain, speculation);
        if let Some(p) = &profile {
            out["profile"] = profile_json(p);
        }
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print_host(&o, &host, &plain, speculation.as_ref());
        if let Some(p) = &profile {
            print_profile(p);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// One untimed greedy run with every op timed (the rates above are the runs without the clock
/// reads).
fn profile_run(exec: &mut Executor, prompt: &[u32], gen_len: usize) -> Result<OpProfile> {
    exec.reset()?;
    exec.start_profile();
    exec.generate_greedy(prompt, gen_len, &[], |_| {})?;
    exec.take_profile().context("the profile stopped before the run ended")
}

/// Per phase: its steps and rows, and each op kind's calls and milliseconds, per decode token
/// (decode) or for the whole prompt (prefill), with its share of the phase's op time.
fn profile_json(p: &OpProfile) -> serde_json::Value {
    let phase = |ph: &PhaseProfile| {
        let per = if ph.phase == "decode" { ph.rows.max(1) as f64 } else { 1.0 };
        let total = ph.seconds();
        let ops: Vec<serde_json::Value> = ph
            .ops
            .iter()
            .map(|op| {
                json!({
                    "op": op.kind, "calls": op.calls as f64 / per, "ms": op.seconds * 1e3 / per,
                    "share": if total > 0.0 { op.seconds / total } else { 0.0 },
                })
            })
            .collect();
        json!({ "steps": ph.steps, "rows": ph.rows, "ms": total * 1e3 / per, "ops": ops })
    };
    json!({ "prefill": phase(&p.phases[0]), "decode_per_token": phase(&p.phases[1]) })
}

fn print_profile(p: &OpProfile) {
    let v = profile_json(p);
    for (key, title) in [("decode_per_token", "decode, per token"), ("prefill", "prefill, whole prompt")] {
        let ph = &v[key];
        println!("\nops, {title}: {:.3} ms", ph["ms"].as_f64().unwrap_or(0.0));
        println!("{:<24} {:>8} {:>10} {:>7}", "op", "calls", "ms", "share");
        for op in ph["ops"].as_array().into_iter().flatten() {
            println!(
                "{:<24} {:>8.1} {:>10.3} {:>6.1}%",
                op["op"].as_str().unwrap_or("?"),
                op["calls"].as_f64().unwrap_or(0.0),
                op["ms"].as_f64().unwrap_or(0.0),
                100.0 * op["share"].as_f64().unwrap_or(0.0)
            );
        }
    }
}

/// What the report says about the host executor besides the rates.
struct Host<'e, 'b> {
    exec: &'e Executor<'b>,
    precision: WGemmPrecision,
    load_ms: f64,
    prompt_len: usize,
    /// Expert bytes a decode token read, measured (0 without MoE).
    moe_read: f64,
    memory: Memory,
}

/// Where the resident memory goes, taken after the timed runs, while the cache still holds the
/// last run's prompt and generated tokens (the longest context of the bench).
struct Memory {
    /// The process's peak resident set (VmHWM of /proc/self/status), if the system reports it.
    peak_rss: Option<u64>,
    /// The bundle's weights file, which the program maps (its pages count as resident once read).
    weights_file: u64,
    /// Weights repacked into memory at load (0 when the kernels read the mapped file as it is).
    packed_at_load: u64,
    /// KV pages in use times the page size: what the cache holds for the last run's context.
    kv_in_use: u64,
    /// Recurrent state of the live sequences (hybrid decoders).
    recurrent_state: u64,
}

impl Memory {
    fn after_runs(bundle: &Bundle, exec: &Executor) -> Memory {
        let pool = exec.cache().pool_stats();
        let weights_file = bundle.manifest().file(bundle::WEIGHTS_FILE).map_or(0, |f| f.size_bytes);
        Memory {
            peak_rss: peak_rss_bytes(),
            weights_file,
            packed_at_load: (exec.wgemm_bytes_packed_at_load() + exec.qgemm_bytes_packed_at_load()) as u64,
            kv_in_use: (pool.pages_in_use * pool.page_bytes) as u64,
            recurrent_state: exec.state_bytes_held() as u64,
        }
    }

    /// The peak resident set less the weights, the packed weights, the KV pages and the state:
    /// activations, scratch, code, the tokenizer and the allocator's slack.
    fn rest(&self) -> Option<i64> {
        let accounted = self.weights_file + self.packed_at_load + self.kv_in_use + self.recurrent_state;
        self.peak_rss.map(|peak| peak as i64 - accounted as i64)
    }

    fn json(&self) -> serde_json::Value {
        json!({
            "peak_rss_bytes": self.peak_rss, "weights_file_bytes": self.weights_file,
            "packed_at_load_bytes": self.packed_at_load, "kv_in_use_bytes": self.kv_in_use,
            "recurrent_state_bytes": self.recurrent_state, "rest_bytes": self.rest(),
        })
    }

    fn print(&self) {
        let mb = |b: u64| b as f64 / 1e6;
        let Some(peak) = self.peak_rss else { return println!("peak resident memory: not reported by this system") };
        println!(
            "peak resident {:.1} MB = weights file {:.1} MB + packed at load {:.1} MB + KV in use {:.1} MB + recurrent state {:.1} MB + rest {:.1} MB",
            mb(peak),
            mb(self.weights_file),
            mb(self.packed_at_load),
            mb(self.kv_in_use),
            mb(self.recurrent_state),
            self.rest().unwrap_or(0) as f64 / 1e6
        );
    }
}

/// The process's peak resident set size in bytes (Linux: VmHWM in /proc/self/status).
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Decode steps the MoE probe averages over at most.
const MOE_PROBE_STEPS: usize = 8;

/// Expert bytes one decode token reads, measured over up to [`MOE_PROBE_STEPS`] greedy steps
/// after the prompt, within the generation's context (0 without MoE).
fn moe_bytes_per_decode_token(exec: &mut Executor, prompt: &[u32], gen_len: usize) -> Result<f64> {
    let steps = MOE_PROBE_STEPS.min(gen_len - 1);
    if exec.moe_bytes_per_token().1 == 0 {
        return Ok(0.0);
    }
    exec.reset()?;
    let mut next = runtime::exec::argmax(exec.step(prompt)?);
    let before = exec.moe_expert_bytes_read();
    for _ in 0..steps {
        next = runtime::exec::argmax(exec.step(&[next])?);
    }
    Ok((exec.moe_expert_bytes_read() - before) as f64 / steps as f64)
}

/// `moe` in `--json`: expert bytes per decode token measured, the active experts' bytes (k per
/// node), all experts' bytes, and the GEMM bytes a dense model of the same active size reads.
fn moe_json(h: &Host) -> serde_json::Value {
    let (active, all) = h.exec.moe_bytes_per_token();
    json!({
        "expert_bytes_per_decode_token": h.moe_read,
        "active_expert_bytes": active,
        "all_expert_bytes": all,
        "dense_same_active_bytes_per_token": h.exec.gemm_weight_bytes_per_token() + active,
    })
}

fn print_moe(h: &Host) {
    let (active, all) = h.exec.moe_bytes_per_token();
    let gemm = h.exec.gemm_weight_bytes_per_token() as f64;
    println!(
        "MoE experts read per decode token: {:.3} MB measured ({:.3} MB active, {:.3} MB all); weights read per token {:.3} MB against {:.3} MB for a dense model of the same active size",
        h.moe_read / 1e6,
        active as f64 / 1e6,
        all as f64 / 1e6,
        (gemm + h.moe_read) / 1e6,
        (gemm + active as f64) / 1e6,
    );
}

fn host_json(o: &Options, h: &Host, plain: &Rates, speculation: Option<serde_json::Value>) -> serde_json::Value {
    let (pm, pmin, pmax) = spread(plain.prefill.clone());
    let (dm, dmin, dmax) = spread(plain.decode.clone());
    let weight_bytes = h.exec.gemm_weight_bytes_per_token();
    let mut out = json!({
        "bundle": o.bundle.display().to_string(),
        "backend": "host",
        "tokens": plain.tokens,
        "prompt_len": h.prompt_len, "gen_len": o.gen_len, "threads": o.threads,
        "repetitions": o.repetitions, "wgemm_precision": format!("{:?}", h.precision),
        "kv_dtype": format!("{:?}", o.kv_storage),
        "prefill_tok_s": { "median": pm, "min": pmin, "max": pmax },
        "decode_tok_s": { "median": dm, "min": dmin, "max": dmax },
        "gemm_weight_bytes_per_token": weight_bytes,
        "decode_weight_gb_s": weight_bytes as f64 * dm / 1e9,
        "load_ms": h.load_ms,
        "wgemm_bytes_packed_at_load": h.exec.wgemm_bytes_packed_at_load(),
        "qgemm_bytes_packed_at_load": h.exec.qgemm_bytes_packed_at_load(),
        "memory": h.memory.json(),
    });
    if let Some(s) = speculation {
        out["speculation"] = s;
    }
    if h.exec.moe_bytes_per_token().1 > 0 {
        out["moe"] = moe_json(h);
    }
    out
}

fn print_host(o: &Options, h: &Host, plain: &Rates, speculation: Option<&serde_json::Value>) {
    let (pm, pmin, pmax) = spread(plain.prefill.clone());
    let (dm, dmin, dmax) = spread(plain.decode.clone());
    let weight_bytes = h.exec.gemm_weight_bytes_per_token();
    println!(
        "{}: prompt {} + {} generated, {} thread(s), {} runs, WGemm {:?}",
        o.bundle.display(),
        h.prompt_len,
        o.gen_len,
        o.threads,
        o.repetitions,
        h.precision
    );
    println!("prefill tok/s  median {pm:8.1}  min {pmin:8.1}  max {pmax:8.1}");
    println!("decode  tok/s  median {dm:8.1}  min {dmin:8.1}  max {dmax:8.1}");
    if let Some(s) = speculation {
        let d = &s["decode_tok_s"];
        println!(
            "speculative decode tok/s  median {:8.1}  min {:8.1}  max {:8.1}  ({:.2}× plain; {} of {} drafts kept, {:.2} tokens per weight pass)",
            d["median"].as_f64().unwrap_or(0.0),
            d["min"].as_f64().unwrap_or(0.0),
            d["max"].as_f64().unwrap_or(0.0),
            s["decode_ratio"].as_f64().unwrap_or(0.0),
            s["accepted"],
            s["drafted"],
            s["tokens_per_weight_pass"].as_f64().unwrap_or(0.0),
        );
    }
    println!(
        "GEMM weights read per decode token: {:.1} MB, {:.1} GB/s at the median decode rate",
        weight_bytes as f64 / 1e6,
        weight_bytes as f64 * dm / 1e9
    );
    if h.exec.moe_bytes_per_token().1 > 0 {
        print_moe(h);
    }
    println!(
        "program loaded in {:.1} ms; weights packed at load: WGemm {:.1} MB, QGemm {:.1} MB",
        h.load_ms,
        h.exec.wgemm_bytes_packed_at_load() as f64 / 1e6,
        h.exec.qgemm_bytes_packed_at_load() as f64 / 1e6
    );
    h.memory.print();
}

/// `--backend openvino`: the same measurement on the bundle's IR segments (each compiled before
/// the untimed warm-up), prefill as one step over the prompt, decode one token a step.
#[cfg(feature = "openvino")]
fn bench_openvino(o: &Options, bundle: &Bundle, prompt: &[u32]) -> Result<ExitCode> {
    let (mut session, networks, compile_ms) =
        crate::run_openvino::open_session(&o.backend, bundle, (prompt.len() + o.gen_len, o.threads), false)?;
    session.generate_greedy(prompt, 2, &[], |_| {})?;
    let (mut prefill, mut decode, mut tokens) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..o.repetitions {
        session.reset()?;
        let started = std::time::Instant::now();
        let mut logits = session.step(prompt)?;
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
            "prompt_len": prompt.len(), "gen_len": o.gen_len, "threads": o.threads, "repetitions": o.repetitions,
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
            prompt.len(),
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
fn bench_openvino(_: &Options, _: &Bundle, _: &[u32]) -> Result<ExitCode> {
    anyhow::bail!("this npuc was built without the `openvino` feature: rebuild with `--features openvino`")
}

//! `npuc run --backend openvino`: the bundle's OpenVINO IR on an OpenVINO device, attention over
//! the host's paged KV cache, greedy decoding (see `runtime::openvino`), with `--speculate lookup`
//! verifying drafts in the bundle's verify blocks.

use anyhow::{Context, Result};
use runtime::bundle::Bundle;
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// Backend options of `npuc run`.
#[derive(clap::Args, Clone, Debug)]
pub struct BackendArgs {
    /// Where the program runs: the host executor, the bundle's OpenVINO IR (intel-npu bundles), or
    /// the host executor with the prefill GEMMs on an XDNA NPU through the amdxdna driver (xdna
    /// bundles with their aiecc artifacts, a build with feature `xrt`).
    #[arg(long, default_value = "host", value_parser = ["host", "openvino", "xrt"])]
    pub backend: String,
    /// OpenVINO device for --backend openvino: CPU or NPU.
    #[arg(long, default_value = "CPU")]
    pub device: String,
    /// Compiled-model cache folder for --backend openvino (default: the temp dir's npuc-openvino-cache).
    #[arg(long)]
    pub ov_cache_dir: Option<PathBuf>,
}

pub struct Request<'a> {
    pub bundle: &'a Bundle,
    pub text: &'a crate::run_cmd::Text,
    pub prompt_ids: &'a [u32],
    pub stop: &'a [u32],
    pub max_tokens: usize,
    pub threads: usize,
    pub json: bool,
    /// `--speculate lookup`'s drafter.
    pub drafter: Option<runtime::exec::PromptLookup>,
}

/// An OpenVINO session on `bundle` with every segment compiled (with `verify`, the verify
/// blocks' networks too): the session, the number of networks and the milliseconds compiling took.
#[cfg(feature = "openvino")]
pub fn open_session(
    args: &BackendArgs,
    bundle: &Bundle,
    (max_context, threads): (usize, usize),
    verify: bool,
) -> Result<(runtime::openvino::OvSession, usize, f64)> {
    use runtime::openvino::{OvOptions, OvSession};
    let options = OvOptions { device: args.device.clone(), cache_dir: args.ov_cache_dir.clone(), max_context, threads };
    let compile_start = std::time::Instant::now();
    let mut session = OvSession::open(bundle, &options).context("starting the openvino backend")?;
    if verify {
        anyhow::ensure!(
            !session.verify_blocks().is_empty(),
            "--speculate on --backend openvino verifies drafts in the bundle's verify blocks, and this bundle has none: compile it with --verify-blocks (default 2,4)"
        );
        if let Some(node) = session.recurrent_node() {
            anyhow::bail!(
                "--speculate on --backend openvino rewinds rejected drafts, and node `{node}` keeps a recurrent state on the host that holds only the last position: speculate on the host backend, which keeps each verify row's state"
            );
        }
    }
    let networks = session.compile_all(verify).context("compiling the IR segments")?;
    Ok((session, networks, compile_start.elapsed().as_secs_f64() * 1e3))
}

#[cfg(feature = "openvino")]
pub fn run(args: &BackendArgs, r: Request) -> Result<ExitCode> {
    let context = (r.prompt_ids.len() + r.max_tokens, r.threads);
    let (mut session, networks, compile_ms) = open_session(args, r.bundle, context, r.drafter.is_some())?;
    let start = std::time::Instant::now();
    let mut first_ms = 0.0;
    let mut generated = Vec::new();
    let mut shown = 0usize;
    let mut stdout = std::io::stdout().lock();
    let on_token = |t| {
        if generated.is_empty() {
            first_ms = start.elapsed().as_secs_f64() * 1e3;
        }
        generated.push(t);
        if !r.json {
            if let Ok(text) = r.text.decode(&generated) {
                if let Some(new) = text.get(shown..) {
                    let _ = stdout.write_all(new.as_bytes()).and_then(|_| stdout.flush());
                    shown = text.len();
                }
            }
        }
    };
    let (tokens, spec) = match r.drafter {
        Some(mut d) => {
            let mut greedy = runtime::sample::Sampler::greedy();
            let (prompt, max, stop) = (r.prompt_ids, r.max_tokens, r.stop);
            let (tokens, _, spec) =
                runtime::exec::generate_speculative(&mut session, prompt, max, stop, &mut d, &mut greedy, on_token)?;
            (tokens, Some(spec))
        }
        None => (session.generate_greedy(r.prompt_ids, r.max_tokens, r.stop, on_token)?, None),
    };
    let total_ms = start.elapsed().as_secs_f64() * 1e3;
    let run = Run { tokens: &tokens, spec, networks, compile_ms, first_ms, total_ms };
    report(&session, &r, run)
}

/// What one generation on OpenVINO gave, and how long it took.
#[cfg(feature = "openvino")]
struct Run<'t> {
    tokens: &'t [u32],
    spec: Option<runtime::exec::SpeculationStats>,
    networks: usize,
    compile_ms: f64,
    first_ms: f64,
    total_ms: f64,
}

/// The summary: JSON, or the rates (and speculation's counters) on stderr.
#[cfg(feature = "openvino")]
fn report(session: &runtime::openvino::OvSession, r: &Request, run: Run) -> Result<ExitCode> {
    let Run { tokens, spec, networks, compile_ms, first_ms, total_ms } = run;
    let text = r.text.decode(tokens)?;
    let decode_tok_s = if tokens.len() > 1 { (tokens.len() - 1) as f64 / ((total_ms - first_ms) / 1e3) } else { 0.0 };
    if r.json {
        let mut summary = json!({
            "backend": "openvino", "device": session.device(), "prompt_tokens": r.prompt_ids.len(),
            "tokens": tokens, "text": text, "ttft_ms": first_ms, "decode_tok_s": decode_tok_s,
            "networks": networks, "compile_ms": compile_ms,
            "input_bytes_bound": session.input_traffic().bound_bytes,
            "input_bytes_copied": session.input_traffic().copied_bytes,
        });
        if let Some(spec) = &spec {
            summary["speculation"] = crate::run_cmd::speculation_json(spec, tokens.len());
        }
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        println!();
        eprintln!(
            "openvino {}: {networks} networks compiled in {compile_ms:.0} ms; first token after {first_ms:.1} ms; decode {} tokens: {decode_tok_s:.1} tok/s",
            session.device(),
            tokens.len().saturating_sub(1)
        );
        if let Some(spec) = &spec {
            eprintln!("{}", crate::run_cmd::speculation_line(spec, tokens.len()));
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(not(feature = "openvino"))]
pub fn run(_: &BackendArgs, _: Request) -> Result<ExitCode> {
    anyhow::bail!("this npuc was built without the `openvino` feature: rebuild with `--features openvino`")
}

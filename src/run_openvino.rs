//! `npuc run --backend openvino`: the bundle's OpenVINO IR on an OpenVINO device, attention over
//! the host's paged KV cache, greedy decoding (see `runtime::openvino`).

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
}

/// An OpenVINO session on `bundle` with every segment compiled: the session, the number of
/// networks and the milliseconds compiling took.
#[cfg(feature = "openvino")]
pub fn open_session(
    args: &BackendArgs,
    bundle: &Bundle,
    max_context: usize,
    threads: usize,
) -> Result<(runtime::openvino::OvSession, usize, f64)> {
    use runtime::openvino::{OvOptions, OvSession};
    let options = OvOptions { device: args.device.clone(), cache_dir: args.ov_cache_dir.clone(), max_context, threads };
    let compile_start = std::time::Instant::now();
    let mut session = OvSession::open(bundle, &options).context("starting the openvino backend")?;
    let networks = session.compile_all().context("compiling the IR segments")?;
    Ok((session, networks, compile_start.elapsed().as_secs_f64() * 1e3))
}

#[cfg(feature = "openvino")]
pub fn run(args: &BackendArgs, r: Request) -> Result<ExitCode> {
    let (mut session, networks, compile_ms) =
        open_session(args, r.bundle, r.prompt_ids.len() + r.max_tokens, r.threads)?;
    let start = std::time::Instant::now();
    let mut first_ms = 0.0;
    let mut generated = Vec::new();
    let mut shown = 0usize;
    let mut stdout = std::io::stdout().lock();
    let tokens = session.generate_greedy(r.prompt_ids, r.max_tokens, r.stop, |t| {
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
    })?;
    let total_ms = start.elapsed().as_secs_f64() * 1e3;
    let text = r.text.decode(&tokens)?;
    let decode_tok_s = if tokens.len() > 1 { (tokens.len() - 1) as f64 / ((total_ms - first_ms) / 1e3) } else { 0.0 };
    if r.json {
        let summary = json!({
            "backend": "openvino", "device": session.device(), "prompt_tokens": r.prompt_ids.len(),
            "tokens": tokens, "text": text, "ttft_ms": first_ms, "decode_tok_s": decode_tok_s,
            "networks": networks, "compile_ms": compile_ms,
            "input_bytes_bound": session.input_traffic().bound_bytes,
            "input_bytes_copied": session.input_traffic().copied_bytes,
        });
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        let _ = writeln!(stdout);
        eprintln!(
            "openvino {}: {networks} networks compiled in {compile_ms:.0} ms; first token after {first_ms:.1} ms; decode {} tokens: {decode_tok_s:.1} tok/s",
            session.device(),
            tokens.len().saturating_sub(1)
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(not(feature = "openvino"))]
pub fn run(_: &BackendArgs, _: Request) -> Result<ExitCode> {
    anyhow::bail!("this npuc was built without the `openvino` feature: rebuild with `--features openvino`")
}

//! `npuc compile`: import, run the target's pipeline, lower for the target, and write the bundle.
//!
//! The bundle's program is the target's program (`program`, format `npuc-program/1`); its weights
//! are stored once each, some packed for the host kernels (`weights`); the manifest's model
//! configuration is read off the program (`config`); the target adds its own files
//! (`crate::targets`).

mod config;
mod program;
pub mod weights;

use anyhow::{Context, Result};
use bundle::{BundleSummary, BundleWriter, ManifestHeader, ModelConfig, WriteOptions};
use serde_json::json;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::targets::{Emitted, Target, TargetArgs};
pub use program::program;

pub struct Options {
    pub model: PathBuf,
    pub target: String,
    pub output: PathBuf,
    pub tokenizer: Option<PathBuf>,
    pub overwrite: bool,
    pub json: bool,
    pub args: TargetArgs,
}

/// What one compile wrote, for the summary.
pub(crate) struct Written {
    pub program_nodes: usize,
    pub stored: weights::Stored,
    pub bundle: BundleSummary,
    pub emitted: Emitted,
    pub tokenizer: bool,
}

pub fn run(o: Options) -> Result<ExitCode> {
    let target = crate::targets::target(&o.target)?;
    let written = compile(target, &o)?;
    report(&o, &written)?;
    Ok(ExitCode::SUCCESS)
}

/// Compiles `o.model` for `target` into the bundle `o.output`.
pub(crate) fn compile(target: &dyn Target, o: &Options) -> Result<Written> {
    target.check(&o.args)?;
    let progress = Progress::new(o.json);
    progress.step(format!("importing {}", o.model.display()));
    let imported = frontend::import_file(&o.model).with_context(|| format!("importing {}", o.model.display()))?;
    let outcome = passes::driver::run(&target.pipeline(), without_drafter_outputs(imported.graph), None, |r, _| {
        progress.step(format!("{} done ({} → {} nodes)", r.name, r.nodes_before, r.nodes_after));
    })?;
    let lowered = target.lower(outcome.graph, &o.args)?;
    let tokenizer = o.tokenizer.clone().or_else(|| sibling(&o.model, bundle::TOKENIZER_FILE));
    let header = ManifestHeader {
        compiler_version: env!("CARGO_PKG_VERSION").to_string(),
        target: target.id(),
        model: model_config(lowered.program(), tokenizer.as_deref())?,
        program: program(lowered.program()),
    };
    progress.step(format!("writing {}", o.output.display()));
    let mut w = BundleWriter::create_with(&o.output, header, WriteOptions { overwrite: o.overwrite })
        .with_context(|| format!("creating {}", o.output.display()))?;
    let stored = weights::store(&mut w, lowered.program(), lowered.host_packing())?;
    if let Some(t) = &tokenizer {
        copy_tokenizer(&mut w, t)?;
    }
    let emitted = lowered.emit(&mut w)?;
    let bundle = w.finish()?;
    progress.done();
    let program_nodes = lowered.program().nodes.len();
    Ok(Written { program_nodes, stored, bundle, emitted, tokenizer: tokenizer.is_some() })
}

/// The graph without the output only a drafter reads: onnxruntime-genai's builder gives a decoder
/// with an MTP head (mtp.onnx) a first output `hidden_states`, the final norm's, which the head
/// takes. The bundle carries no MTP drafter and the executor returns the logits only, so the
/// program leaves it out, and with it the nodes only it reads (Qwen3.5's last MLP and final norm:
/// the builder feeds its lm_head from the last post-attention norm).
fn without_drafter_outputs(mut graph: ir::Graph) -> ir::Graph {
    let named = |g: &ir::Graph, name: &str| g.outputs.iter().copied().find(|&v| g.value(v).name == name);
    let (Some(_), Some(hidden)) = (named(&graph, "logits"), named(&graph, "hidden_states")) else {
        return graph;
    };
    graph.outputs.retain(|&v| v != hidden);
    graph.pruned()
}

/// The configuration read off the program, with the tokenizer's special tokens.
fn model_config(program: &ir::Graph, tokenizer: Option<&Path>) -> Result<ModelConfig> {
    let mut config = config::model_config(program)?;
    if let Some(t) = tokenizer {
        let (bos, eos) = config::special_tokens(t)?;
        config.bos_token_id = bos;
        config.eos_token_id = eos;
        config.stop_token_ids = eos.into_iter().collect();
    }
    Ok(config)
}

/// The file `name` next to the model, if there is one.
fn sibling(model: &Path, name: &str) -> Option<PathBuf> {
    model.parent().map(|d| d.join(name)).filter(|p| p.is_file())
}

/// The tokenizer, and the chat template next to it when there is one.
fn copy_tokenizer(w: &mut BundleWriter, t: &Path) -> Result<()> {
    w.copy_file(bundle::TOKENIZER_FILE, t).with_context(|| format!("copying {}", t.display()))?;
    let template = t.with_file_name(bundle::CHAT_TEMPLATE_FILE);
    if template.is_file() {
        w.copy_file(bundle::CHAT_TEMPLATE_FILE, &template)
            .with_context(|| format!("copying {}", template.display()))?;
    }
    Ok(())
}

fn report(o: &Options, x: &Written) -> Result<()> {
    let s = &x.stored;
    if o.json {
        let mut out = json!({ "bundle": x.bundle, "program_nodes": x.program_nodes, "weights": s.total(),
            "wgemm_packed": s.wgemm, "qgemm_packed": s.qgemm, "gemm_packed": s.gemm });
        if let Some((key, value)) = &x.emitted.json {
            out[*key] = value.clone();
        }
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "wrote {} ({} target): {} program nodes, {} weights ({} WGemm, {} QGemm and {} MatMul weights packed), {} files, {} bytes",
        o.output.display(),
        o.target,
        x.program_nodes,
        s.total(),
        s.wgemm,
        s.qgemm,
        s.gemm,
        x.bundle.files.len(),
        x.bundle.total_bytes
    );
    for line in &x.emitted.lines {
        println!("{line}");
    }
    if !x.tokenizer {
        println!("no tokenizer.json next to the model and none given with --tokenizer: the bundle has none");
    }
    Ok(())
}

/// Progress on stderr: a spinner on a terminal, lines otherwise, nothing with `--json`.
struct Progress {
    bar: Option<indicatif::ProgressBar>,
    quiet: bool,
}

impl Progress {
    fn new(json: bool) -> Progress {
        let bar = (!json && std::io::stderr().is_terminal()).then(|| {
            let p = indicatif::ProgressBar::new_spinner();
            p.enable_steady_tick(std::time::Duration::from_millis(100));
            p
        });
        Progress { bar, quiet: json }
    }

    fn step(&self, msg: String) {
        match &self.bar {
            Some(p) => p.set_message(msg),
            None if !self.quiet => eprintln!("{msg}"),
            None => {}
        }
    }

    fn done(&self) {
        if let Some(p) = &self.bar {
            p.finish_and_clear();
        }
    }
}

//! `npuc compile`: import, run the target's pipeline, lower for the target, and write the bundle.
//!
//! The bundle's program is the target's program (`program`, format `npuc-program/1`); its weights
//! are stored once each, some packed for the host kernels (`weights`); the manifest's model
//! configuration is read off the program (`config`); the target adds its own files
//! (`crate::targets`).

mod config;
pub mod drafter;
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
    /// Wait for the disk before returning (`bundle::WriteOptions::sync`).
    pub sync: bool,
    pub json: bool,
    /// Compile an MTP head found beside the model (`mtp.onnx`) into the bundle.
    pub drafter: bool,
    pub args: TargetArgs,
}

/// What one compile wrote, for the summary.
pub(crate) struct Written {
    pub program_nodes: usize,
    pub stored: weights::Stored,
    pub bundle: BundleSummary,
    pub emitted: Emitted,
    pub tokenizer: bool,
    /// The MTP head compiled beside the decoder, if any.
    pub drafter: Option<Drafted>,
    /// Why an MTP head beside the model was left out.
    pub skipped: Option<String>,
}

/// A drafter program: its graph, weights renamed against the decoder's, weights it added.
pub(crate) struct Drafted {
    pub graph: ir::Graph,
    pub renamed: usize,
    pub stored: weights::Stored,
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
    let head = drafter::mtp_beside(&o.model, &imported.graph);
    let skipped = head.as_ref().and_then(|_| drafter::skip_reason(o.drafter, target.id()));
    let (decoder, head) = match head {
        Some(path) if skipped.is_none() => (imported.graph, Some(path)),
        _ => (drafter::without_drafter_outputs(imported.graph), None),
    };
    let lowered = target.lower(run_pipeline(target, decoder, &progress)?, &o.args)?;
    let drafter = head.map(|path| compile_drafter(target, &path, lowered.program(), &progress)).transpose()?;
    let tokenizer = o.tokenizer.clone().or_else(|| sibling(&o.model, bundle::TOKENIZER_FILE));
    let header = ManifestHeader {
        compiler_version: env!("CARGO_PKG_VERSION").to_string(),
        target: target.id(),
        model: model_config(lowered.program(), tokenizer.as_deref())?,
        program: program(lowered.program()),
    };
    progress.step(format!("writing {}", o.output.display()));
    let mut w = BundleWriter::create_with(&o.output, header, WriteOptions { overwrite: o.overwrite, sync: o.sync })
        .with_context(|| format!("creating {}", o.output.display()))?;
    let stored = weights::store(&mut w, lowered.program(), lowered.host_packing())?;
    let drafter = drafter.map(|d| store_drafter(&mut w, d)).transpose()?;
    if let Some(t) = &tokenizer {
        copy_tokenizer(&mut w, t)?;
    }
    let emitted = lowered.emit(&mut w)?;
    let bundle = w.finish()?;
    progress.done();
    let program_nodes = lowered.program().nodes.len();
    Ok(Written { program_nodes, stored, bundle, emitted, tokenizer: tokenizer.is_some(), drafter, skipped })
}

fn run_pipeline(target: &dyn Target, graph: ir::Graph, progress: &Progress) -> Result<ir::Graph> {
    let outcome = passes::driver::run(&target.pipeline(), graph, None, |r, _| {
        progress.step(format!("{} done ({} → {} nodes)", r.name, r.nodes_before, r.nodes_after));
    })?;
    Ok(outcome.graph)
}

/// The MTP head at `path` through the target's pipeline, its weights named against the decoder's.
fn compile_drafter(target: &dyn Target, path: &Path, decoder: &ir::Graph, progress: &Progress) -> Result<Drafted> {
    progress.step(format!("importing the MTP head {}", path.display()));
    let head = drafter::import(path)?;
    let mut graph = run_pipeline(target, head, progress).with_context(|| format!("compiling {}", path.display()))?;
    let renamed = drafter::rename_clashes(&mut graph, decoder)?;
    Ok(Drafted { graph, renamed, stored: weights::Stored::default() })
}

fn store_drafter(w: &mut BundleWriter, mut d: Drafted) -> Result<Drafted> {
    d.stored = weights::store(w, &d.graph, weights::HostPacking::All).context("storing the MTP head's weights")?;
    w.set_drafter(bundle::Drafter { kind: bundle::DrafterKind::Mtp, program: program(&d.graph) });
    Ok(d)
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
        out["drafter"] = drafter_json(x);
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
    if let Some(d) = &x.drafter {
        println!(
            "MTP drafter ({}): {} program nodes, {} weights of its own ({} renamed apart from the decoder's), the rest shared",
            drafter::MTP_FILE,
            d.graph.nodes.len(),
            d.stored.total(),
            d.renamed
        );
    }
    if let Some(why) = &x.skipped {
        println!("{} beside the model not compiled: {why}", drafter::MTP_FILE);
    }
    if !x.tokenizer {
        println!("no tokenizer.json next to the model and none given with --tokenizer: the bundle has none");
    }
    Ok(())
}

fn drafter_json(x: &Written) -> serde_json::Value {
    match (&x.drafter, &x.skipped) {
        (Some(d), _) => json!({ "kind": "mtp", "program_nodes": d.graph.nodes.len(),
            "weights": d.stored.total(), "renamed": d.renamed }),
        (None, Some(why)) => json!({ "skipped": why }),
        (None, None) => serde_json::Value::Null,
    }
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

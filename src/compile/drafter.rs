//! The drafter a bundle carries: the multi-token-prediction head onnxruntime-genai's builder writes
//! beside a Qwen3.5-style decoder (`mtp.onnx`), compiled by the same pipeline into a second
//! program over the same weights file.
//!
//! The builder gives such a decoder a first output `hidden_states` (the final norm's), which the
//! head takes per row. When the head is compiled the decoder's program keeps that output; when it
//! is not (another target, `--no-drafter`, no `mtp.onnx`), the output and the nodes only it reads
//! leave the program, so the executor computes only the logits.
//!
//! Names: the head's graph reuses the decoder's names for other tensors (its one decoder layer's
//! weights are `model.layers.0.*`, its final norm `model.layers.<n>.final_norm_layernorm.weight`),
//! and shares the embedding and lm_head with it by name and file offset. After both pipelines, a
//! drafter weight whose name the decoder's program reads with the same dtype, shape and bytes is
//! the same tensor and is stored once; one whose name the decoder uses for other bytes is stored as
//! `mtp/<name>`.

use anyhow::{bail, Context, Result};
use ir::graph::{Graph, ValueDef};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The file the builder writes the head to, beside `model.onnx`.
pub const MTP_FILE: &str = "mtp.onnx";

/// The decoder output the head reads, and the head's input it feeds.
pub const HIDDEN: &str = "hidden_states";

/// Prefix of drafter weights renamed because the decoder uses their names for other bytes.
const RENAMED_PREFIX: &str = "mtp/";

/// `mtp.onnx` beside `model` when the decoder has the `hidden_states` output the head reads.
pub fn mtp_beside(model: &Path, decoder: &Graph) -> Option<PathBuf> {
    let path = model.parent()?.join(MTP_FILE);
    (path.is_file() && output(decoder, HIDDEN).is_some() && output(decoder, "logits").is_some()).then_some(path)
}

/// Why a head found beside the model is not compiled: `--no-drafter`, or a target whose
/// bundles the host executor does not run (the head runs on the host beside the decoder).
pub fn skip_reason(wanted: bool, target: bundle::Target) -> Option<String> {
    match (wanted, target) {
        (false, _) => Some("--no-drafter".to_string()),
        (true, bundle::Target::Cpu) => None,
        (true, other) => Some(format!("the {other} target runs no drafter yet (--target cpu does)")),
    }
}

/// The graph without the output only a drafter reads, and the nodes only it reads (Qwen3.5 files
/// from builder 0.18 feed the lm_head from the last post-attention norm, so the last MLP and the
/// final norm go too).
pub fn without_drafter_outputs(mut graph: Graph) -> Graph {
    let (Some(_), Some(hidden)) = (output(&graph, "logits"), output(&graph, HIDDEN)) else {
        return graph;
    };
    graph.outputs.retain(|&v| v != hidden);
    graph.pruned()
}

fn output(g: &Graph, name: &str) -> Option<ir::ValueId> {
    g.outputs.iter().copied().find(|&v| g.value(v).name == name)
}

/// Checks the imported head reads the decoder's hidden states and gives logits.
pub fn check_signature(path: &Path, head: &Graph) -> Result<()> {
    let input = head.inputs.iter().find(|&&v| head.value(v).name == HIDDEN);
    if input.is_none() {
        bail!("{}: an MTP head takes the decoder's `{HIDDEN}` as an input; this graph has none", path.display());
    }
    if output(head, "logits").is_none() {
        bail!("{}: an MTP head's first output is `logits`; this graph has none", path.display());
    }
    Ok(())
}

/// Renames the weights of `head` whose names `decoder` reads with other contents (see the module
/// doc); returns how many were renamed.
pub fn rename_clashes(head: &mut Graph, decoder: &Graph) -> Result<usize> {
    let decoder_weights: HashMap<&str, &ir::weights::Weight> = decoder
        .values
        .iter()
        .filter_map(|v| match v.def {
            ValueDef::Weight(id) => Some(decoder.weights.get(id)),
            _ => None,
        })
        .map(|w| (w.name.as_str(), w))
        .collect();
    let mut clashes = Vec::new();
    for v in &head.values {
        let ValueDef::Weight(id) = v.def else { continue };
        let w = head.weights.get(id);
        let differs = |d: &&ir::weights::Weight| d.dtype != w.dtype || d.shape != w.shape || d.bytes != w.bytes;
        if decoder_weights.get(w.name.as_str()).is_some_and(differs) && !clashes.contains(&id) {
            clashes.push(id);
        }
    }
    let store = Arc::make_mut(&mut head.weights);
    for &id in &clashes {
        let name = format!("{RENAMED_PREFIX}{}", store.get(id).name);
        if decoder_weights.contains_key(name.as_str()) {
            bail!("drafter weight `{name}`: the decoder has a weight of that name too");
        }
        store.rename(id, name);
    }
    Ok(clashes.len())
}

/// Imports the head at `path`.
pub fn import(path: &Path) -> Result<Graph> {
    let imported = frontend::import_file(path).with_context(|| format!("importing {}", path.display()))?;
    check_signature(path, &imported.graph)?;
    Ok(imported.graph)
}

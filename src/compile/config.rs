//! What the manifest says of the model: the decoder's configuration read off the compiled program,
//! and the special tokens of its tokenizer.

use anyhow::{anyhow, bail, Context, Result};
use bundle::ModelConfig;
use ir::graph::{Graph, ValueDef};
use serde_json::Value;
use std::path::Path;

/// The decoder's configuration, read off the compiled program: one Attention per layer gives the
/// layer count and head geometry, the embedding gather the vocabulary and width, the SwiGlu (or
/// the xdna program's QuantizeSwiGlu) the MLP width, the first norm epsilon. The rotary base is
/// not recoverable from a program whose cos/sin tables are weights, and is recorded as 0.
pub fn model_config(g: &Graph) -> Result<ModelConfig> {
    let attentions: Vec<&ir::Node> =
        g.nodes.iter().filter(|n| n.op == "Attention" && n.domain == ir::Domain::Npuc).collect();
    let Some(first) = attentions.first() else {
        bail!("the compiled program has no fused Attention: npuc compiles decoder models whose attention the rewrites recognise (see `npuc explore --why`)");
    };
    let int = |n: &ir::Node, k: &str| n.attrs.int(k).ok().flatten().unwrap_or(0).max(0) as usize;
    let q = g.value(first.inputs[0].ok_or_else(|| anyhow!("Attention without q"))?);
    let head_dim = last_dim(q);
    let rms_eps = g
        .nodes
        .iter()
        .find(|n| n.op.contains("RmsNorm"))
        .and_then(|n| n.attrs.float("epsilon").ok().flatten())
        .unwrap_or(0.0) as f64;
    Ok(ModelConfig {
        layers: attentions.len(),
        hidden: output_width(g, |op| op.starts_with("RmsNorm") || op.starts_with("SkipRmsNorm")),
        heads: int(first, "q_heads"),
        kv_heads: int(first, "kv_heads"),
        head_dim,
        intermediate: output_width(g, |op| matches!(op, "SwiGlu" | "GeluGate" | "QuantizeSwiGlu")),
        vocab: last_dim(g.value(g.outputs[0])),
        rms_eps,
        rope_theta: 0.0,
        tied_embeddings: tied(g),
        max_positions: max_positions(g, head_dim),
        bos_token_id: None,
        eos_token_id: None,
        stop_token_ids: vec![],
    })
}

/// The known size of a value's last dim (0 when symbolic).
fn last_dim(v: &ir::Value) -> usize {
    v.shape.last().and_then(|d| d.as_known()).unwrap_or(0) as usize
}

/// The width of the first output of the first node whose op `is`.
fn output_width(g: &Graph, is: impl Fn(&str) -> bool) -> usize {
    g.nodes.iter().find(|n| is(n.op)).map(|n| last_dim(g.value(n.outputs[0]))).unwrap_or(0)
}

/// Whether the embedding gather and the last GEMM read the same weight.
fn tied(g: &Graph) -> bool {
    let weights_of = |n: &ir::Node| -> Vec<ir::WeightId> {
        n.inputs
            .iter()
            .flatten()
            .filter_map(|&v| match &g.value(v).def {
                ValueDef::Weight(w) => Some(*w),
                ValueDef::Node { node, .. } => {
                    g.node(*node).inputs.iter().flatten().find_map(|&i| match g.value(i).def {
                        ValueDef::Weight(w) => Some(w),
                        _ => None,
                    })
                }
                _ => None,
            })
            .collect()
    };
    let embed = g.nodes.iter().find(|n| n.op == "Gather" || n.op == "GatherBlockQuantized");
    let head = g.nodes.iter().rev().find(|n| matches!(n.op, "MatMul" | "WGemm" | "QGemm"));
    match (embed, head) {
        (Some(e), Some(h)) => {
            let ew = weights_of(e);
            weights_of(h).iter().any(|w| ew.contains(w))
        }
        _ => false,
    }
}

/// The rows of the position tables (a gathered weight whose rows are `head_dim` wide).
fn max_positions(g: &Graph, head_dim: usize) -> usize {
    g.nodes
        .iter()
        .filter(|n| n.op == "Gather")
        .filter_map(|n| n.inputs[0])
        .map(|v| g.value(v))
        .filter(|v| {
            matches!(v.def, ValueDef::Weight(_)) && v.shape.last().and_then(|d| d.as_known()) == Some(head_dim as i64)
        })
        .map(|v| v.shape.first().and_then(|d| d.as_known()).unwrap_or(0) as usize)
        .next()
        .unwrap_or(0)
}

/// Beginning- and end-of-sequence ids from a tokenizer.json's special added tokens.
pub fn special_tokens(path: &Path) -> Result<(Option<u32>, Option<u32>)> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let t: Value = serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let added = t["added_tokens"].as_array().cloned().unwrap_or_default();
    // The first name of the list the tokenizer has wins: chat models end turns with their
    // end-of-turn token even when they also define a document end.
    let find = |names: &[&str]| {
        names.iter().find_map(|name| {
            added.iter().find(|a| a["content"].as_str() == Some(name)).and_then(|a| a["id"].as_u64()).map(|i| i as u32)
        })
    };
    Ok((
        find(&["<|im_start|>", "<s>", "<|begin_of_text|>"]),
        find(&["<|im_end|>", "</s>", "<|endoftext|>", "<|eot_id|>"]),
    ))
}

//! `npuc compile`: import, run the target's pipeline, and write the bundle.
//!
//! The bundle's program is the pipeline's final graph as JSON (format `npuc-program/1`, below);
//! every weight it reads is stored once in `weights.safetensors` under its model name (a tied
//! embedding/lm_head is one tensor), in the model's own layout. Repacking into the kernels'
//! layouts joins this step together with the executor that reads them.
//!
//! Program JSON: `{"format": "npuc-program/1", "values": [{"name", "dtype", "shape": [dim, ...],
//! "def": "input" | "node" | {"weight": NAME} | {"const": {"dtype", "shape", "data"}}}], "nodes":
//! [{"name", "op": "domain::op", "attrs": {...}, "inputs": [value index | null], "outputs":
//! [value index]}], "inputs": [value index], "outputs": [value index]}`; a dim is a number or the
//! text of a symbolic dim (`past_sequence_length + sequence_length`).

use anyhow::{anyhow, bail, Context, Result};
use ir::graph::{Graph, ValueDef};
use ir::{Attr, DType, Data, Tensor};
use runtime::bundle::{BundleWriter, Dtype, ManifestHeader, ModelConfig, Target, WriteOptions};
use serde_json::{json, Map, Value};
use std::collections::BTreeSet;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

pub struct Options {
    pub model: PathBuf,
    pub target: String,
    pub output: PathBuf,
    pub tokenizer: Option<PathBuf>,
    pub overwrite: bool,
    pub json: bool,
    pub intel: crate::intel::IntelArgs,
    /// XDNA device (`--device`), for `--target xdna` only.
    pub device: Option<String>,
}

pub fn run(o: Options) -> Result<ExitCode> {
    let target: Target =
        o.target.parse().map_err(|_| anyhow!("unknown target `{}` (targets: cpu, xdna, intel-npu)", o.target))?;
    let pipeline_target = passes::targets::target(&o.target).ok_or_else(|| anyhow!("unknown target `{}`", o.target))?;
    let xdna_device = match (&o.device, target) {
        (_, Target::Xdna) => Some(crate::xdna::device(o.device.as_deref())?),
        (Some(d), _) => bail!("--device {d} applies to --target xdna only"),
        (None, _) => None,
    };
    let progress = (!o.json && std::io::stderr().is_terminal()).then(|| {
        let p = indicatif::ProgressBar::new_spinner();
        p.enable_steady_tick(std::time::Duration::from_millis(100));
        p
    });
    let step = |msg: String| {
        if let Some(p) = &progress {
            p.set_message(msg);
        } else if !o.json {
            eprintln!("{msg}");
        }
    };
    step(format!("importing {}", o.model.display()));
    let imported = frontend::import_file(&o.model).with_context(|| format!("importing {}", o.model.display()))?;
    let pipeline = pipeline_target.pipeline();
    let outcome = passes::driver::run(&pipeline, imported.graph, None, |r, _| {
        step(format!("{} done ({} → {} nodes)", r.name, r.nodes_before, r.nodes_after));
    })?;
    let mut g = outcome.graph;
    // intel-npu: the IR, and the host program it agrees with (symmetric weights).
    let intel = if o.target == "intel-npu" { Some(crate::intel::compile(&g, &o.intel)?) } else { None };
    if let Some(ir) = &intel {
        g = ir.host_program.clone();
    }
    let config = model_config(&g)?;
    let tokenizer = match &o.tokenizer {
        Some(t) => Some(t.clone()),
        None => o.model.parent().map(|d| d.join("tokenizer.json")).filter(|p| p.is_file()),
    };
    let mut config = config;
    if let Some(t) = &tokenizer {
        let (bos, eos) = special_tokens(t)?;
        config.bos_token_id = bos;
        config.eos_token_id = eos;
        config.stop_token_ids = eos.into_iter().collect();
    }
    step(format!("writing {}", o.output.display()));
    let header = ManifestHeader {
        compiler_version: env!("CARGO_PKG_VERSION").to_string(),
        target,
        model: config,
        program: program_json(&g),
    };
    let mut w = BundleWriter::create_with(&o.output, header, WriteOptions { overwrite: o.overwrite })
        .with_context(|| format!("creating {}", o.output.display()))?;
    let mut stored = BTreeSet::new();
    for v in &g.values {
        if let ValueDef::Weight(id) = v.def {
            if !stored.insert(id) {
                continue;
            }
            let wt = g.weights.get(id);
            let (dtype, shape, layout) = storage_of(wt.dtype, &wt.shape, wt.bytes.len());
            w.add_tensor(&wt.name, dtype, &shape, &wt.bytes, layout.as_ref())
                .with_context(|| format!("storing weight `{}`", wt.name))?;
        }
    }
    if let Some(t) = &tokenizer {
        w.copy_file(runtime::bundle::TOKENIZER_FILE, t).with_context(|| format!("copying {}", t.display()))?;
        let template = t.with_file_name("chat_template.jinja");
        if template.is_file() {
            w.copy_file(runtime::bundle::CHAT_TEMPLATE_FILE, &template)?;
        }
    }
    if let Some(ir) = &intel {
        crate::intel::write(&mut w, ir)?;
    }
    let xdna = match xdna_device {
        Some(device) => Some(crate::xdna::add_to_bundle(&g, device, &mut w)?),
        None => None,
    };
    let summary = w.finish()?;
    if let Some(p) = &progress {
        p.finish_and_clear();
    }
    if o.json {
        let intel = intel.as_ref().map(crate::intel::summary);
        let mut out =
            json!({ "bundle": summary, "program_nodes": g.nodes.len(), "weights": stored.len(), "intel": intel });
        if let Some(x) = &xdna {
            out["xdna"] = x.clone();
        }
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "wrote {} ({} target): {} program nodes, {} weights, {} files, {} bytes",
            o.output.display(),
            o.target,
            g.nodes.len(),
            stored.len(),
            summary.files.len(),
            summary.total_bytes
        );
        if let Some(ir) = &intel {
            println!("{}", crate::intel::summary_line(ir));
        }
        for line in xdna.iter().flat_map(crate::xdna::summary_lines) {
            println!("{line}");
        }
        if tokenizer.is_none() {
            println!("no tokenizer.json next to the model and none given with --tokenizer: the bundle has none");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// How a weight is stored: the bundle's dtype where there is one, else its raw bytes as U8 with the
/// model dtype and shape in the tensor's layout metadata.
fn storage_of(dtype: DType, shape: &[usize], bytes: usize) -> (Dtype, Vec<usize>, Option<Value>) {
    let direct = match dtype {
        DType::F32 => Some(Dtype::F32),
        DType::F16 => Some(Dtype::F16),
        DType::BF16 => Some(Dtype::BF16),
        DType::U8 => Some(Dtype::U8),
        DType::I8 => Some(Dtype::I8),
        DType::I32 => Some(Dtype::I32),
        _ => None,
    };
    match direct {
        Some(d) => (d, shape.to_vec(), None),
        None => (Dtype::U8, vec![bytes], Some(json!({ "dtype": dtype.name(), "shape": shape }))),
    }
}

fn dims_json(shape: &[ir::Dim]) -> Value {
    Value::Array(
        shape
            .iter()
            .map(|d| match d.as_known() {
                Some(k) => json!(k),
                None => json!(d.to_string()),
            })
            .collect(),
    )
}

fn tensor_json(t: &Tensor) -> Value {
    let data = match &t.data {
        Data::F32(v) => json!(v),
        Data::F64(v) => json!(v),
        Data::I64(v) => json!(v),
        Data::Str(v) => json!(v.iter().map(|s| String::from_utf8_lossy(s).into_owned()).collect::<Vec<_>>()),
    };
    json!({ "dtype": t.dtype.name(), "shape": t.shape, "data": data })
}

fn attr_json(a: &Attr) -> Value {
    match a {
        Attr::Int(v) => json!(v),
        Attr::Float(v) => json!(v),
        Attr::Str(v) => json!(v),
        Attr::Ints(v) => json!(v),
        Attr::Floats(v) => json!(v),
        Attr::Strs(v) => json!(v),
        Attr::Tensor(t) => json!({ "tensor": tensor_json(t) }),
    }
}

/// The program in the format the module documentation gives.
pub fn program_json(g: &Graph) -> Value {
    let values: Vec<Value> = g
        .values
        .iter()
        .map(|v| {
            let def = match &v.def {
                ValueDef::Input => json!("input"),
                ValueDef::Node { .. } => json!("node"),
                ValueDef::Weight(w) => json!({ "weight": g.weights.get(*w).name }),
                ValueDef::Const(t) => json!({ "const": tensor_json(t) }),
            };
            json!({ "name": v.name, "dtype": v.dtype.name(), "shape": dims_json(&v.shape), "def": def })
        })
        .collect();
    let nodes: Vec<Value> = g
        .nodes
        .iter()
        .map(|n| {
            let attrs: Map<String, Value> = n.attrs.0.iter().map(|(k, v)| (k.clone(), attr_json(v))).collect();
            json!({
                "name": n.name,
                "op": format!("{}::{}", n.domain, n.op),
                "attrs": attrs,
                "inputs": n.inputs.iter().map(|i| i.map(|v| v.0)).collect::<Vec<_>>(),
                "outputs": n.outputs.iter().map(|v| v.0).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "format": "npuc-program/1",
        "values": values,
        "nodes": nodes,
        "inputs": g.inputs.iter().map(|v| v.0).collect::<Vec<_>>(),
        "outputs": g.outputs.iter().map(|v| v.0).collect::<Vec<_>>(),
    })
}

/// The decoder's configuration, read off the compiled program: one Attention per layer gives the
/// layer count and head geometry, the embedding gather the vocabulary and width, the SwiGlu the
/// MLP width, the first norm epsilon. The rotary base is not recoverable from a program whose
/// cos/sin tables are weights, and is recorded as 0.
fn model_config(g: &Graph) -> Result<ModelConfig> {
    let attentions: Vec<&ir::Node> =
        g.nodes.iter().filter(|n| n.op == "Attention" && n.domain == ir::Domain::Npuc).collect();
    let Some(first) = attentions.first() else {
        bail!("the compiled program has no fused Attention: npuc compiles decoder models whose attention the rewrites recognise (see `npuc explore --why`)");
    };
    let int = |n: &ir::Node, k: &str| n.attrs.int(k).ok().flatten().unwrap_or(0).max(0) as usize;
    let heads = int(first, "q_heads");
    let kv_heads = int(first, "kv_heads");
    let q = g.value(first.inputs[0].ok_or_else(|| anyhow!("Attention without q"))?);
    let head_dim = q.shape.last().and_then(|d| d.as_known()).unwrap_or(0) as usize;
    let known = |v: &ir::Value, i: usize| v.shape.get(i).and_then(|d| d.as_known()).unwrap_or(0) as usize;
    let logits = g.value(g.outputs[0]);
    let vocab = logits.shape.last().and_then(|d| d.as_known()).unwrap_or(0) as usize;
    let hidden = g
        .nodes
        .iter()
        .find(|n| n.op.starts_with("RmsNorm") || n.op.starts_with("SkipRmsNorm"))
        .map(|n| known(g.value(n.outputs[0]), g.value(n.outputs[0]).shape.len().saturating_sub(1)))
        .unwrap_or(0);
    let intermediate = g
        .nodes
        .iter()
        .find(|n| n.op == "SwiGlu")
        .map(|n| known(g.value(n.outputs[0]), g.value(n.outputs[0]).shape.len().saturating_sub(1)))
        .unwrap_or(0);
    let rms_eps = g
        .nodes
        .iter()
        .find(|n| n.op.contains("RmsNorm"))
        .and_then(|n| n.attrs.float("epsilon").ok().flatten())
        .unwrap_or(0.0) as f64;
    // Tied: the embedding gather and the last GEMM read the same weight.
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
    let tied = match (embed, head) {
        (Some(e), Some(h)) => {
            let ew = weights_of(e);
            weights_of(h).iter().any(|w| ew.contains(w))
        }
        _ => false,
    };
    let max_positions = g
        .nodes
        .iter()
        .filter(|n| n.op == "Gather")
        .filter_map(|n| n.inputs[0])
        .map(|v| g.value(v))
        .filter(|v| {
            matches!(v.def, ValueDef::Weight(_)) && v.shape.last().and_then(|d| d.as_known()) == Some(head_dim as i64)
        })
        .map(|v| known(v, 0))
        .next()
        .unwrap_or(0);
    Ok(ModelConfig {
        layers: attentions.len(),
        hidden,
        heads,
        kv_heads,
        head_dim,
        intermediate,
        vocab,
        rms_eps,
        rope_theta: 0.0,
        tied_embeddings: tied,
        max_positions,
        bos_token_id: None,
        eos_token_id: None,
        stop_token_ids: vec![],
    })
}

/// Beginning- and end-of-sequence ids from a tokenizer.json's special added tokens.
fn special_tokens(path: &Path) -> Result<(Option<u32>, Option<u32>)> {
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

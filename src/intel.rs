//! `npuc compile --target intel-npu`: the OpenVINO IR segments and their shared weights file in
//! the bundle (`intel/*.xml`, `intel/weights.bin`, `intel/plan.json`), and the host program they
//! agree with (see the `codegen-intel` crate doc).

use anyhow::{bail, Context, Result};
use codegen_intel::symmetric::Asymmetric;
use runtime::bundle::BundleWriter;
use serde_json::{json, Value};

/// The intel-npu options of `npuc compile`.
#[derive(clap::Args, Clone, Debug)]
pub struct IntelArgs {
    /// intel-npu: token block sizes, one static-shape network per segment each.
    #[arg(long, value_delimiter = ',', default_value = "1,64")]
    pub blocks: Vec<usize>,
    /// intel-npu: verify block sizes for speculative decoding (`npuc run --backend openvino
    /// --speculate`), each at least 2, or `none`: one more network per segment each, the lm_head's
    /// over every row, viewing the same weights.bin (no weight bytes). Drafts are at most the
    /// largest size − 1 tokens.
    #[arg(long, default_value = "2,4", value_parser = parse_verify_blocks)]
    pub verify_blocks: VerifyBlocks,
    /// intel-npu: what to do with asymmetric (zero-point) weights: `requantize` them symmetrically
    /// (the error is reported per weight) or `reject` the model.
    #[arg(long, default_value = "requantize", value_parser = ["requantize", "reject"])]
    pub asymmetric: String,
    /// intel-npu: positions the RoPE tables cover (the longest context on this target).
    #[arg(long, default_value_t = 4096)]
    pub rope_positions: usize,
    /// intel-npu: how a float model's projection weights are stored: `int4` (symmetric, groups
    /// of 128 along K where K divides, else per channel), `int8` (symmetric, per channel) or `f16`.
    /// The host program runs the same weights; the error is reported per weight.
    #[arg(long, default_value = "int4", value_parser = ["int4", "int8", "f16"])]
    pub weights: String,
}

/// `--verify-blocks`: sizes of at least 2 rows, comma-separated, or `none`.
#[derive(Clone, Debug)]
pub struct VerifyBlocks(pub Vec<usize>);

fn parse_verify_blocks(s: &str) -> Result<VerifyBlocks, String> {
    if s == "none" {
        return Ok(VerifyBlocks(Vec::new()));
    }
    let sizes = s.split(',').map(|t| t.trim().parse::<usize>().ok().filter(|&b| b >= 2));
    let sizes = sizes.collect::<Option<Vec<usize>>>();
    sizes.map(VerifyBlocks).ok_or_else(|| format!("`{s}` is not `none` or a list of sizes of at least 2 rows"))
}

/// The bundle folder of the IR.
pub const DIR: &str = runtime::bundle::intel::DIR;

pub fn compile(program: &ir::Graph, a: &IntelArgs) -> Result<codegen_intel::IntelIr> {
    if a.blocks.is_empty() || a.blocks.contains(&0) {
        bail!("--blocks needs positive token block sizes, got {:?}", a.blocks);
    }
    let options = codegen_intel::Options {
        blocks: a.blocks.clone(),
        verify_blocks: a.verify_blocks.0.clone(),
        asymmetric: if a.asymmetric == "reject" { Asymmetric::Reject } else { Asymmetric::Requantize },
        rope_positions: a.rope_positions,
        weights: a.weights.parse().map_err(anyhow::Error::msg)?,
    };
    codegen_intel::compile(program, &options).context("writing the OpenVINO IR")
}

/// Adds the IR files to the bundle.
pub fn write(w: &mut BundleWriter, ir: &codegen_intel::IntelIr) -> Result<()> {
    for (name, text) in &ir.xml {
        w.add_file(&format!("{DIR}/{name}"), text.as_bytes()).with_context(|| format!("storing {DIR}/{name}"))?;
    }
    w.add_file(&format!("{DIR}/{}", codegen_intel::WEIGHTS_FILE), &ir.weights)?;
    w.add_file(&format!("{DIR}/{}", codegen_intel::PLAN_FILE), &ir.plan.encode())?;
    Ok(())
}

/// The summary: segments, IR and weights bytes, and the re-quantisation error.
pub fn summary(ir: &codegen_intel::IntelIr) -> Value {
    let xml_bytes: usize = ir.xml.iter().map(|(_, t)| t.len()).sum();
    type Errors<'a> = Vec<&'a codegen_intel::symmetric::WeightError>;
    let requantized: Errors = ir.requantized.iter().filter(|e| e.requantized).collect();
    let compressed: Errors = ir.requantized.iter().filter(|e| e.from_float.is_some()).collect();
    let worst = |v: &Errors| v.iter().map(|e| e.max_rel).fold(0.0f64, f64::max);
    let mean = |v: &Errors| if v.is_empty() { 0.0 } else { v.iter().map(|e| e.mean_rel).sum::<f64>() / v.len() as f64 };
    let format = compressed.first().and_then(|e| e.from_float).map(|f| f.name());
    json!({
        "segments": ir.plan.segments.len(),
        "xml_files": ir.xml.len(),
        "xml_bytes": xml_bytes,
        "weights_bin_bytes": ir.weights.len(),
        "blocks": ir.plan.blocks,
        "verify_blocks": ir.plan.verify_blocks,
        "verify_xml_bytes": verify_xml_bytes(ir),
        "requantized_weights": requantized.len(),
        "requantized_max_rel_error": worst(&requantized),
        "requantized_mean_rel_error": mean(&requantized),
        "float_weights": format,
        "compressed_weights": compressed.len(),
        "compressed_max_rel_error": worst(&compressed),
        "compressed_mean_rel_error": mean(&compressed),
        "weights": ir.requantized.iter().map(|e| json!({
            "weight": e.weight, "requantized": e.requantized, "from_float": e.from_float.map(|f| f.name()),
            "max_rel": e.max_rel, "mean_rel": e.mean_rel,
        })).collect::<Vec<_>>(),
    })
}

/// Bytes of XML of the networks only the verify blocks need (the block-sized segments' networks
/// of sizes not in `blocks`, the lm_head's over every row).
fn verify_xml_bytes(ir: &codegen_intel::IntelIr) -> usize {
    let mut files = std::collections::HashSet::new();
    for seg in &ir.plan.segments {
        for (t, file) in &seg.files {
            let plain = if seg.last_row_only { *t == 1 } else { ir.plan.blocks.contains(t) };
            if !plain {
                files.insert(file.as_str());
            }
        }
    }
    ir.xml.iter().filter(|(name, _)| files.contains(name.as_str())).map(|(_, text)| text.len()).sum()
}

/// One line for the text summary.
pub fn summary_line(ir: &codegen_intel::IntelIr) -> String {
    let s = summary(ir);
    let compressed = s["compressed_weights"].as_u64().unwrap_or(0) as usize;
    let float = if compressed == 0 {
        String::new()
    } else {
        format!(
            "; {compressed} float weights stored as {} (relative error max {:.3e}, mean {:.3e})",
            s["float_weights"].as_str().unwrap_or("?"),
            s["compressed_max_rel_error"].as_f64().unwrap_or(0.0),
            s["compressed_mean_rel_error"].as_f64().unwrap_or(0.0),
        )
    };
    format!(
        "intel-npu: {} segments, {} IR files ({} bytes of XML), {} bytes in {DIR}/weights.bin; {} weights re-quantised symmetrically (relative error max {:.3e}, mean {:.3e}); scales of {} weights rounded to f16{float}",
        s["segments"],
        s["xml_files"],
        s["xml_bytes"],
        s["weights_bin_bytes"],
        s["requantized_weights"],
        s["requantized_max_rel_error"].as_f64().unwrap_or(0.0),
        s["requantized_mean_rel_error"].as_f64().unwrap_or(0.0),
        ir.requantized.len() - compressed - s["requantized_weights"].as_u64().unwrap_or(0) as usize,
    )
}

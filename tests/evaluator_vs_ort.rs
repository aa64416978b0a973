//! Import + reference evaluator against ONNX Runtime, on every model of the exporter corpus
//! (`fixtures/corpus`, written by the real exporters; see `tools/export_corpus.py`).
//!
//! Each entry holds a prefill case (the prompt, empty past) and a decode case (one token on the
//! prefill's KV), with ONNX Runtime's outputs on the unmodified file as the expected values.
//! Every graph output is compared: logits and every present key/value.
//!
//! Tolerances, relative to the largest |expected| of each output:
//! - float graphs (optimum, torch dynamo at opset 18 and 23, the builder's fp32) and the
//!   builder's int4 graphs at `accuracy_level` 1: 1e-4. Both sides compute the same f32 graph;
//!   the evaluator accumulates in f64, ONNX Runtime in f32 with its own order.
//! - the builder's int4 graphs at its default `accuracy_level` 4: the evaluator quantises each
//!   activation block to int8 as ONNX Runtime does, but an activation within an ulp of a rounding
//!   boundary can take the other code on either side; [`LEVEL4_TOL`] says what that costs.
//! - QDQ graphs (quantize_static, AMD Quark): the integer parts are exact, but an activation
//!   whose f32 value lies within an ulp of a rounding boundary of QuantizeLinear can round the
//!   other way on either side, moving that code by one step; outputs that are DequantizeLinear
//!   results are compared in steps of their scale (bound: [`QDQ_MAX_STEPS`]), float outputs (the
//!   KV cache) against [`QDQ_FLOAT_TOL`].

mod common;

use common::{fixture, max_abs_diff, read_case};

/// Imports `name`, runs both cases, and checks every output within `rel_tol` of its largest
/// |expected|, except outputs that are DequantizeLinear results, which must be within `max_lsb`
/// steps of their scale. Returns the worst errors seen, or what exceeded its bound.
fn check(name: &str, rel_tol: f64, max_lsb: f64) -> Result<String, String> {
    let imported = frontend::import_file(&fixture(name).join("model.onnx")).map_err(|e| format!("{name}: {e}"))?;
    let g = &imported.graph;
    let (mut worst, mut worst_lsb) = (0.0f64, 0.0f64);
    for case in ["prefill", "decode"] {
        let c = read_case(name, case);
        let got = ir::run::run_graph(g, &c.inputs).map_err(|e| format!("{name}/{case}: {e}"))?;
        for (out, want) in &c.outputs {
            let t = got.get(out).ok_or_else(|| format!("{name}/{case}: output {out} missing"))?;
            let (d, m) = max_abs_diff(t, want);
            if let Some(scale) = g.value_by_name().get(out.as_str()).and_then(|&v| g.dequantize_step(v)) {
                let lsb = d / scale;
                worst_lsb = worst_lsb.max(lsb);
                // (x - z) * s in f32 is a multiple of s only up to f32 rounding, hence the slack.
                if lsb > max_lsb + 1e-3 {
                    return Err(format!(
                        "{name}/{case}: {out}: max|Δ| = {d:e} is {lsb} steps of its scale {scale:e}, above {max_lsb}"
                    ));
                }
                continue;
            }
            let rel = if m > 0.0 { d / m } else { d };
            worst = worst.max(rel);
            if rel.is_nan() || rel > rel_tol {
                return Err(format!(
                    "{name}/{case}: {out}: max|Δ| = {d:e} is {rel:e} of max|ref| = {m:e}, above {rel_tol:e}"
                ));
            }
        }
    }
    Ok(format!(
        "{name}: float outputs worst max|Δ|/max|ref| = {worst:.3e}; dequantized outputs worst = {worst_lsb} steps"
    ))
}

/// Checks every named entry and fails once, listing each entry that exceeded its bound.
fn check_all(names: &[String], rel_tol: f64, max_lsb: f64) {
    let failures: Vec<String> = names
        .iter()
        .filter_map(|n| match check(n, rel_tol, max_lsb) {
            Ok(summary) => {
                eprintln!("{summary}");
                None
            }
            Err(e) => Some(e),
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The tiny entries of each exporter.
fn tiny(exporters: &[&str]) -> Vec<String> {
    exporters.iter().flat_map(|x| common::tiny_entries(x)).collect()
}

const FLOAT_TOL: f64 = 1e-4;

#[test]
fn float_graphs_of_optimum_torch_dynamo_and_the_builder() {
    check_all(&tiny(&["optimum", "torch-dynamo", "torch-dynamo-opset23", "builder-fp32"]), FLOAT_TOL, 0.0);
}

#[test]
fn builder_int4_at_accuracy_level_1() {
    check_all(&tiny(&["builder-int4-acc1"]), FLOAT_TOL, 0.0);
}

/// Measured: 8 of the 10 entries agree to 7.6e-7; in llama-builder-int4 (2.8e-3) and
/// qwen3-builder-int4-b128-asym (1.5e-2) an activation block's code takes the other side of a
/// rounding boundary and the logits part by that. Each such node's product is held to ONNX
/// Runtime's node by node in the corpus test.
const LEVEL4_TOL: f64 = 0.05;

#[test]
fn builder_int4_at_accuracy_level_4() {
    check_all(&tiny(&["builder-int4", "builder-int4-b128-asym"]), LEVEL4_TOL, 0.0);
}

/// QDQ graphs: codes may differ where an activation lands on a rounding tie. Measured on the 18
/// entries: 16 agree exactly, llama-qdq-per-tensor-s8 and qwen3-quark-a8w8 part by one step of
/// the logits' scale; float outputs (the caches) within 2e-7.
const QDQ_MAX_STEPS: f64 = 1.0;
const QDQ_FLOAT_TOL: f64 = 1e-4;

#[test]
fn qdq_graphs_of_quantize_static_and_quark() {
    check_all(&tiny(&["qdq-per-tensor-s8", "qdq-per-channel-u8", "quark-a8w8"]), QDQ_FLOAT_TOL, QDQ_MAX_STEPS);
}

#[test]
fn smollm2_real_weights_optimum_float() {
    check_all(&["smollm2-optimum".into()], FLOAT_TOL, 0.0);
}

#[test]
fn smollm2_real_weights_builder_int4_accuracy_level_1() {
    check_all(&["smollm2-builder-int4-acc1".into()], FLOAT_TOL, 0.0);
}

//! fp16 numerics on adversarial activations: tiny corpus models as optimum and the builder wrote
//! them (`FIXTURES`), with a few weights scaled so that
//! activations leave fp16's range, run by the fp16 simulation (`ir::fp16sim`: fp16 storage and
//! arithmetic, denormals flushed) as the `cpu` pipeline compiles them (no rescale rules) and as the
//! `intel-npu` pipeline does (the `fp16-rescale` family). Without the rules the logits are
//! non-finite or collapse; with them they match the f32 reference evaluator on the same scaled
//! model within KL(p_f32 ‖ p_fp16) < 0.01 per position.
//!
//! The scalings keep the model's function while moving its activations (each is exact in real
//! arithmetic except where stated):
//! - `big residual`: layer 0's o_proj ×4096 (its scales for 4-bit forms, its weight for float
//!   ones). The residual after layer 0's attention is then dominated by rows of magnitude ~10⁴:
//!   their squares (10⁸) overflow fp16 in every later norm. Not function-preserving — the
//!   reference is the f32 run of the scaled model.
//! - `tiny rows`: the embedding's rows ×2⁻⁸ and every layer's input norm γ unchanged: the first
//!   norm sees rows whose squares are below fp16's smallest normal (and ε = 10⁻⁵ is subnormal), so
//!   mean(x²) + ε flushes to zero. The tied lm_head shares the table, so the final norm's γ is
//!   multiplied by 2⁸ to keep the logits: that also makes the lm_head's activations large.
//! - `large activations into 4-bit GEMMs` (4-bit forms): layer 0's v projection ×2¹¹, so the
//!   attention output feeding o_proj is ~2000×: o_proj's blocks of 32 code × activation products
//!   sum past 65504. Not function-preserving either. To show it is the GEMMs that fail, the
//!   `intel-npu` program is also run with its norms row-scaled but its WGemms not.
//! - hybrid decoders (the builder's Qwen3.5, fp32 and int4; see the section below): q and k ×2¹⁰
//!   and v ×2⁻¹⁰ through the convolution, and the models as they are, for the q/k L2 norm and
//!   GatedRMSNorm the device computes around the delta rule's host step.
//!
//! Measured with `cargo test --release --test fp16_sim -- --nocapture` (it prints the worst KL of
//! each run).

mod common;

use ir::graph::{Graph, ValueDef};
use ir::weights::{Weight, WeightStore};
use ir::{Domain, Tensor, ValueId};
use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

fn import(name: &str) -> Graph {
    frontend::import_file(&common::fixture(name).join("model.onnx")).unwrap_or_else(|e| panic!("{e}")).graph
}

fn compile(g: Graph, target: &str) -> Graph {
    let t = passes::targets::target(target).unwrap();
    passes::driver::run(&t.pipeline(), g, None, |_, _| {}).unwrap_or_else(|e| panic!("{target}: {e}")).graph
}

/// The weight behind a value, looking through Reshape/Transpose/Unsqueeze of it.
fn weight_of(g: &Graph, mut v: ValueId) -> Option<ir::weights::WeightId> {
    loop {
        match &g.value(v).def {
            ValueDef::Weight(w) => return Some(*w),
            ValueDef::Node { node, .. } => {
                let n = g.node(*node);
                if !matches!(n.op, "Reshape" | "Transpose" | "Unsqueeze") {
                    return None;
                }
                v = n.inputs[0]?;
            }
            _ => return None,
        }
    }
}

/// `g` with the float weights named in `factors` multiplied by their factor.
fn scaled(g: &Graph, factors: &HashMap<String, f32>) -> Graph {
    let all = factors.iter().map(|(k, &f)| (k.clone(), (f, None))).collect();
    scaled_rows(g, &all)
}

/// `g` with the float weights named in `factors` multiplied by their factor, only along the given
/// rows of the first axis when a range is given.
fn scaled_rows(g: &Graph, factors: &HashMap<String, (f32, Option<Range<usize>>)>) -> Graph {
    let mut store = WeightStore::default();
    let mut hit = 0;
    for (_, w) in g.weights.iter() {
        let bytes = match factors.get(&w.name) {
            Some((f, rows)) => {
                hit += 1;
                let t = w.to_tensor().unwrap();
                assert!(t.dtype == ir::DType::F32, "{} is {}, not f32", w.name, t.dtype);
                let row = t.numel() / t.shape[0];
                let rows = rows.clone().unwrap_or(0..t.shape[0]);
                let v: Vec<u8> = t
                    .to_f32_vec()
                    .iter()
                    .enumerate()
                    .flat_map(|(i, x)| (if rows.contains(&(i / row)) { x * f } else { *x }).to_le_bytes())
                    .collect();
                bytes::Bytes::from(v)
            }
            None => w.bytes.clone(),
        };
        store.add(Weight::new(w.name.clone(), w.dtype, w.shape.clone(), bytes));
    }
    assert_eq!(hit, factors.len(), "not every weight to scale was found: {factors:?}");
    let mut out = g.clone();
    out.weights = Arc::new(store);
    out
}

fn weight_name(g: &Graph, v: ValueId) -> String {
    g.weights.get(weight_of(g, v).expect("a weight")).name.clone()
}

/// The node computing `op` whose name or first output mentions every part of `parts`.
fn find_node<'g>(g: &'g Graph, ops: &[&str], parts: &[&str]) -> &'g ir::Node {
    g.nodes
        .iter()
        .find(|n| {
            let text = node_text(g, n);
            ops.contains(&n.op) && parts.iter().all(|p| text.contains(p))
        })
        .unwrap_or_else(|| panic!("no {ops:?} node mentioning {parts:?}"))
}

/// KL(softmax(p) ‖ softmax(q)) for each row of the last axis; ∞ when q has a non-finite value.
fn kl_rows(p: &Tensor, q: &Tensor) -> Vec<f64> {
    let v = *p.shape.last().unwrap();
    let (p, q) = (p.to_f64_vec(), q.to_f64_vec());
    p.chunks(v)
        .zip(q.chunks(v))
        .map(|(a, b)| {
            if b.iter().any(|x| !x.is_finite()) {
                return f64::INFINITY;
            }
            let lse = |r: &[f64]| {
                let m = r.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                m + r.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
            };
            let (la, lb) = (lse(a), lse(b));
            a.iter().zip(b).map(|(x, y)| (x - la).exp() * ((x - la) - (y - lb))).sum()
        })
        .collect()
}

struct Outcome {
    /// KL per position of the fp16 run of the `cpu` program against f32.
    plain: Vec<f64>,
    /// The same for the `intel-npu` program (row-scaled forms).
    rescaled: Vec<f64>,
    /// Largest |logit| of the f32 reference, and whether the plain fp16 logits are all zero.
    plain_all_zero: bool,
}

fn run(fixture: &str, g: &Graph) -> Outcome {
    let case = common::read_case(fixture, "prefill");
    let host = compile(g.clone(), "cpu");
    let npu = compile(g.clone(), "intel-npu");
    assert!(npu.nodes.iter().any(|n| n.op.ends_with("RowScaled")), "intel-npu did not rescale {fixture}");
    let reference = &ir::run::run_graph(&host, &case.inputs).unwrap()["logits"];
    let plain = &ir::fp16sim::run_graph_fp16(&host, &case.inputs).unwrap()["logits"];
    let rescaled = &ir::fp16sim::run_graph_fp16(&npu, &case.inputs).unwrap()["logits"];
    Outcome {
        plain: kl_rows(reference, plain),
        rescaled: kl_rows(reference, rescaled),
        plain_all_zero: plain.to_f64_vec().iter().all(|v| *v == 0.0),
    }
}

fn worst(v: &[f64]) -> f64 {
    v.iter().cloned().fold(0.0, f64::max)
}

/// optimum's float graphs and the builder's int4 graphs at `accuracy_level` 1 (float
/// activations: at level 4 the products' activations are int8 codes, which fp16 cannot overflow).
const FIXTURES: [&str; 4] = ["llama-optimum", "qwen3-optimum", "llama-builder-int4-acc1", "qwen3-builder-int4-acc1"];
const INT4: [&str; 2] = ["llama-builder-int4-acc1", "qwen3-builder-int4-acc1"];

#[test]
fn unmodified_fixtures_need_no_rescaling_in_fp16() {
    for f in FIXTURES {
        let o = run(f, &import(f));
        eprintln!("{f}: plain {:.2e} rescaled {:.2e}", worst(&o.plain), worst(&o.rescaled));
        assert!(worst(&o.plain) < 0.01 && worst(&o.rescaled) < 0.01, "{f}: {:?} {:?}", o.plain, o.rescaled);
    }
}

#[test]
fn a_big_residual_overflows_fp16_norms_unless_rescaled() {
    for f in FIXTURES {
        let g = import(f);
        let o_proj = find_node(&g, &["MatMul", "MatMulNBits"], &["layers.0", "o_proj"]);
        let w = if o_proj.op == "MatMul" { o_proj.inputs[1] } else { o_proj.inputs[2] };
        let o = run(f, &scaled(&g, &HashMap::from([(weight_name(&g, w.unwrap()), 4096.0)])));
        eprintln!(
            "{f}: plain {:.2e} (all zero {}) rescaled {:.2e}",
            worst(&o.plain),
            o.plain_all_zero,
            worst(&o.rescaled)
        );
        assert!(
            o.plain_all_zero || worst(&o.plain).is_infinite(),
            "{f}: fp16 without rescaling survived: {:?}",
            o.plain
        );
        assert!(worst(&o.rescaled) < 0.01, "{f}: {:?}", o.rescaled);
    }
}

/// The embedding gather's float table (optimum) or scales (the builder's GatherBlockQuantized),
/// and whether the lm_head reads it too.
fn embedding_weight(g: &Graph) -> (String, bool) {
    let gather = g
        .nodes
        .iter()
        .find(|n| {
            matches!(n.op, "Gather" | "GatherBlockQuantized") && n.inputs[1].is_some_and(|i| g.inputs.contains(&i))
        })
        .expect("an embedding gather of a graph input");
    let table = if gather.op == "Gather" { gather.inputs[0] } else { gather.inputs[2] };
    let id = weight_of(g, table.unwrap()).expect("the embedding's weight");
    let logits = g.outputs.iter().find(|&&o| g.value(o).name == "logits").unwrap();
    let ValueDef::Node { node, .. } = g.value(*logits).def else { panic!("logits are computed") };
    let lm_head = g.node(node);
    let tied = lm_head.inputs.iter().flatten().any(|&i| weight_of(g, i) == Some(id));
    (g.weights.get(id).name.clone(), tied)
}

/// The γ of the norm whose output the lm_head reads: the 1-D weight among the inputs of the node
/// computing the lm_head's activation (optimum's decomposed norm ends in `Mul(γ, x)`, the
/// builder writes `SkipSimplifiedLayerNormalization(x, skip, γ)`).
fn final_norm_weight(g: &Graph) -> String {
    let logits = g.outputs.iter().find(|&&o| g.value(o).name == "logits").unwrap();
    let ValueDef::Node { node, .. } = g.value(*logits).def else { panic!("logits are computed") };
    let activation = g.node(node).inputs[0].unwrap();
    let ValueDef::Node { node: norm, .. } = g.value(activation).def else { panic!("the lm_head reads a norm") };
    let gamma = g
        .node(norm)
        .inputs
        .iter()
        .flatten()
        .filter_map(|&i| weight_of(g, i))
        .find(|&w| g.weights.get(w).shape.len() == 1);
    g.weights.get(gamma.expect("the final norm's γ")).name.clone()
}

#[test]
fn tiny_rows_flush_fp16_norms_to_a_division_by_zero_unless_rescaled() {
    for f in FIXTURES {
        let g = import(f);
        let (embedding, tied) = embedding_weight(&g);
        let mut factors = HashMap::from([(embedding, 1.0 / 256.0)]);
        if tied {
            factors.insert(final_norm_weight(&g), 256.0);
        }
        let o = run(f, &scaled(&g, &factors));
        eprintln!("{f} (tied {tied}): plain {:.2e} rescaled {:.2e}", worst(&o.plain), worst(&o.rescaled));
        assert!(worst(&o.plain).is_infinite(), "{f}: fp16 without rescaling survived: {:?}", o.plain);
        assert!(worst(&o.rescaled) < 0.01, "{f}: {:?}", o.rescaled);
    }
}

#[test]
fn large_activations_overflow_fp16_four_bit_block_sums_unless_rescaled() {
    for f in INT4 {
        let g = import(f);
        let m = common_meta(f);
        // Layer 0's v projection ×2¹¹: attention averages v, so o_proj's activations grow 2048×.
        let factors = match g.nodes.iter().find(|n| {
            n.op == "MatMulNBits" && node_text(&g, n).contains("layers.0") && node_text(&g, n).contains("v_proj")
        }) {
            Some(v) => HashMap::from([(weight_name(&g, v.inputs[2].unwrap()), (2048.0, None))]),
            None => {
                // q|k|v packed in one projection: v is its last kv_heads·head_dim rows.
                let qkv = find_node(&g, &["MatMulNBits"], &["layers.0", "qkv_proj"]);
                let n = qkv_rows(&m);
                HashMap::from([(weight_name(&g, qkv.inputs[2].unwrap()), (2048.0, Some(n - m.kv_rows..n)))])
            }
        };
        let scaled = scaled_rows(&g, &factors);
        let o = run(f, &scaled);
        // The same program with every norm row-scaled but the GEMMs not: what fails is the GEMMs.
        let case = common::read_case(f, "prefill");
        let mut norms_only = compile(scaled.clone(), "intel-npu");
        let mut plain_gemms = 0;
        for n in &mut norms_only.nodes {
            if n.op == "WGemmRowScaled" {
                n.op = "WGemm";
                plain_gemms += 1;
            }
        }
        assert!(plain_gemms > 0);
        let reference = &ir::run::run_graph(&compile(scaled, "cpu"), &case.inputs).unwrap()["logits"];
        let norms_only = kl_rows(reference, &ir::fp16sim::run_graph_fp16(&norms_only, &case.inputs).unwrap()["logits"]);
        eprintln!(
            "{f}: plain {:.2e} norms only {:.2e} rescaled {:.2e}",
            worst(&o.plain),
            worst(&norms_only),
            worst(&o.rescaled)
        );
        assert!(worst(&norms_only).is_infinite(), "{f}: fp16 GEMMs without rescaling survived: {norms_only:?}");
        assert!(worst(&o.plain).is_infinite(), "{f}: fp16 without rescaling survived: {:?}", o.plain);
        assert!(worst(&o.rescaled) < 0.01, "{f}: {:?}", o.rescaled);
    }
}

struct Meta {
    heads: usize,
    kv_rows: usize,
    head_dim: usize,
}

fn common_meta(f: &str) -> Meta {
    let c = common::config(f);
    Meta { heads: c.heads, kv_rows: c.kv_heads * c.head_dim, head_dim: c.head_dim }
}

/// Rows of a packed q|k|v projection.
fn qkv_rows(m: &Meta) -> usize {
    m.heads * m.head_dim + 2 * m.kv_rows
}

fn node_text(g: &Graph, n: &ir::Node) -> String {
    format!("{} {}", n.name, g.value(n.outputs[0]).name)
}

// ---- hybrid decoders: the norms around the delta rule ----
//
// The builder's Qwen3.5 (fp32 and int4): on the intel-npu target the delta rule itself
// (`DeltaNet`, with its decay products and, in prefill, its chunked triangular solve) and the
// convolution run as host steps in f32; what runs in fp16 around them is the q/k L2 norm
// (`LpNormalization`) and the output norm (`GatedRMSNorm`). Two scalings of the convolution's
// channels (weights and bias, `[C, 1, k]` and `[C]`: rows of the first axis) move those norms'
// inputs out of fp16's range; the f32 reference is the scaled model's.

const HYBRID: [&str; 2] = ["qwen3.5-builder-fp32", "qwen3.5-builder-int4"];

fn import_hybrid(name: &str) -> Graph {
    let model = common::hybrid::hybrid_dir().join(name).join("model.onnx");
    frontend::import_file(&model).unwrap_or_else(|e| panic!("{name}: {e}")).graph
}

/// The prefill case's inputs of a hybrid corpus entry.
fn hybrid_case(name: &str) -> HashMap<String, Tensor> {
    let dir = common::hybrid::hybrid_dir().join(name).join("prefill");
    frontend::read_test_case(&dir).unwrap_or_else(|e| panic!("{name}: {e}")).0
}

/// `g` with the ops named in `revert` put back to their unscaled forms; at least one was there.
fn reverted(g: &Graph, revert: &[(&str, Domain, &'static str)]) -> Graph {
    let mut out = g.clone();
    let mut hits = 0;
    for n in &mut out.nodes {
        if let Some(&(_, domain, op)) = revert.iter().find(|(scaled, ..)| *scaled == n.op) {
            (n.domain, n.op) = (domain, op);
            hits += 1;
        }
    }
    assert!(hits > 0, "no {revert:?} in the program");
    out
}

/// KL per position of the fp16 runs of `programs` against the f32 run of the `cpu` program of `g`.
fn kl_hybrid<const N: usize>(name: &str, g: &Graph, programs: [&Graph; N]) -> [Vec<f64>; N] {
    let inputs = hybrid_case(name);
    let reference = &ir::run::run_graph(&compile(g.clone(), "cpu"), &inputs).unwrap()["logits"];
    programs.map(|p| kl_rows(reference, &ir::fp16sim::run_graph_fp16(p, &inputs).unwrap()["logits"]))
}

/// KL per position of the fp16 runs against f32: the `cpu` program, the `intel-npu` program, and
/// the `intel-npu` program with the ops named in `revert` put back to their unscaled forms.
fn run_hybrid(name: &str, g: &Graph, revert: &[(&str, Domain, &'static str)]) -> [Vec<f64>; 3] {
    let (host, npu) = (compile(g.clone(), "cpu"), compile(g.clone(), "intel-npu"));
    kl_hybrid(name, g, [&host, &npu, &reverted(&npu, revert)])
}

/// `g` rewritten by the `fp16-rescale` family alone and extracted under the fp16 cost model: the
/// builder's spelling of the recurrent layers kept (LinearAttention, a host step, with its q/k
/// L2 norms on the device), the norms row-scaled.
fn rescaled_unfolded(g: &Graph) -> Graph {
    use rewrites::saturate::{extract_graph, saturate, Fp16Cost, Limits, Phase};
    let families = vec![rewrites::family("fp16-rescale").unwrap()];
    let phase = Phase { name: "fp16".into(), families, extra_rules: vec![], limits: Limits::default() };
    extract_graph(g, &saturate(g, &[phase], false), Fp16Cost)
}

/// The convolution's weight and bias names of layer 0's linear attention.
fn conv_weights(g: &Graph) -> [String; 2] {
    let conv = find_node(g, &["CausalConvWithState"], &["layers.0"]);
    [weight_name(g, conv.inputs[1].unwrap()), weight_name(g, conv.inputs[2].unwrap())]
}

/// q|k|v channels of the convolution: q and k are the first 2·(q_heads·d_k) = 128 of the 256.
const QK_CHANNELS: Range<usize> = 0..128;
const V_CHANNELS: Range<usize> = 128..256;

/// q and k ×2¹⁰ before the SiLU: rows of magnitude ~10³, whose squares pass 65504. The
/// `intel-npu` program computes their per-head L2 norm in DeltaNet's host step (f32); the
/// builder's spelling left on the device (no `delta-net` fold) needs the row-scaled L2 norm.
#[test]
fn large_q_and_k_overflow_fp16_l2_norms_unless_rescaled() {
    for f in HYBRID {
        let g = import_hybrid(f);
        let factors = conv_weights(&g).map(|w| (w, (1024.0, Some(QK_CHANNELS)))).into_iter().collect();
        let g = scaled_rows(&g, &factors);
        let npu = compile(g.clone(), "intel-npu");
        assert_eq!(npu.nodes.iter().filter(|n| n.op.contains("L2Norm") || n.op == "LpNormalization").count(), 0);
        let unfolded = rescaled_unfolded(&g);
        let plain = reverted(&unfolded, &[("L2NormRowScaled", Domain::Onnx, "LpNormalization")]);
        let [folded, rescaled, l2_plain] = kl_hybrid(f, &g, [&npu, &unfolded, &plain]);
        eprintln!(
            "{f}: l2 norms unscaled {:.2e} rescaled {:.2e} in DeltaNet {:.2e}",
            worst(&l2_plain),
            worst(&rescaled),
            worst(&folded)
        );
        assert!(worst(&l2_plain) > 0.1, "{f}: fp16 L2 norms without rescaling survived: {l2_plain:?}");
        assert!(worst(&rescaled) < 0.01, "{f}: {rescaled:?}");
        assert!(worst(&folded) < 0.01, "{f}: {folded:?}");
    }
}

#[test]
fn small_delta_rule_outputs_flush_fp16_gated_norms_unless_rescaled() {
    for f in HYBRID {
        let g = import_hybrid(f);
        // v ×2⁻¹⁰: the delta rule's outputs (linear in v) fall to ~10⁻⁴, whose squares flush,
        // and ε = 10⁻⁶ flushes with them.
        let factors = conv_weights(&g).map(|w| (w, (1.0 / 1024.0, Some(V_CHANNELS)))).into_iter().collect();
        let revert = [("GatedRmsNormRowScaled", Domain::Microsoft, "GatedRMSNorm")];
        let [plain, rescaled, gated_plain] = run_hybrid(f, &scaled_rows(&g, &factors), &revert);
        eprintln!(
            "{f}: plain {:.2e} gated norms unscaled {:.2e} rescaled {:.2e}",
            worst(&plain),
            worst(&gated_plain),
            worst(&rescaled)
        );
        assert!(worst(&plain).is_infinite(), "{f}: fp16 without rescaling survived: {plain:?}");
        assert!(worst(&gated_plain).is_infinite(), "{f}: fp16 gated norms without rescaling survived: {gated_plain:?}");
        assert!(worst(&rescaled) < 0.01, "{f}: {rescaled:?}");
    }
}

/// The builder's tiny models as they are: the delta rule's outputs are already small (at most
/// ~10⁻², many rows below 2⁻⁷), so the plain GatedRMSNorm flushes them to 0/0 in fp16, and
/// some rows flush to zero on their way from the host step to the device, which the row-scaled
/// form's root floor keeps at zero.
#[test]
fn unmodified_hybrid_models_need_the_rescaled_gated_norm_in_fp16() {
    for f in HYBRID {
        let revert = [("GatedRmsNormRowScaled", Domain::Microsoft, "GatedRMSNorm")];
        let [plain, rescaled, gated_plain] = run_hybrid(f, &import_hybrid(f), &revert);
        eprintln!(
            "{f}: plain {:.2e} gated norms unscaled {:.2e} rescaled {:.2e}",
            worst(&plain),
            worst(&gated_plain),
            worst(&rescaled)
        );
        assert!(worst(&plain).is_infinite() && worst(&gated_plain).is_infinite(), "{f}: {plain:?} {gated_plain:?}");
        assert!(worst(&rescaled) < 0.01, "{f}: {rescaled:?}");
    }
}

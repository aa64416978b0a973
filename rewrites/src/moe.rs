//! Rule family `moe`: a mixture of experts over router logits — softmax, top k, the k weights
//! (renormalised or not), each chosen expert's `fc2 · act(fc1 · x + b1) + b2`, the weighted sum —
//! into `npuc::Moe(x, router_logits, fc1, fc1_scales, fc1_bias, fc2, fc2_scales, fc2_bias)`, one
//! input layout for float experts (no scales) and coded ones.
//!
//! Exporter patterns recognised:
//! - onnxruntime-genai's builder, float experts: `com.microsoft::MoE(x, logits, fc1, b1, fc2, b2)`
//!   (gpt-oss with its clamped SwiGlu, Qwen3.5-MoE and LFM2-MoE with SwiGlu).
//! - the builder's int4 experts: `com.microsoft::QMoE(x, logits, fc1, s1, b1, fc2, s2, b2)` with
//!   blocked scales; QMoE renormalises the k weights whatever `normalize_routing_weights` says,
//!   and the fused op says so (`normalize_routing_weights = 1`).
//!
//! - Qwen3.5-MoE's gated shared expert: `GatedAdd(Moe(…), shared, Sigmoid(g))`, the shared
//!   expert's output added to the routed ones gated by the sigmoid of its own router logit, into
//!   `Moe(…, shared, g)`.
//!
//! What stays outside the op: the router projection and the shared expert's MLP and gate
//! projection (GEMMs the targets already run), and LFM2-MoE's sigmoid router (the builder writes
//! its normalised sigmoid weights as logits, `log w` scattered over `-10⁴`, which this op's
//! softmax turns back into the weights). The targets' expert kernels route by softmax over logits
//! they read as a buffer; computing the router or the shared MLP inside the op would need buffers
//! no program value owns.
//!
//! Declined, with the reason recorded: the CUDA-only forms (`use_sparse_mixer`,
//! `swiglu_limit_after_activation`, separate fc3 experts), activations other than relu, gelu,
//! silu, identity and SwiGlu with a fusion, and QMoE's other quantisation types and widths.

use crate::apply::{bound, declines, no_match, Computed, Decline, Fold, Folded};
use crate::cond::var;
use crate::egraph_ops::{node_attrs, nodes_with_children, union};
use crate::Rewrite;
use egg::{rewrite as rw, Id, Subst, Symbol, Var};
use ir::egraph::{EGraph, ENode, Head};
use ir::{Attr, Attrs, Domain};

/// The family's rules.
#[rustfmt::skip]
pub fn rules() -> Vec<Rewrite> {
    vec![
        // MoE(x, r, W1, b1, W2, b2) = Moe(x, r, W1, _, b1, W2, _, b2)
        rw!("moe-float-experts";    "(com.microsoft::MoE ?x ?r ?w1 ?b1 ?w2 ?b2)"             => { ExpertsOp::float() }),
        // QMoE(x, r, C1, s1, b1, C2, s2, b2) = Moe{normalised}(x, r, C1, s1, b1, C2, s2, b2)
        rw!("moe-coded-experts";    "(com.microsoft::QMoE ?x ?r ?w1 ?s1 ?b1 ?w2 ?s2 ?b2)"    => { ExpertsOp::coded() }),
        // GatedAdd(Moe(x, r, …), S, Sigmoid(g)) = Moe(x, r, …, S, g)
        rw!("moe-shared-expert";    "(com.microsoft::GatedAdd (npuc::Moe ?x ?r ?w1 ?s1 ?b1 ?w2 ?s2 ?b2) ?s (Sigmoid ?g))" => { SharedExpert::computed() }),
        // MoE with separate fc3 experts: declined
        rw!("moe-fc3-experts";      "(com.microsoft::MoE ?x ?r ?w1 ?b1 ?w2 ?b2 ?w3 ?b3)"     => { declines(FC3) }),
    ]
}

const FC3: &str = "separate fc3 experts are a CUDA-only form of MoE; Moe gates fc1's fused rows";

/// Attributes whose non-zero value is a CUDA-only form.
const CUDA_ONLY: [&str; 2] = ["use_sparse_mixer", "swiglu_limit_after_activation"];

/// MoE or QMoE of the matched inputs: `Moe` over the same operands in its layout.
struct ExpertsOp {
    op: &'static str,
    inputs: Vec<Var>,
}

impl ExpertsOp {
    fn float() -> Computed<Self> {
        let inputs = ["?x", "?r", "?w1", "?b1", "?w2", "?b2"].map(var).to_vec();
        Computed::new(ExpertsOp { op: "MoE", inputs })
    }

    fn coded() -> Computed<Self> {
        Computed::new(ExpertsOp { op: "QMoE", inputs: ROUTED.map(var).to_vec() })
    }
}

/// Why a MoE or QMoE's attributes are not a form `Moe` computes.
fn unsupported(op: &str, a: &Attrs) -> Option<String> {
    if let Some(name) = CUDA_ONLY.iter().find(|n| a.int(n).ok().flatten().unwrap_or(0) != 0) {
        return Some(format!("{name} is a CUDA-only form of {op}"));
    }
    let fusion = a.int("swiglu_fusion").ok().flatten().unwrap_or(0);
    match a.str("activation_type").ok().flatten().unwrap_or("relu") {
        "relu" | "gelu" | "silu" | "identity" => {}
        "swiglu" if fusion == 1 || fusion == 2 => {}
        other => return Some(format!("activation_type {other:?} with swiglu_fusion {fusion} is not one Moe applies")),
    }
    if op == "QMoE" {
        let bits = a.int("expert_weight_bits").ok().flatten().unwrap_or(4);
        let quant = a.str("quant_type").ok().flatten().unwrap_or("int");
        if quant != "int" || !(bits == 4 || bits == 8) {
            return Some(format!("{bits}-bit {quant} experts are not folded (int4 and int8 are)"));
        }
    }
    None
}

impl Fold for ExpertsOp {
    fn fold(&self, egraph: &mut EGraph, eclass: Id, subst: &Subst, rule: Symbol) -> Folded {
        let inputs: Vec<Id> = self.inputs.iter().map(|&v| subst[v]).collect();
        let node = nodes_with_children(egraph, eclass, self.op, &inputs).next().ok_or_else(no_match)?;
        let mut a = node.head.attrs().cloned().unwrap_or_default();
        if let Some(reason) = unsupported(self.op, &a) {
            return Err(Decline::from(reason));
        }
        let operands = if self.op == "QMoE" {
            // QMoE's CPU kernel renormalises the k weights whatever the attribute says.
            a.set("normalize_routing_weights", Attr::Int(1));
            inputs
        } else {
            let absent = egraph.add(ENode::leaf(Head::Absent));
            let [x, r, w1, b1, w2, b2] = inputs[..] else { return Err(no_match()) };
            vec![x, r, w1, absent, b1, w2, absent, b2]
        };
        let fused = egraph.add(ENode::op(Domain::Npuc, "Moe", a, operands));
        Ok(union(egraph, eclass, fused, rule))
    }
}

/// The routed part of a Moe: its first eight inputs.
const ROUTED: [&str; 8] = ["?x", "?r", "?w1", "?s1", "?b1", "?w2", "?s2", "?b2"];

/// A Moe's output plus a shared expert's gated by the sigmoid of its logits: the same Moe with
/// the shared expert's output and logits as inputs 8 and 9.
struct SharedExpert;

impl SharedExpert {
    fn computed() -> Computed<Self> {
        Computed::new(SharedExpert)
    }
}

impl Fold for SharedExpert {
    fn fold(&self, egraph: &mut EGraph, eclass: Id, subst: &Subst, rule: Symbol) -> Folded {
        let routed: Vec<Id> = ROUTED.map(|v| subst[var(v)]).to_vec();
        let [shared, logits] = bound(subst, ["?s", "?g"]);
        let same = |a: Id, b: Id| egraph.find(a) == egraph.find(b);
        let gated = egraph[eclass].nodes.iter().filter(|n| {
            n.head.op() == Some("GatedAdd")
                && n.children.len() == 3
                && same(n.children[1], shared)
                && nodes_with_children(egraph, n.children[2], "Sigmoid", &[logits]).next().is_some()
        });
        let attrs = gated
            .filter_map(|n| node_attrs(egraph, n.children[0], Domain::Npuc, "Moe", &routed))
            .next()
            .ok_or_else(no_match)?;
        let children = routed.into_iter().chain([shared, logits]).collect();
        let fused = egraph.add(ENode::op(Domain::Npuc, "Moe", attrs, children));
        Ok(union(egraph, eclass, fused, rule))
    }
}

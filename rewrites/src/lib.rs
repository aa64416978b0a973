//! Rule families for npuc's e-graph, one file each, and the saturation machinery that runs them.
//!
//! A family is a named list of directional egg rewrites (`Family::rules`). Every file starts with
//! a `//!` header stating the identity and the exporter patterns it recognises, then an aligned
//! rule table with a one-line identity comment above each rule, then its tests. Conditions are
//! named functions from [`cond`] (or the family's own file), never inline closures. A rule that
//! cannot apply returns no match and never errors; a group it declines records why
//! ([`ir::egraph::NpuAnalysis::decline`]).
//!
//! Plumbing: a right-hand side that is a pattern is written as egg writes it. One that needs
//! computed data implements [`apply::Fold`] (one method: for a match, the classes it changed or an
//! [`apply::Decline`] with the reason) and enters the table as [`apply::Computed`], the crate's one
//! egg `Applier`, which records the decline under egg's own rule name, so the name is written once,
//! in `rw!`. A pattern whose condition must say why it refuses is [`apply::Computed::guarded`]; a
//! rule that only explains why a look-alike is not folded is [`apply::declines`]. Lookups and
//! builders more than one family uses (the matched node's attributes, known shapes and constants,
//! unions, layout ops, the RoPE table lookup) live in [`egraph_ops`]; families import from it and
//! from [`cond`], never from each other. A new rule goes into its family's table in
//! `rewrites/src/<family>.rs` at the place it should be tried, its conditions as named functions
//! (in [`cond`] when another family can use them), its fold as a `Fold` type in the family file
//! below the table, and anything a second family would need into [`egraph_ops`]. A new family is a
//! new file, an entry in [`families`] (or [`fp16_families`]) and a test file
//! `rewrites/tests/<family>.rs`.
//!
//! [`saturate`] runs a schedule of phases (families + limits) over a graph's e-graph and reports
//! per-iteration sizes, rule applications and the stop reason; [`saturate::extract_graph`] turns
//! the result back into an `ir::Graph` under a cost model.

pub mod apply;
pub mod attention;
pub mod causal_conv;
pub mod causal_mask;
pub mod cond;
pub mod delta_net;
pub mod egraph_ops;
pub mod fp16_rescale;
pub mod gelu_gate;
pub mod moe;
pub mod qdq;
pub mod rmsnorm;
pub mod rope;
pub mod saturate;
pub mod silu_gate;
pub mod user;
pub mod weight_only;

pub use ir::egraph::{EGraph, ENode, NpuAnalysis};

/// A rewrite over npuc's e-graph.
pub type Rewrite = egg::Rewrite<ENode, NpuAnalysis>;

/// A named rule family.
#[derive(Clone, Copy)]
pub struct Family {
    /// Kebab-case family name (`rmsnorm`, `silu-gate`, ...), as `npuc explore --family` takes it.
    pub name: &'static str,
    /// One line: the identity the family folds.
    pub summary: &'static str,
    pub rules: fn() -> Vec<Rewrite>,
}

/// Every family npuc has, in the order the default schedule runs them.
pub fn families() -> Vec<Family> {
    vec![
        Family {
            name: "qdq",
            summary: "DequantizeLinear → MatMul (→ QuantizeLinear) into one int8 QGemm",
            rules: qdq::rules,
        },
        Family {
            name: "weight-only",
            summary: "MatMulNBits and blocked-int4 DequantizeLinear → MatMul into WGemm",
            rules: weight_only::rules,
        },
        Family {
            name: "rmsnorm",
            summary: "decomposed and fused RMS normalisations into RmsNorm / SkipRmsNorm",
            rules: rmsnorm::rules,
        },
        Family { name: "rope", summary: "rotate-half and interleaved rotary embeddings into Rope", rules: rope::rules },
        Family {
            name: "silu-gate", summary: "x·σ(x) into Silu, Silu(gate)·up into SwiGlu", rules: silu_gate::rules
        },
        Family {
            name: "gelu-gate",
            summary: "GELU's tanh form into GeluTanh, GeluTanh(gate)·up into GeluGate",
            rules: gelu_gate::rules,
        },
        Family {
            name: "delta-net",
            summary:
                "the gated delta rule (LinearAttention) into DeltaNet, a constant factor on its queries into its scale",
            rules: delta_net::rules,
        },
        Family { name: "causal-conv", summary: "CausalConvWithState into CausalConv", rules: causal_conv::rules },
        Family {
            name: "moe",
            summary: "MoE and QMoE (softmax top-k routing over router logits, expert GEMMs, weighted sum) into Moe",
            rules: moe::rules,
        },
        Family {
            name: "attention",
            summary: "scaled-dot-product attention over the KV cache into one causal GQA Attention",
            rules: attention::rules,
        },
    ]
}

/// The families only fp16 targets run, after [`families`]: not part of the default (cpu)
/// schedule.
pub fn fp16_families() -> Vec<Family> {
    vec![Family {
        name: "fp16-rescale",
        summary: "RmsNorm, SkipRmsNorm and WGemm into row-scaled forms whose fp16 intermediates neither overflow nor flush to zero",
        rules: fp16_rescale::rules,
    }]
}

/// The family called `name`, default or fp16.
pub fn family(name: &str) -> Option<Family> {
    families().into_iter().chain(fp16_families()).find(|f| f.name == name)
}

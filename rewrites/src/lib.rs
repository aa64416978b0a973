//! Rule families for npuc's e-graph, one file each, and the saturation machinery that runs them.
//!
//! A family is a named list of directional egg rewrites (`Family::rules`). Every file starts with
//! a `//!` header stating the identity and the exporter patterns it recognises, then an aligned
//! rule table with a one-line identity comment above each rule, then its tests. Conditions are
//! named functions from [`cond`] (or the family's own file), never inline closures. A rule that
//! cannot apply returns no match and never errors; a group it declines records why
//! ([`ir::egraph::NpuAnalysis::decline`]).
//!
//! [`saturate`] runs a schedule of phases (families + limits) over a graph's e-graph and reports
//! per-iteration sizes, rule applications and the stop reason; [`saturate::extract_graph`] turns
//! the result back into an `ir::Graph` under a cost model.

pub mod apply;
pub mod attention;
pub mod causal_mask;
pub mod cond;
pub mod egraph_ops;
pub mod fp16_rescale;
pub mod gelu_gate;
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

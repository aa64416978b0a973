//! Rule family `fp16-rescale`: the fused ops whose intermediates leave fp16's range become
//! row-scaled forms that compute the same value with every intermediate of bounded magnitude.
//! Only fp16 targets run it (`intel-npu`: an NPU computing in fp16, largest value 65504, smallest
//! normal 2⁻¹⁴ ≈ 6.1·10⁻⁵, denormals flushed to zero), after the default families, and extract
//! with [`crate::saturate::Fp16Cost`], which prices the unscaled forms out.
//!
//! Identities (exact in real arithmetic; `ir::fused` gives the row-scaled ops' step order):
//! - `RmsNorm{ε}(x, γ) = RmsNormRowScaled{ε}(x, γ)`: with c the largest power of two ≤ max|x| of
//!   the row (1 for a row of zeros) and u = x/c, x / √(mean(x²) + ε) = u / √(mean(u²) + ε/c²).
//! - `SkipRmsNorm{ε}(x, skip, γ[, bias]) = SkipRmsNormRowScaled{ε}(…)`: the same on the residual
//!   sum s, which stays unscaled (it is an output, the next layer's residual).
//! - `WGemm(a, w, s[, z]) = WGemmRowScaled(a, w, s[, z])` = WGemm(a/c, …)·c, c per row of a over
//!   K: the product is linear in each row of a. A WGemm with a bias (which `weight-only` never
//!   builds) becomes `Add(WGemmRowScaled(a, w, s, z), bias)`.
//!
//! - `LpNormalization{p=2, last axis}(x) = L2NormRowScaled(x)`: x/‖x‖ = u/‖u‖ with u = x/c.
//! - `GatedRMSNorm{ε}(x, γ, z) = GatedRmsNormRowScaled{ε}(x, γ, z)`: each group of len(γ) values
//!   normalised as RmsNormRowScaled normalises a row, then times act(z).
//!
//! Because c is a power of two, x/c and y·c are exact: the row-scaled ops equal the ops they replace
//! to the last bit of WGemm and within a rounding of the norms' in f32. What changes is what fp16
//! hardware sees: 1 ≤ max|u| < 2 in every row, so Σu² ∈ [1, 4D) and mean(u²) ∈ [1/D, 4) whatever
//! the row's magnitude, and a block of code × activation products sums to at most
//! 2 · block_size · max|code − z| in magnitude (2¹³ for 8-bit codes in blocks of 32).
//!
//! What the family sees: no exporter spelling, only the fused ops the default families fold every
//! exporter's spelling into — `RmsNorm` / `SkipRmsNorm` from the decomposed chains of torch's
//! exporters (and the QDQ graphs made from them), onnxruntime-genai's SimplifiedLayerNormalization /
//! SkipSimplifiedLayerNormalization and opset 23's RMSNormalization, including Qwen3's per-head
//! q/k norms; `WGemm` from the builder's MatMulNBits and blocked 4-bit DequantizeLinear → MatMul —
//! and the two norms the builder writes around Gated DeltaNet layers (Qwen3.5, Qwen3.5-MoE) as
//! they are: the per-head q/k `LpNormalization` and the output `GatedRMSNorm`.
//!
//! Hybrid decoders: on the intel-npu target the recurrent layers themselves (`DeltaNet`,
//! `CausalConv`) and the mixtures of experts are host steps in f32 (their states and routing
//! live on the host), so the delta rule's decay products and its chunked triangular solve never
//! meet fp16; the chunked solve takes relative decays e^(G_t − G_s) ≤ 1, never e^G_t / e^G_s,
//! which would be 0/0 once a long chunk's summed decay passes f32's range
//! (`runtime::exec::run::delta_chunk`). What runs on the device in fp16 around them is the q/k
//! L2 norm, fed straight by the convolution (rows of |x| ≳ 256 overflow Σx²), and the output
//! norm, fed by the delta rule, whose outputs are small (the builder's tiny models: at most
//! ~10⁻², many rows below 2⁻⁷, where every square and ε = 10⁻⁶ flush): both take this family's
//! row scale (`tests/fp16_sim.rs`).
//!
//! Qwen3's q/k norms (an RmsNorm over head_dim of each head's projection) need no rule of their
//! own. A scale-invariant prescale `RmsNorm{ε·2²⁰}(x·2¹⁰, γ)` would lift rows of tiny head outputs
//! (|x| < 2⁻¹², whose squares flush to zero) by a fixed 2¹⁰, moving the window rather than removing
//! it: x·2¹⁰ overflows for |x| > 64, and q/k projections are where Qwen3's large activations show
//! up (the reason it normalises them). The row scale brings every row's largest element to [1, 2)
//! whatever its magnitude, so the q/k norms take the `fp16-rescale-rmsnorm` rule like every other
//! norm (and the prescaled RmsNorm would itself be an RmsNorm that rule rescales again).
//!
//! Left alone, by design: `QGemm` (its activations are integer codes and its products accumulate
//! exactly in integers; there are no float activations to scale); float `MatMul` (float exports: fp16
//! weights are dequantised values of the output's scale, so the partial sums are those of the
//! output itself, which overflow only if the output does).
//!
//! No rule declines: the row-scaled form is never worse than the one it replaces, and a rule
//! whose activation is not a float tensor of rank ≥ 1 does not match (nor does the L2 rule on an
//! L1 norm or on another axis than the last).

use crate::apply::{Computed, Fold, Folded};
use crate::cond::var;
use crate::egraph_ops::{dtype, is_absent, nodes_with_children, rank, union};
use crate::Rewrite;
use egg::{rewrite as rw, Id, Subst, Symbol, Var};
use ir::egraph::{EGraph, ENode, Head};
use ir::{Attrs, Domain};

/// The family's rules.
#[rustfmt::skip]
pub fn rules() -> Vec<Rewrite> {
    vec![
        // RmsNorm(x) = RmsNormRowScaled(x): Σx² overflows fp16 once the row's RMS passes √(65504/D) (10.7 at D = 576) and x² once |x| ≥ 256; mean(x²) flushes to zero for RMS < 2⁻⁷ and ε = 10⁻⁵ is subnormal
        rw!("fp16-rescale-rmsnorm";               "(npuc::RmsNorm ?x ?g)"                     => { RowScaled::norm("RmsNorm", "RmsNormRowScaled", &["?x", "?g"]) }             if is_float_rows("?x")),
        // SkipRmsNorm(x, skip) = SkipRmsNormRowScaled(x, skip): the same overflow and underflow on the residual sum, whose magnitude grows layer by layer
        rw!("fp16-rescale-skip-rmsnorm";          "(npuc::SkipRmsNorm ?x ?skip ?g)"           => { RowScaled::norm("SkipRmsNorm", "SkipRmsNormRowScaled", &["?x", "?skip", "?g"]) } if is_float_rows("?x")),
        // SkipRmsNorm(x, skip, bias) = SkipRmsNormRowScaled(x, skip, bias): as above
        rw!("fp16-rescale-skip-rmsnorm-bias";     "(npuc::SkipRmsNorm ?x ?skip ?g ?bias)"     => { RowScaled::norm("SkipRmsNorm", "SkipRmsNormRowScaled", &["?x", "?skip", "?g", "?bias"]) } if is_float_rows("?x")),
        // LpNormalization{p=2, last axis}(x) = L2NormRowScaled(x): Σx² overflows fp16 once |x| ≳ 256 (the delta rule's q/k rows, straight from a convolution, before any norm) and flushes for rows below 2⁻⁷, where x/‖x‖ divides by zero
        rw!("fp16-rescale-l2norm";                "(LpNormalization ?x)"                      => { RowScaled::l2_norm() }                                                      if is_float_rows("?x")),
        // GatedRMSNorm(x, γ, z) = GatedRmsNormRowScaled(x, γ, z): the delta rule's outputs are small rows (|x| < 2⁻⁷ flushes every square, ε = 10⁻⁶ is below fp16's normal range: y = x/0) and may be large ones
        rw!("fp16-rescale-gated-rmsnorm";         "(com.microsoft::GatedRMSNorm ?x ?g ?z)"    => { RowScaled::gated_norm() }                                                   if is_float_rows("?x")),
        // WGemm(a) = WGemmRowScaled(a): a block's Σ(code − z)·a reaches block·2^(bits−1)·max|a| before its scale applies, past 65504 from |a| ≈ 16 (int8, block 32) or 256 (int4)
        rw!("fp16-rescale-wgemm";                 "(npuc::WGemm ?a ?w ?s)"                    => { RowScaled::wgemm(&["?a", "?w", "?s"]) }                                     if is_float_rows("?a")),
        // WGemm(a, z) = WGemmRowScaled(a, z): as above
        rw!("fp16-rescale-wgemm-zero-points";     "(npuc::WGemm ?a ?w ?s ?z)"                 => { RowScaled::wgemm(&["?a", "?w", "?s", "?z"]) }                               if is_float_rows("?a")),
        // WGemm(a, z, bias) = WGemmRowScaled(a, z) + bias: as above, the bias added after scaling back
        rw!("fp16-rescale-wgemm-bias";            "(npuc::WGemm ?a ?w ?s ?z ?bias)"           => { RowScaled::wgemm(&["?a", "?w", "?s", "?z", "?bias"]) }                      if is_float_rows("?a")),
    ]
}

// ---- conditions ----

/// `?x` is a float tensor of rank ≥ 1: rows along a last axis to scale.
pub fn is_float_rows(x: &str) -> impl Fn(&mut EGraph, Id, &Subst) -> bool {
    let x = var(x);
    move |egraph, _, subst| {
        dtype(egraph, subst[x]).is_some_and(|d| d.is_float()) && rank(egraph, subst[x]).is_some_and(|r| r >= 1)
    }
}

// ---- queries ----

/// The attributes of every `domain::op` node of `class` whose children are `children`.
fn attrs_of(egraph: &EGraph, class: Id, (domain, op): (Domain, &str), children: &[Id]) -> Vec<Attrs> {
    nodes_with_children(egraph, class, op, children)
        .filter(|n| matches!(n.head, Head::Op { domain: d, .. } if d == domain))
        .filter_map(|n| n.head.attrs().cloned())
        .collect()
}

/// The row-scaled op's attributes for a source node's: the same ones.
fn same_attrs(attrs: Attrs, _rank: usize) -> Option<Attrs> {
    Some(attrs)
}

/// `L2NormRowScaled`'s (none) for an `LpNormalization` that is the L2 norm over the last axis;
/// `None` for the L1 norm or another axis, which stay as they are.
fn last_axis_l2(attrs: Attrs, rank: usize) -> Option<Attrs> {
    ir::gated_norms::is_last_axis_l2(&attrs, rank).then(Attrs::default)
}

// ---- fold ----

/// Adds the row-scaled form of the matched `from` node with its attributes and the same children,
/// and unions it with the matched class: the op's class (RmsNorm, WGemm) or its tuple class
/// (SkipRmsNorm, whose projections then hold both forms). A WGemm's bias, present and not
/// absent, is added after the row-scaled product instead.
struct RowScaled {
    from: (Domain, &'static str),
    to: &'static str,
    children: Vec<Var>,
    bias_after: bool,
    /// The row-scaled node's attributes from the source node's and its input's rank; `None`
    /// leaves that node alone.
    attrs: fn(Attrs, usize) -> Option<Attrs>,
}

impl RowScaled {
    fn new(from: (Domain, &'static str), to: &'static str, children: &[&str]) -> Self {
        let children = children.iter().map(|c| var(c)).collect();
        RowScaled { from, to, children, bias_after: false, attrs: same_attrs }
    }

    fn norm(from: &'static str, to: &'static str, children: &[&str]) -> Computed<Self> {
        Computed::new(RowScaled::new((Domain::Npuc, from), to, children))
    }

    fn l2_norm() -> Computed<Self> {
        let from = (Domain::Onnx, "LpNormalization");
        Computed::new(RowScaled { attrs: last_axis_l2, ..RowScaled::new(from, "L2NormRowScaled", &["?x"]) })
    }

    fn gated_norm() -> Computed<Self> {
        let from = (Domain::Microsoft, "GatedRMSNorm");
        Computed::new(RowScaled::new(from, "GatedRmsNormRowScaled", &["?x", "?g", "?z"]))
    }

    fn wgemm(children: &[&str]) -> Computed<Self> {
        let bias_after = children.len() == 5;
        Computed::new(RowScaled { bias_after, ..RowScaled::new((Domain::Npuc, "WGemm"), "WGemmRowScaled", children) })
    }
}

impl Fold for RowScaled {
    fn fold(&self, egraph: &mut EGraph, eclass: Id, subst: &Subst, rule: Symbol) -> Folded {
        let children: Vec<Id> = self.children.iter().map(|&v| egraph.find(subst[v])).collect();
        let rank = rank(egraph, children[0]).unwrap_or(0);
        let mut changed = Vec::new();
        for attrs in attrs_of(egraph, eclass, self.from, &children).into_iter().filter_map(|a| (self.attrs)(a, rank)) {
            let mut inputs = children.clone();
            let bias = if self.bias_after { inputs.pop().filter(|&b| !is_absent(egraph, b)) } else { None };
            let mut scaled = egraph.add(ENode::op(Domain::Npuc, self.to, attrs, inputs));
            if let Some(bias) = bias {
                scaled = egraph.add(ENode::op(Domain::Onnx, "Add", Attrs::default(), vec![scaled, bias]));
            }
            changed.extend(union(egraph, eclass, scaled, rule));
        }
        Ok(changed)
    }
}

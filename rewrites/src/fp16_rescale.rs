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
//! Because c is a power of two, x/c and y·c are exact: the row-scaled ops equal the ops they replace
//! to the last bit of WGemm and within a rounding of RmsNorm's in f32. What changes is what fp16
//! hardware sees: 1 ≤ max|u| < 2 in every row, so Σu² ∈ [1, 4D) and mean(u²) ∈ [1/D, 4) whatever
//! the row's magnitude, and a block of code × activation products sums to at most
//! 2 · block_size · max|code − z| in magnitude (2¹³ for 8-bit codes in blocks of 32).
//!
//! What the family sees: no exporter spelling, only the fused ops the default families fold every
//! exporter's spelling into — `RmsNorm` / `SkipRmsNorm` from the decomposed chains of torch's
//! exporters (and the QDQ graphs made from them), onnxruntime-genai's SimplifiedLayerNormalization /
//! SkipSimplifiedLayerNormalization and opset 23's RMSNormalization, including Qwen3's per-head
//! q/k norms; `WGemm` from the builder's MatMulNBits and blocked 4-bit DequantizeLinear → MatMul.
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
//! whose activation is not a float tensor of rank ≥ 1 does not match.

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

/// The attributes of every npuc `op` node of `class` whose children are `children`.
fn attrs_of(egraph: &EGraph, class: Id, op: &str, children: &[Id]) -> Vec<Attrs> {
    nodes_with_children(egraph, class, op, children)
        .filter(|n| matches!(n.head, Head::Op { domain: Domain::Npuc, .. }))
        .filter_map(|n| n.head.attrs().cloned())
        .collect()
}

// ---- fold ----

/// Adds the row-scaled form of the matched `from` node with its attributes and the same children,
/// and unions it with the matched class: the op's class (RmsNorm, WGemm) or its tuple class
/// (SkipRmsNorm, whose projections then hold both forms). A WGemm's bias, present and not
/// absent, is added after the row-scaled product instead.
struct RowScaled {
    from: &'static str,
    to: &'static str,
    children: Vec<Var>,
    bias_after: bool,
}

impl RowScaled {
    fn norm(from: &'static str, to: &'static str, children: &[&str]) -> Computed<Self> {
        Computed::new(RowScaled { from, to, children: children.iter().map(|c| var(c)).collect(), bias_after: false })
    }

    fn wgemm(children: &[&str]) -> Computed<Self> {
        Computed::new(RowScaled {
            from: "WGemm",
            to: "WGemmRowScaled",
            children: children.iter().map(|c| var(c)).collect(),
            bias_after: children.len() == 5,
        })
    }
}

impl Fold for RowScaled {
    fn fold(&self, egraph: &mut EGraph, eclass: Id, subst: &Subst, rule: Symbol) -> Folded {
        let children: Vec<Id> = self.children.iter().map(|&v| egraph.find(subst[v])).collect();
        let mut changed = Vec::new();
        for attrs in attrs_of(egraph, eclass, self.from, &children) {
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

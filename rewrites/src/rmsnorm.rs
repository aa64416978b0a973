//! Rule family `rmsnorm`: RMS normalisation over the last axis,
//! `y = x / √(mean(x²) + ε) · γ`, into `npuc::RmsNorm{epsilon}(x, γ)`; a residual sum feeding one,
//! `s = a + b; y = RmsNorm(s)`, into `npuc::SkipRmsNorm{epsilon}(a, b, γ)` with `proj0 = y` and
//! `proj1 = s`.
//!
//! Exporter patterns recognised:
//! - torch.onnx's TorchScript exporter (optimum-onnx) on Hugging Face `LlamaRMSNorm` (Llama,
//!   SmolLM2): `Pow(x, 2)` → `ReduceMean(·, [-1])` (axes as an input, keepdims=1) →
//!   `Add(·, ε)` → `Sqrt` → `Div(1, ·)` (torch.rsqrt) → `Mul(x, ·)` → `Mul(γ, ·)`.
//! - Qwen3's modelling code as exported: `Mul(x, x)` for the square,
//!   `Reciprocal(Sqrt(·))`, `Mul(x, ·)`, `Mul(·, γ)`. Its per-head q/k norms are the same chain on
//!   the 4-D `[batch, seq, heads, head_dim]` tensor after the Reshape to heads.
//! - Models written `x / sqrt(mean(x²) + ε)`: `Div(x, Sqrt(·))`.
//! - Exporters targeting opsets below 18 give ReduceMean's axes as an attribute.
//! - onnxruntime-genai's builder: `SimplifiedLayerNormalization` (in ai.onnx, as its builder writes it,
//!   or com.microsoft) and `com.microsoft::SkipSimplifiedLayerNormalization` (outputs: 0 = y,
//!   1 = mean, 2 = inv_std_var, 3 = the sum).
//! - opset 23 (torch dynamo's fused export): `RMSNormalization`, any `stash_type` (it only sets the precision of the
//!   statistics, and RmsNorm keeps them in f64).
//! - onnxruntime's quantize_static and Quark leave the decomposed chain as it is between their
//!   Q/DQ pairs.
//!
//! The decomposed chain is folded in two steps: the normalisation becomes `RmsNorm(x, 1)` (a unit
//! scale of shape `[D]`), then a product with a per-channel scale `γ` of shape `[D]` on either side
//! becomes `RmsNorm(x, γ)`, so a norm without γ folds too. The squared value and the normalised
//! value must be one e-class and ε a one-element constant; same-dtype Casts are gone after import.
//!
//! Residual sums: every `Add(a, b)` (equal types, 2-D or 3-D) whose sum feeds an `RmsNorm` with a
//! per-channel γ becomes `SkipRmsNorm(a, b, γ)`, and the sum's class gains `proj1`, whether or not
//! the sum is used elsewhere: the NPU runtime wants one op producing both, and an unused `proj1`
//! is dead. In a decoder that is every norm but the first layer's input norm (which reads the
//! token embedding): each layer's post-attention norm, the next layer's input norm and the final
//! norm all follow a residual Add. A norm without γ keeps its Add: its `RmsNorm(x, 1)` is also the
//! intermediate of every γ fold, and a SkipRmsNorm built on it would compete for the sum with the
//! one built after the fold.
//!
//! Numerics: `RmsNorm` accumulates in f64 and rounds once; the decomposed f32 chain rounds at every
//! step, so the two differ by a few ulp.
//!
//! Declined, with the reason recorded: ReduceMean over other axes or with keepdims=0; ε added
//! inside the mean (`mean(x² + ε)`, equal in real arithmetic but rounded differently, and not a
//! spelling RmsNorm reproduces); a scale that is not one value per channel of the last axis;
//! SimplifiedLayerNormalization / RMSNormalization over more than the last axis or with its
//! inv_std_var output used; SkipSimplifiedLayerNormalization with output 1 or 2 used; a residual
//! Add whose addends differ in type or are not 2-D/3-D (SkipRmsNorm's input ranks).

use crate::apply::{declines, no_match, Computed, Decline, Fold, Folded};
use crate::cond::{self, var};
use crate::egraph_ops::{
    add_const, attrs, constant, int_values, is_op, nodes_with_children, rank, scalar_value, union,
};
use crate::Rewrite;
use egg::{rewrite as rw, Id, Subst, Symbol, Var};
use ir::egraph::{EGraph, ENode, Head, TypeInfo};
use ir::{Attr, Attrs, Domain, Tensor};

/// The family's rules.
#[rustfmt::skip]
pub fn rules() -> Vec<Rewrite> {
    vec![
        // x / √(mean(x²) + ε) = RmsNorm(x, 1)
        rw!("rmsnorm-div";                  "(Div ?x (Sqrt (Add ?ms ?eps)))"                                => { UnitRmsNorm::new() } if cond::is_scalar("?eps")),
        // x · 1/√(mean(x²) + ε) = RmsNorm(x, 1)
        rw!("rmsnorm-mul-reciprocal";       "(Mul ?x (Reciprocal (Sqrt (Add ?ms ?eps))))"                   => { UnitRmsNorm::new() } if cond::is_scalar("?eps")),
        // x · (1 / √(mean(x²) + ε)) = RmsNorm(x, 1)
        rw!("rmsnorm-mul-div-one";          "(Mul ?x (Div ?one (Sqrt (Add ?ms ?eps))))"                     => { UnitRmsNorm::new() } if cond::is_scalar("?eps") if cond::is_scalar_const("?one", 1.0)),
        // RmsNorm(x, 1) · γ = RmsNorm(x, γ)
        rw!("rmsnorm-scale-right";          "(Mul (npuc::RmsNorm ?x ?unit) ?g)"                             => { ScaledRmsNorm::new() } if is_unit_scale("?unit")),
        // γ · RmsNorm(x, 1) = RmsNorm(x, γ)
        rw!("rmsnorm-scale-left";           "(Mul ?g (npuc::RmsNorm ?x ?unit))"                             => { ScaledRmsNorm::new() } if is_unit_scale("?unit")),
        // SimplifiedLayerNormalization(x, γ) over the last axis = RmsNorm(x, γ)
        rw!("rmsnorm-simplified";           "(SimplifiedLayerNormalization ?x ?g)"                          => { NormOp::new() }),
        // com.microsoft SimplifiedLayerNormalization(x, γ) over the last axis = RmsNorm(x, γ)
        rw!("rmsnorm-simplified-ms";        "(com.microsoft::SimplifiedLayerNormalization ?x ?g)"           => { NormOp::new() }),
        // RMSNormalization(x, γ) over the last axis = RmsNorm(x, γ)
        rw!("rmsnorm-rms-normalization";    "(RMSNormalization ?x ?g)"                                      => { NormOp::new() }),
        // SkipSimplifiedLayerNormalization(x, skip, γ) = SkipRmsNorm(x, skip, γ)
        rw!("rmsnorm-skip-simplified";      "(com.microsoft::SkipSimplifiedLayerNormalization ?x ?skip ?g)" => { SkipNormOp::new(false) }),
        // SkipSimplifiedLayerNormalization(x, skip, γ, bias) = SkipRmsNorm(x, skip, γ, bias)
        rw!("rmsnorm-skip-simplified-bias"; "(com.microsoft::SkipSimplifiedLayerNormalization ?x ?skip ?g ?bias)" => { SkipNormOp::new(true) }),
        // RmsNorm(a + b, γ) = proj0 SkipRmsNorm(a, b, γ), and a + b = proj1 SkipRmsNorm(a, b, γ)
        rw!("rmsnorm-residual";             "(npuc::RmsNorm (Add ?a ?b) ?g)"                                => { ResidualRmsNorm::new() } if cond::is_float("?a")),
        // √(mean(x² + ε)): ε inside the mean, declined
        rw!("rmsnorm-eps-inside-mean";      "(Sqrt (ReduceMean (Add ?sq ?eps) ?axes))"                      => { declines(EPS_INSIDE_MEAN) } if cond::is_scalar("?eps") if is_square("?sq")),
        // √(mean(x² + ε)) with the axes as an attribute: ε inside the mean, declined
        rw!("rmsnorm-eps-inside-mean-attr"; "(Sqrt (ReduceMean (Add ?sq ?eps)))"                            => { declines(EPS_INSIDE_MEAN) } if cond::is_scalar("?eps") if is_square("?sq")),
    ]
}

const EPS_INSIDE_MEAN: &str =
    "ε is added inside the mean, √(mean(x² + ε)): RmsNorm adds it after the mean, and the two round differently";

// ---- conditions ----

/// `?v` is a constant whose elements are all 1: the scale of a norm folded without its γ.
pub fn is_unit_scale(v: &str) -> impl Fn(&mut EGraph, Id, &Subst) -> bool {
    let v = var(v);
    move |egraph, _, subst| is_unit(egraph, subst[v])
}

/// `?sq` holds a square: `Mul(y, y)` or `Pow(y, 2)` for some y.
pub fn is_square(sq: &str) -> impl Fn(&mut EGraph, Id, &Subst) -> bool {
    let sq = var(sq);
    move |egraph, _, subst| egraph[subst[sq]].nodes.iter().any(|n| square_base(egraph, n).is_some())
}

// ---- queries ----

/// The class is a constant whose elements are all 1.
fn is_unit(egraph: &EGraph, id: Id) -> bool {
    constant(egraph, id).is_some_and(|t| t.numel() > 0 && t.to_f64_vec().iter().all(|&x| x == 1.0))
}

/// The y of a node `Mul(y, y)` or `Pow(y, 2)`.
fn square_base(egraph: &EGraph, n: &ENode) -> Option<Id> {
    let base = *n.children.first()?;
    let second = *n.children.get(1)?;
    let is_square = (is_op(n, Domain::Onnx, "Mul") && egraph.find(base) == egraph.find(second))
        || (is_op(n, Domain::Onnx, "Pow") && scalar_value(egraph, second) == Some(2.0));
    is_square.then(|| egraph.find(base))
}

/// Why a mean of squares is not the one RmsNorm takes: the decline reason its rule records.
#[derive(Debug, thiserror::Error)]
enum NotLastAxisMean {
    #[error("the mean of x² drops the reduced axis (keepdims=0)")]
    DropsAxis,
    #[error("the mean of x² is over axes {axes:?} of a rank-{rank} tensor; RmsNorm normalises the last axis only")]
    OtherAxes { axes: Vec<i64>, rank: i64 },
    #[error(
        "the mean of x² is over all axes or over axes computed at run time; RmsNorm normalises the last axis only"
    )]
    UnknownAxes,
}

impl From<NotLastAxisMean> for Decline {
    fn from(e: NotLastAxisMean) -> Decline {
        Decline(Some(e.to_string()))
    }
}

/// Whether class `ms` holds `ReduceMean(x²)`: `None` when it does not, `Some(Err(reason))` when it
/// does but not over the last axis alone with keepdims=1.
fn mean_square_over_last_axis(egraph: &EGraph, ms: Id, x: Id) -> Option<Result<(), NotLastAxisMean>> {
    let x = egraph.find(x);
    let rank = rank(egraph, x)? as i64;
    let mean = egraph[ms].nodes.iter().find(|n| {
        is_op(n, Domain::Onnx, "ReduceMean")
            && egraph[n.children[0]].nodes.iter().any(|s| square_base(egraph, s) == Some(x))
    })?;
    let attrs = mean.head.attrs()?;
    let axes: Option<Vec<i64>> = match mean.children.get(1) {
        Some(&a) => int_values(egraph, a),
        None => attrs.ints("axes").ok().flatten().map(<[i64]>::to_vec),
    };
    if attrs.int_or("keepdims", 1).ok() != Some(1) {
        return Some(Err(NotLastAxisMean::DropsAxis));
    }
    match axes.as_deref() {
        Some([a]) if *a == -1 || *a == rank - 1 => Some(Ok(())),
        Some(axes) => Some(Err(NotLastAxisMean::OtherAxes { axes: axes.to_vec(), rank })),
        None => Some(Err(NotLastAxisMean::UnknownAxes)),
    }
}

/// The epsilon of the `RmsNorm(x, g)` node of class `class`.
fn rms_norm_epsilon(egraph: &EGraph, class: Id, x: Id, g: Id) -> Option<f32> {
    nodes_with_children(egraph, class, "RmsNorm", &[x, g]).next()?.head.attrs()?.float("epsilon").ok().flatten()
}

/// The epsilon of the `RmsNorm(x, unit)` that a `Mul` of class `product` multiplies by `g`, on
/// either side.
fn scaled_rms_norm_epsilon(egraph: &EGraph, product: Id, x: Id, unit: Id, g: Id) -> Option<f32> {
    let g = egraph.find(g);
    egraph[product].nodes.iter().filter(|n| is_op(n, Domain::Onnx, "Mul") && n.children.len() == 2).find_map(|n| {
        let (c0, c1) = (egraph.find(n.children[0]), egraph.find(n.children[1]));
        let right = (c1 == g).then(|| rms_norm_epsilon(egraph, c0, x, unit)).flatten();
        right.or_else(|| (c0 == g).then(|| rms_norm_epsilon(egraph, c1, x, unit)).flatten())
    })
}

/// Whether output `i` of the multi-output node in class `tuple` has a user.
fn output_used(egraph: &EGraph, tuple: Id, i: usize) -> bool {
    egraph.lookup(ENode { head: Head::Proj(i), children: vec![tuple] }).is_some_and(|p| egraph[p].parents().len() > 0)
}

/// Why `g` cannot be the per-channel scale of a norm over `x`'s last axis, if it cannot.
fn channel_scale_problem(egraph: &EGraph, g: Id, x: &TypeInfo) -> Option<String> {
    let Some(gt) = egraph[g].data.ty() else { return Some("the scale's type is unknown".into()) };
    let last = x.shape.last();
    if gt.shape.len() != 1 || Some(&gt.shape[0]) != last {
        return Some(format!(
            "the scale has shape {} where RmsNorm takes one value per channel of the last axis, [{}]",
            ir::dim::shape_to_string(&gt.shape),
            last.map(ToString::to_string).unwrap_or_default()
        ));
    }
    if gt.dtype != x.dtype {
        return Some(format!("the scale is {} and the input {}", gt.dtype, x.dtype));
    }
    None
}

fn epsilon_attrs(eps: f32) -> Attrs {
    attrs(&[("epsilon", Attr::Float(eps))])
}

fn add_rms_norm(egraph: &mut EGraph, eps: f32, x: Id, g: Id) -> Id {
    egraph.add(ENode::op(Domain::Npuc, "RmsNorm", epsilon_attrs(eps), vec![x, g]))
}

/// Adds `SkipRmsNorm{eps}(inputs)` and returns its (y, s) projections.
fn add_skip_rms_norm(egraph: &mut EGraph, eps: f32, inputs: Vec<Id>) -> (Id, Id) {
    let tuple = egraph.add(ENode::op(Domain::Npuc, "SkipRmsNorm", epsilon_attrs(eps), inputs));
    let y = egraph.add(ENode { head: Head::Proj(0), children: vec![tuple] });
    let s = egraph.add(ENode { head: Head::Proj(1), children: vec![tuple] });
    (y, s)
}

// ---- folds ----

/// `?x` normalised by `√(?ms + ?eps)` with `?ms = mean(?x²)`: `RmsNorm{ε}(x, 1)` with a unit
/// scale of shape `[D]` (`[1]` when the last axis has a symbolic size).
struct UnitRmsNorm {
    x: Var,
    ms: Var,
    eps: Var,
}

impl UnitRmsNorm {
    fn new() -> Computed<Self> {
        Computed::new(UnitRmsNorm { x: var("?x"), ms: var("?ms"), eps: var("?eps") })
    }
}

impl Fold for UnitRmsNorm {
    fn fold(&self, egraph: &mut EGraph, eclass: Id, subst: &Subst, rule: Symbol) -> Folded {
        let x = subst[self.x];
        let ty = egraph[x].data.ty().cloned().ok_or_else(no_match)?;
        if !ty.dtype.is_float() || ty.shape.is_empty() {
            return Err(no_match());
        }
        match mean_square_over_last_axis(egraph, subst[self.ms], x) {
            None => return Err(no_match()),
            Some(over_last_axis) => over_last_axis?,
        }
        let eps = scalar_value(egraph, subst[self.eps]).ok_or_else(no_match)?;
        let d = ty.shape.last().and_then(|d| d.as_known()).and_then(|d| usize::try_from(d).ok()).unwrap_or(1);
        let unit = add_const(egraph, Tensor::from_f32(ty.dtype, vec![d], vec![1.0; d]));
        let norm = add_rms_norm(egraph, eps as f32, x, unit);
        Ok(union(egraph, eclass, norm, rule))
    }
}

/// `RmsNorm(?x, ?unit)` times `?g` (either side): `RmsNorm(x, g)` when g is a per-channel scale.
struct ScaledRmsNorm {
    x: Var,
    unit: Var,
    g: Var,
}

impl ScaledRmsNorm {
    fn new() -> Computed<Self> {
        Computed::new(ScaledRmsNorm { x: var("?x"), unit: var("?unit"), g: var("?g") })
    }
}

impl Fold for ScaledRmsNorm {
    fn fold(&self, egraph: &mut EGraph, eclass: Id, subst: &Subst, rule: Symbol) -> Folded {
        let (x, g) = (subst[self.x], subst[self.g]);
        let eps = scaled_rms_norm_epsilon(egraph, eclass, x, subst[self.unit], g).ok_or_else(no_match)?;
        let ty = egraph[x].data.ty().cloned().ok_or_else(no_match)?;
        if let Some(problem) = channel_scale_problem(egraph, g, &ty) {
            return Err(format!("RmsNorm(x) · scale not folded: {problem}").into());
        }
        let norm = add_rms_norm(egraph, eps, x, g);
        Ok(union(egraph, eclass, norm, rule))
    }
}

/// SimplifiedLayerNormalization (either domain) or RMSNormalization of `?x` by `?g`:
/// `RmsNorm{ε}(x, g)` when it normalises the last axis only and only its output 0 is used.
struct NormOp {
    x: Var,
    g: Var,
}

impl NormOp {
    fn new() -> Computed<Self> {
        Computed::new(NormOp { x: var("?x"), g: var("?g") })
    }
}

impl Fold for NormOp {
    fn fold(&self, egraph: &mut EGraph, eclass: Id, subst: &Subst, rule: Symbol) -> Folded {
        let (x, g) = (subst[self.x], subst[self.g]);
        let node = ["SimplifiedLayerNormalization", "RMSNormalization"]
            .iter()
            .find_map(|op| nodes_with_children(egraph, eclass, op, &[x, g]).next())
            .ok_or_else(no_match)?;
        let op = node.head.op().unwrap_or_default();
        let attrs = node.head.attrs().cloned().unwrap_or_default();
        let ty = egraph[x].data.ty().cloned().ok_or_else(no_match)?;
        let rank = ty.shape.len() as i64;
        let (Ok(axis), Ok(eps)) = (attrs.int_or("axis", -1), attrs.float_or("epsilon", 1e-5)) else {
            return Err(no_match());
        };
        if axis != -1 && axis != rank - 1 {
            return Err(format!(
                "{op} normalises axes {axis}.. of a rank-{rank} tensor; RmsNorm normalises the last axis only"
            )
            .into());
        }
        if egraph[g].data.ty().is_some_and(|gt| gt.dtype != ty.dtype) {
            return Err(format!("{op}'s scale and input differ in dtype").into());
        }
        let outputs = egraph[eclass].data.types.len();
        let y = if outputs > 1 {
            if output_used(egraph, eclass, 1) {
                return Err(format!("{op}'s inv_std_var output is used; RmsNorm has only y").into());
            }
            egraph.add(ENode { head: Head::Proj(0), children: vec![eclass] })
        } else {
            eclass
        };
        let norm = add_rms_norm(egraph, eps, x, g);
        Ok(union(egraph, y, norm, rule))
    }
}

/// com.microsoft SkipSimplifiedLayerNormalization(`?x`, `?skip`, `?g`[, `?bias`]):
/// `SkipRmsNorm{ε}` with its output 0 as proj0 and its output 3 (the sum) as proj1, when outputs
/// 1 and 2 are unused.
struct SkipNormOp {
    inputs: Vec<Var>,
}

impl SkipNormOp {
    fn new(bias: bool) -> Computed<Self> {
        let names: &[&str] = if bias { &["?x", "?skip", "?g", "?bias"] } else { &["?x", "?skip", "?g"] };
        Computed::new(SkipNormOp { inputs: names.iter().map(|n| var(n)).collect() })
    }
}

impl Fold for SkipNormOp {
    fn fold(&self, egraph: &mut EGraph, eclass: Id, subst: &Subst, rule: Symbol) -> Folded {
        let inputs: Vec<Id> = self.inputs.iter().map(|&v| subst[v]).collect();
        let node = nodes_with_children(egraph, eclass, "SkipSimplifiedLayerNormalization", &inputs)
            .next()
            .ok_or_else(no_match)?;
        let Some(Ok(eps)) = node.head.attrs().map(|a| a.float_or("epsilon", 1e-12)) else { return Err(no_match()) };
        let outputs = egraph[eclass].data.types.len();
        if let Some(i) = (1..outputs.min(3)).find(|&i| output_used(egraph, eclass, i)) {
            let what = if i == 1 { "mean" } else { "inv_std_var" };
            return Err(format!(
                "SkipSimplifiedLayerNormalization's {what} output ({i}) is used; SkipRmsNorm has only y and the sum"
            )
            .into());
        }
        let (y, s) = add_skip_rms_norm(egraph, eps, inputs);
        if outputs <= 1 {
            return Ok(union(egraph, eclass, y, rule));
        }
        let old_y = egraph.add(ENode { head: Head::Proj(0), children: vec![eclass] });
        let mut changed = union(egraph, old_y, y, rule);
        if outputs >= 4 {
            let old_s = egraph.add(ENode { head: Head::Proj(3), children: vec![eclass] });
            changed.extend(union(egraph, old_s, s, rule));
        }
        Ok(changed)
    }
}

/// `RmsNorm(Add(?a, ?b), ?g)`: `SkipRmsNorm(a, b, g)`, its proj0 in the norm's class and its
/// proj1 in the sum's.
struct ResidualRmsNorm {
    a: Var,
    b: Var,
    g: Var,
}

impl ResidualRmsNorm {
    fn new() -> Computed<Self> {
        Computed::new(ResidualRmsNorm { a: var("?a"), b: var("?b"), g: var("?g") })
    }
}

impl Fold for ResidualRmsNorm {
    fn fold(&self, egraph: &mut EGraph, eclass: Id, subst: &Subst, rule: Symbol) -> Folded {
        let (a, b, g) = (subst[self.a], subst[self.b], subst[self.g]);
        // A unit scale is the intermediate of a decomposed norm whose γ folds next; fusing the sum
        // into it as well would leave two SkipRmsNorms of equal cost competing for the sum.
        if is_unit(egraph, g) {
            return Err(no_match());
        }
        let sum = egraph.lookup(ENode::op(Domain::Onnx, "Add", Attrs::default(), vec![a, b])).ok_or_else(no_match)?;
        let eps = rms_norm_epsilon(egraph, eclass, sum, g).ok_or_else(no_match)?;
        let (Some(ta), Some(tb)) = (egraph[a].data.ty().cloned(), egraph[b].data.ty().cloned()) else {
            return Err(no_match());
        };
        if ta != tb {
            let (sa, sb) = (ir::dim::shape_to_string(&ta.shape), ir::dim::shape_to_string(&tb.shape));
            return Err(format!(
                "the residual addends differ ({} {sa} and {} {sb}); SkipRmsNorm adds equal types",
                ta.dtype, tb.dtype
            )
            .into());
        }
        if !matches!(ta.shape.len(), 2 | 3) {
            return Err(format!("the residual sum is {}-D; SkipRmsNorm takes 2-D or 3-D input", ta.shape.len()).into());
        }
        if let Some(problem) = channel_scale_problem(egraph, g, &ta) {
            return Err(format!("residual sum not fused into SkipRmsNorm: {problem}").into());
        }
        let (y, s) = add_skip_rms_norm(egraph, eps, vec![a, b, g]);
        let mut changed = union(egraph, eclass, y, rule);
        changed.extend(union(egraph, sum, s, rule));
        Ok(changed)
    }
}

//! Rule family `qdq`: an int8 matrix product written in QDQ form becomes one `npuc::QGemm`.
//!
//! Identity. For integer codes a, w with scales sₐ, s_w and zero points zₐ, z_w,
//! `MatMul(DequantizeLinear(a, sₐ, zₐ), DequantizeLinear(w, s_w, z_w))[m, n]` is
//! `sₐ·s_w[n]·Σₖ (a[m, k] − zₐ)(w[k, n] − z_w[n])`: both scales are constant along K, so they
//! leave the sum and the sum is exact in integers. That is QGemm's definition (see `ir::fused`),
//! asymmetric zero points included; a `QuantizeLinear(·, s_y, z_y)` of the product is QGemm's
//! requantising epilogue. The weight operand must be known at compile time.
//!
//! Exporter spellings recognised:
//! - onnxruntime `quantize_static` in QDQ format (per tensor and per channel) and AMD Quark: ai.onnx
//!   `QuantizeLinear → DequantizeLinear` on every activation, int8 weight initialisers read
//!   through a `DequantizeLinear` per tensor or per output column (`axis=1` or `axis=-1` on the
//!   [K, N] weight), zero points always written, and a `QuantizeLinear` after each product.
//! - the same in the com.microsoft domain (onnxruntime's contrib Q/DQ, which `quantize_static`
//!   writes with `UseQDQContribOps` and Quark for types ai.onnx lacks at the model's opset).
//! - `DequantizeLinear` without a zero point (symmetric exports), on the weight or on both sides:
//!   QGemm gets an explicit zero of the codes' type.
//! - the tied lm_head. onnxruntime's quantiser treats the lm_head's
//!   `Transpose(embed_tokens.weight)` as an activation: the logits MatMul reads
//!   `DequantizeLinear(QuantizeLinear(Transpose(E), s, z), s, z)`. Those codes depend on
//!   compile-time data only (see `cond::is_compile_time_expr`), so they are a constant weight: the
//!   QGemm's weight operand is the e-class of `QuantizeLinear(Transpose(E), s, z)` itself, with
//!   scale s and zero point z. Nothing is materialised in the e-graph; the [K, N] int8 codes are
//!   computed once by whichever later pass folds compile-time subgraphs (the reference evaluator
//!   computes them when it runs the graph). The embedding Gather keeps reading the float E. Quark
//!   0.13 instead writes the transposed codes as an initialiser of their own
//!   (`<E>_transposed_quantized`, per channel like the other weights).
//!
//! Declined, with the reason recorded: right operands computed at run time (activation ×
//! activation products, i.e. attention's QKᵀ and AV, which are the attention family's); weight
//! scales that vary along K (axis 0 of the [K, N] weight with more than one scale, or blocked
//! quantisation), which multiply inside the K sum and cannot move to the epilogue; per-channel
//! activation scales; codes that are not 8-bit; scales that are not f32; output QuantizeLinear
//! with a per-channel scale.

use crate::apply::{bound, no_match, Computed, Decline, Fold, Folded};
use crate::cond::var;
use crate::egraph_ops::{add_const, dtype, is_compile_time_expr, known_shape, node_attrs, union};
use crate::Rewrite;
use egg::{rewrite, Id, Subst, Symbol, Var};
use ir::egraph::{EGraph, ENode};
use ir::{Attrs, DType, Domain, Tensor};

/// The family's rules.
#[rustfmt::skip]
pub fn rules() -> Vec<Rewrite> {
    use Domain::{Microsoft, Onnx};
    vec![
        // MatMul(DQ(a, sₐ, zₐ), DQ(w, s_w, z_w)) = QGemm(a, sₐ, zₐ, w, s_w, z_w), w known at compile time
        rewrite!("qdq-matmul";
            "(MatMul (DequantizeLinear ?a ?sa ?za) (DequantizeLinear ?w ?sw ?zw))"
            => { FoldMatMul::new(Onnx, true, true) }),
        // the same with com.microsoft Q/DQ
        rewrite!("qdq-matmul-contrib";
            "(MatMul (com.microsoft::DequantizeLinear ?a ?sa ?za) (com.microsoft::DequantizeLinear ?w ?sw ?zw))"
            => { FoldMatMul::new(Microsoft, true, true) }),
        // MatMul(DQ(a, sₐ, zₐ), DQ(w, s_w)) = QGemm(a, sₐ, zₐ, w, s_w, 0)
        rewrite!("qdq-matmul-symmetric-weight";
            "(MatMul (DequantizeLinear ?a ?sa ?za) (DequantizeLinear ?w ?sw))"
            => { FoldMatMul::new(Onnx, true, false) }),
        // MatMul(DQ(a, sₐ), DQ(w, s_w)) = QGemm(a, sₐ, 0, w, s_w, 0)
        rewrite!("qdq-matmul-symmetric";
            "(MatMul (DequantizeLinear ?a ?sa) (DequantizeLinear ?w ?sw))"
            => { FoldMatMul::new(Onnx, false, false) }),
        // QuantizeLinear(QGemm(…), s_y, z_y) = QGemm(…, s_y, z_y)
        rewrite!("qdq-requantize";
            "(QuantizeLinear (npuc::QGemm ?a ?sa ?za ?w ?sw ?zw) ?sy ?zy)"
            => { Computed::guarded("(npuc::QGemm ?a ?sa ?za ?w ?sw ?zw ?sy ?zy)", requantizes_per_tensor("?sy", "?zy")) }),
        // the same with a com.microsoft QuantizeLinear
        rewrite!("qdq-requantize-contrib";
            "(com.microsoft::QuantizeLinear (npuc::QGemm ?a ?sa ?za ?w ?sw ?zw) ?sy ?zy)"
            => { Computed::guarded("(npuc::QGemm ?a ?sa ?za ?w ?sw ?zw ?sy ?zy)", requantizes_per_tensor("?sy", "?zy")) }),
        // QuantizeLinear(QGemm(…), s_y) = QGemm(…, s_y, 0 of the output type)
        rewrite!("qdq-requantize-default-zero";
            "(QuantizeLinear (npuc::QGemm ?a ?sa ?za ?w ?sw ?zw) ?sy)"
            => { Computed::new(RequantizeDefaultZero) }),
    ]
}

/// A zero constant of `dtype` and `shape`, added to the e-graph.
fn zeros(egraph: &mut EGraph, dtype: DType, shape: Vec<usize>) -> Id {
    let n = shape.iter().product();
    add_const(egraph, Tensor::from_i64(dtype, shape, vec![0; n]))
}

/// One matched QDQ product: the operands of both DequantizeLinear nodes and their attributes.
struct Group {
    a: Id,
    sa: Id,
    za: Option<Id>,
    w: Id,
    sw: Id,
    zw: Option<Id>,
    act: Attrs,
    weight: Attrs,
}

/// Why a DequantizeLinear → MatMul product does not fold into a QGemm: the decline reason its
/// rule records.
#[derive(Debug, thiserror::Error)]
enum NotQGemm {
    #[error(
        "the right operand's codes are computed at run time (an activation × activation product such as \
         attention's QKᵀ or AV): QGemm needs compile-time weight codes"
    )]
    RunTimeCodes,
    #[error("operand types are unknown")]
    UnknownTypes,
    #[error("{which} codes are {dtype}: QGemm takes 8-bit codes")]
    Codes { which: &'static str, dtype: DType },
    #[error("the {0} scale is not f32: QGemm scales in f32")]
    ScaleDtype(&'static str),
    #[error("a DequantizeLinear has a non-f32 output_dtype")]
    OutputDtype,
    #[error("operand shapes are not all known")]
    UnknownShapes,
    #[error("the activation scale has shape {0:?}: QGemm scales activations per tensor")]
    ActivationScale(Vec<usize>),
    #[error("weight of shape {0:?}: QGemm takes a [K, N] weight")]
    WeightRank(Vec<usize>),
    #[error(
        "blocked weight quantisation (block_size={0}): the scales vary along K, multiply inside the K sum and \
         cannot move into QGemm's per-column epilogue"
    )]
    Blocked(i64),
    #[error(
        "weight scale along K (axis 0 of the [{k}, {n}] weight, {scales} scales): it multiplies inside the K sum \
         and cannot move into QGemm's per-column epilogue"
    )]
    ScaleAlongK { k: usize, n: usize, scales: usize },
    #[error("weight scale of shape {shape:?} on axis {axis} does not fit the [{k}, {n}] weight")]
    ScaleShape { shape: Vec<usize>, axis: i64, k: usize, n: usize },
    #[error("a zero point differs from its scale's shape or its codes' type")]
    ZeroPoint,
}

impl From<NotQGemm> for Decline {
    fn from(e: NotQGemm) -> Decline {
        Decline(Some(e.to_string()))
    }
}

/// The zero points a QGemm of `g` takes (zeros where the DequantizeLinear omitted them), or why the
/// product cannot be one.
fn qgemm_zero_points(egraph: &mut EGraph, g: &Group) -> Result<(Id, Id), NotQGemm> {
    if !is_compile_time_expr(egraph, g.w) {
        return Err(NotQGemm::RunTimeCodes);
    }
    let (Some(a_type), Some(w_type)) = (dtype(egraph, g.a), dtype(egraph, g.w)) else {
        return Err(NotQGemm::UnknownTypes);
    };
    for (dtype, which) in [(a_type, "activation"), (w_type, "weight")] {
        if !matches!(dtype, DType::I8 | DType::U8) {
            return Err(NotQGemm::Codes { which, dtype });
        }
    }
    for (s, which) in [(g.sa, "activation"), (g.sw, "weight")] {
        if dtype(egraph, s) != Some(DType::F32) {
            return Err(NotQGemm::ScaleDtype(which));
        }
    }
    for attrs in [&g.act, &g.weight] {
        if !matches!(attrs.int("output_dtype"), Ok(None | Some(0 | 1))) {
            return Err(NotQGemm::OutputDtype);
        }
    }
    let (Some(sa_shape), Some(w_shape), Some(sw_shape)) =
        (known_shape(egraph, g.sa), known_shape(egraph, g.w), known_shape(egraph, g.sw))
    else {
        return Err(NotQGemm::UnknownShapes);
    };
    if sa_shape.iter().product::<usize>() != 1 {
        return Err(NotQGemm::ActivationScale(sa_shape));
    }
    let [k, n] = w_shape[..] else {
        return Err(NotQGemm::WeightRank(w_shape));
    };
    let block = g.weight.int_or("block_size", 0).unwrap_or(0);
    if block > 0 {
        return Err(NotQGemm::Blocked(block));
    }
    let scales: usize = sw_shape.iter().product();
    if scales != 1 {
        let axis = g.weight.int_or("axis", 1).unwrap_or(1);
        let axis = if axis < 0 { axis + 2 } else { axis };
        if axis == 0 {
            return Err(NotQGemm::ScaleAlongK { k, n, scales });
        }
        if axis != 1 || sw_shape != [n] {
            return Err(NotQGemm::ScaleShape { shape: sw_shape, axis, k, n });
        }
    }
    for (z, s, codes) in [(g.za, g.sa, a_type), (g.zw, g.sw, w_type)] {
        if let Some(z) = z {
            if known_shape(egraph, z) != known_shape(egraph, s) || dtype(egraph, z) != Some(codes) {
                return Err(NotQGemm::ZeroPoint);
            }
        }
    }
    let za = g.za.unwrap_or_else(|| zeros(egraph, a_type, sa_shape));
    let zw = g.zw.unwrap_or_else(|| zeros(egraph, w_type, sw_shape));
    Ok((za, zw))
}

/// Folds `MatMul(DequantizeLinear(a, …), DequantizeLinear(w, …))` into a QGemm, reading both
/// DequantizeLinear nodes' attributes; zero points a pattern omits become explicit zeros.
struct FoldMatMul {
    domain: Domain,
    vars: [Var; 4],
    za: Option<Var>,
    zw: Option<Var>,
}

impl FoldMatMul {
    fn new(domain: Domain, activation_zero_point: bool, weight_zero_point: bool) -> Computed<FoldMatMul> {
        Computed::new(FoldMatMul {
            domain,
            vars: [var("?a"), var("?sa"), var("?w"), var("?sw")],
            za: activation_zero_point.then(|| var("?za")),
            zw: weight_zero_point.then(|| var("?zw")),
        })
    }

    /// The matched group, with the attributes of the two DequantizeLinear nodes under a MatMul of
    /// `class`.
    fn group(&self, egraph: &EGraph, class: Id, subst: &Subst) -> Option<Group> {
        let [a, sa, w, sw] = self.vars.map(|v| subst[v]);
        let (za, zw) = (self.za.map(|v| subst[v]), self.zw.map(|v| subst[v]));
        let act_children: Vec<Id> = [a, sa].into_iter().chain(za).collect();
        let weight_children: Vec<Id> = [w, sw].into_iter().chain(zw).collect();
        egraph[class].nodes.iter().filter(|n| n.head.op() == Some("MatMul")).find_map(|n| {
            let act = node_attrs(egraph, n.children[0], self.domain, "DequantizeLinear", &act_children)?;
            let weight = node_attrs(egraph, n.children[1], self.domain, "DequantizeLinear", &weight_children)?;
            Some(Group { a, sa, za, w, sw, zw, act, weight })
        })
    }
}

impl Fold for FoldMatMul {
    fn fold(&self, egraph: &mut EGraph, eclass: Id, subst: &Subst, rule: Symbol) -> Folded {
        let g = self.group(egraph, eclass, subst).ok_or_else(no_match)?;
        let (za, zw) = qgemm_zero_points(egraph, &g)?;
        let q = egraph.add(ENode::op(Domain::Npuc, "QGemm", Attrs::default(), vec![g.a, g.sa, za, g.w, g.sw, zw]));
        Ok(union(egraph, eclass, q, rule))
    }
}

/// Why an output QuantizeLinear with scale `sy` and zero point `zy` (if any) cannot be QGemm's
/// epilogue.
fn epilogue_refusal(egraph: &EGraph, sy: Id, zy: Option<Id>) -> Option<String> {
    let scale = known_shape(egraph, sy);
    if dtype(egraph, sy) != Some(DType::F32) {
        return Some("the output scale is not f32".into());
    }
    if scale.as_ref().map(|s| s.iter().product::<usize>()) != Some(1) {
        return Some(format!("the output scale has shape {scale:?}: QGemm requantises per tensor"));
    }
    if let Some(z) = zy {
        if known_shape(egraph, z).map(|s| s.iter().product::<usize>()) != Some(1) {
            return Some("the output zero point is not a single value".into());
        }
    }
    None
}

/// `?sy` and `?zy` are a per-tensor output scale and zero point; why not otherwise.
fn requantizes_per_tensor(sy: &str, zy: &str) -> impl Fn(&EGraph, Id, &Subst) -> Result<(), Decline> {
    let (sy, zy) = (var(sy), var(zy));
    move |egraph, _, subst| epilogue_refusal(egraph, subst[sy], Some(subst[zy])).map_or(Ok(()), |r| Err(r.into()))
}

/// `QuantizeLinear(QGemm(…), s_y)` without a zero point: the epilogue gets a zero of the
/// QuantizeLinear's output type (uint8 unless `output_dtype` says otherwise).
struct RequantizeDefaultZero;

impl Fold for RequantizeDefaultZero {
    fn fold(&self, egraph: &mut EGraph, eclass: Id, subst: &Subst, rule: Symbol) -> Folded {
        let [a, sa, za, w, sw, zw, sy] = bound(subst, ["?a", "?sa", "?za", "?w", "?sw", "?zw", "?sy"]);
        if let Some(reason) = epilogue_refusal(egraph, sy, None) {
            return Err(reason.into());
        }
        let out = dtype(egraph, eclass)
            .filter(|d| matches!(d, DType::I8 | DType::U8))
            .ok_or("the output QuantizeLinear does not produce 8-bit codes")?;
        let zy = zeros(egraph, out, known_shape(egraph, sy).unwrap_or_default());
        let q = egraph.add(ENode::op(Domain::Npuc, "QGemm", Attrs::default(), vec![a, sa, za, w, sw, zw, sy, zy]));
        Ok(union(egraph, eclass, q, rule))
    }
}

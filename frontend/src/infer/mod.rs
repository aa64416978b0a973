//! Dtype and symbolic shape inference, with constant and shape-arithmetic folding.
//!
//! Every value gets an [`Info`]: dtype, symbolic shape, and what is known of its contents — a
//! concrete small tensor, or a vector of symbolic dims (what `Shape(x)` and the arithmetic on it
//! produce). Nodes whose inputs are all concrete are evaluated with the reference evaluator;
//! shape arithmetic on symbolic dims is folded exactly on [`Dim`] polynomials. Provable mismatches
//! (a concrete 256 against a concrete 384) are errors naming the node; agreements the frontend has
//! to assume (`total_sequence_length` = `past_sequence_length + sequence_length`) are recorded.

mod dims;
mod elementwise;
mod matmul;
mod node;
mod normalization;
mod reduce;
mod value;

pub use node::NodeCtx;
pub use value::{Ctx, Info, Known};

use crate::error::ErrorKind;
use ir::op::OpRef;
use ir::{DType, Dim, Tensor};
use node::{attr_dtype, axes_of, broadcast, known_ints, norm_axis, opt, req, same_dtype, In};
use value::renamed_symbol;

/// Folded results with more elements than this stay nodes (a constant causal mask of 2048² would
/// otherwise land in the graph by value).
pub const FOLD_LIMIT_ELEMENTS: usize = 1 << 16;

/// Infers the outputs of one node.
pub fn infer_node(n: &NodeCtx, ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    // Shape arithmetic on symbolic dims folds before general inference.
    if let Some(folded) = dims::fold(n, ctx, inputs)? {
        return Ok(vec![folded]);
    }
    let mut outs = infer_shapes(n, ctx, inputs)?;
    for o in outs.iter_mut() {
        o.shape = o.shape.iter().map(|d| ctx.normalize(d)).collect();
    }
    let all_concrete = inputs.iter().flatten().all(|i| i.is_concrete());
    let small = outs.iter().all(|o| {
        o.shape
            .iter()
            .try_fold(1usize, |acc, d| d.as_known().and_then(|k| acc.checked_mul(k as usize)))
            .is_some_and(|numel| numel <= FOLD_LIMIT_ELEMENTS)
    });
    if all_concrete && small && n.op != "Constant" {
        let tensors: Vec<Option<&Tensor>> = inputs.iter().map(|i| i.and_then(|i| i.as_const())).collect();
        let op = OpRef { node: n.name, domain: n.domain, op: n.op, opset: n.opset, attrs: n.attrs };
        let results = ir::eval::eval_op(&op, &tensors, n.num_outputs).map_err(|e| ErrorKind::Fold {
            node: n.name.into(),
            op: n.op.into(),
            detail: e.msg,
        })?;
        for (i, (t, o)) in results.iter().zip(outs.iter()).enumerate() {
            let inferred: Vec<Option<i64>> = o.shape.iter().map(|d| d.as_known()).collect();
            let got: Vec<Option<i64>> = t.shape.iter().map(|&d| Some(d as i64)).collect();
            if inferred != got || t.dtype != o.dtype {
                return Err(ErrorKind::Fold {
                    node: n.name.into(),
                    op: n.op.into(),
                    detail: format!(
                        "output {i} evaluated to {}{:?} but inference said {}{}",
                        t.dtype,
                        t.shape,
                        o.dtype,
                        ir::dim::shape_to_string(&o.shape)
                    ),
                });
            }
        }
        return Ok(results.into_iter().map(Info::constant).collect());
    }
    Ok(outs)
}

/// Output shape of a Reshape whose target may hold symbolic dims, 0 (copy) and -1 (infer).
pub fn reshape_shape(
    n: &NodeCtx,
    ctx: &mut Ctx,
    input: &[Dim],
    target: &[Dim],
    allowzero: bool,
) -> Result<Vec<Dim>, ErrorKind> {
    let mut out = Vec::with_capacity(target.len());
    let mut infer_at = None;
    for (i, t) in target.iter().enumerate() {
        match t.as_known() {
            Some(0) if !allowzero => out.push(
                input
                    .get(i)
                    .cloned()
                    .ok_or_else(|| n.shape_err(format!("0 at position {i} has no input dim to copy")))?,
            ),
            Some(-1) => {
                if infer_at.replace(i).is_some() {
                    return Err(n.shape_err("more than one -1 in the target shape"));
                }
                out.push(Dim::known(1));
            }
            Some(k) if k < -1 => return Err(n.shape_err(format!("negative dimension {k} in the target shape"))),
            _ => out.push(t.clone()),
        }
    }
    let numel = |s: &[Dim]| s.iter().try_fold(Dim::known(1), |acc, d| acc.mul(&ctx.normalize(d)));
    let total = numel(input).ok_or_else(|| n.shape_err("element count overflows"))?;
    let rest = numel(&out).ok_or_else(|| n.shape_err("element count overflows"))?;
    if let Some(i) = infer_at {
        out[i] = total.div_exact(&rest).ok_or_else(|| {
            n.shape_err(format!(
                "cannot infer -1: {} elements do not divide into {}",
                total,
                ir::dim::shape_to_string(target)
            ))
        })?;
    } else if total != rest {
        if total.is_known() && rest.is_known() {
            return Err(n.shape_err(format!(
                "cannot reshape {} ({total} elements) to {} ({rest} elements)",
                ir::dim::shape_to_string(input),
                ir::dim::shape_to_string(target)
            )));
        }
        ctx.unify(&total, &rest);
    }
    Ok(out)
}

fn infer_shapes(n: &NodeCtx, ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    let x0 = || req(n, inputs, 0);
    let one = |dtype: DType, shape: Vec<Dim>| Ok(vec![Info::new(dtype, shape)]);
    match n.op {
        "Add" | "Sub" | "Mul" | "Div" | "Mod" | "Max" | "Min" | "Sum" | "Mean" => {
            elementwise::arithmetic(n, ctx, inputs)
        }
        "Pow" => elementwise::pow(n, ctx, inputs),
        "Equal" | "Less" | "LessOrEqual" | "Greater" | "GreaterOrEqual" | "And" | "Or" | "Xor" => {
            elementwise::compare(n, ctx, inputs)
        }
        "Where" => elementwise::where_(n, ctx, inputs),
        "Not" | "IsNaN" | "IsInf" => elementwise::predicate(n, ctx, inputs),
        "Neg" | "Abs" | "Sqrt" | "Reciprocal" | "Exp" | "Log" | "Sin" | "Cos" | "Tanh" | "Erf" | "Sigmoid" | "Relu"
        | "Floor" | "Ceil" | "Round" | "Identity" | "Softmax" | "CumSum" | "Gelu" | "Softplus" | "LogSoftmax"
        | "Hardmax" => elementwise::unary(n, ctx, inputs),
        "Clip" => one(x0()?.dtype, x0()?.shape.clone()),
        "Cast" => elementwise::cast(n, ctx, inputs),
        "CastLike" => elementwise::cast_like(n, ctx, inputs),
        "MatMul" => matmul::matmul(n, ctx, inputs),
        "MatMulInteger" => matmul::matmul_integer(n, ctx, inputs),
        "Gemm" => matmul::gemm(n, ctx, inputs),
        "ReduceMean" | "ReduceSum" | "ReduceMax" | "ReduceMin" | "ReduceProd" | "ReduceL1" | "ReduceL2"
        | "ReduceSumSquare" | "ReduceLogSum" | "ReduceLogSumExp" => reduce::reduce(n, ctx, inputs),
        "ArgMax" | "ArgMin" => reduce::arg_reduce(n, ctx, inputs),
        "LayerNormalization" | "SimplifiedLayerNormalization" | "RMSNormalization" => {
            normalization::layer_norm(n, ctx, inputs)
        }
        "SkipSimplifiedLayerNormalization" => normalization::skip_simplified(n, ctx, inputs),
        "Shape" | "Size" => unreachable!("folded in dims::fold"),
        "Reshape" => {
            let x = x0()?;
            let s = req(n, inputs, 1)?;
            let allowzero = n.attr_int("allowzero", 0)? != 0;
            match s.as_dims() {
                Some((target, _)) => one(x.dtype, reshape_shape(n, ctx, &x.shape, &target, allowzero)?),
                None => {
                    let rank = s
                        .shape
                        .first()
                        .and_then(|d| d.as_known())
                        .ok_or_else(|| n.shape_err("target shape of unknown length"))?;
                    let shape = (0..rank).map(|_| ctx.fresh("reshape")).collect();
                    one(x.dtype, shape)
                }
            }
        }
        "Flatten" => {
            let x = x0()?;
            let axis = n.attr_int("axis", 1)?;
            let r = x.shape.len() as i64;
            let a = if axis < 0 { axis + r } else { axis };
            if a < 0 || a > r {
                return Err(n.shape_err(format!("axis {axis} out of range for rank {r}")));
            }
            let prod = |s: &[Dim]| s.iter().try_fold(Dim::known(1), |acc, d| acc.mul(d));
            let (l, rr) = (prod(&x.shape[..a as usize]), prod(&x.shape[a as usize..]));
            one(x.dtype, vec![l.ok_or_else(|| n.shape_err("overflow"))?, rr.ok_or_else(|| n.shape_err("overflow"))?])
        }
        "Transpose" => {
            let x = x0()?;
            let r = x.shape.len();
            let perm: Vec<i64> = n.attr_ints("perm")?.unwrap_or_else(|| (0..r as i64).rev().collect());
            if perm.len() != r {
                return Err(n.shape_err(format!("perm {perm:?} does not match rank {r}")));
            }
            let mut seen = vec![false; r];
            let mut out = Vec::new();
            for &p in &perm {
                let p = norm_axis(n, p, r)?;
                if std::mem::replace(&mut seen[p], true) {
                    return Err(n.shape_err(format!("perm {perm:?} repeats an axis")));
                }
                out.push(x.shape[p].clone());
            }
            one(x.dtype, out)
        }
        "Unsqueeze" => {
            let x = x0()?;
            let axes = axes_of(n, inputs, 1)?.ok_or_else(|| n.bad("Unsqueeze needs axes"))?;
            let r = x.shape.len() + axes.len();
            let mut axes: Vec<usize> = axes.iter().map(|&a| norm_axis(n, a, r)).collect::<Result<_, _>>()?;
            axes.sort();
            let mut out = Vec::with_capacity(r);
            let mut it = x.shape.iter();
            for i in 0..r {
                if axes.contains(&i) {
                    out.push(Dim::known(1));
                } else {
                    out.push(it.next().ok_or_else(|| n.shape_err("repeated axes"))?.clone());
                }
            }
            one(x.dtype, out)
        }
        "Squeeze" => {
            let x = x0()?;
            let r = x.shape.len();
            let out = match axes_of(n, inputs, 1)? {
                Some(axes) if !axes.is_empty() => {
                    let axes: Vec<usize> = axes.iter().map(|&a| norm_axis(n, a, r)).collect::<Result<_, _>>()?;
                    for &a in &axes {
                        if let Some(k) = x.shape[a].as_known().filter(|&k| k != 1) {
                            return Err(n.shape_err(format!("cannot squeeze axis {a} of size {k}")));
                        }
                    }
                    x.shape.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, d)| d.clone()).collect()
                }
                _ => x.shape.iter().filter(|d| d.as_known() != Some(1)).cloned().collect(),
            };
            one(x.dtype, out)
        }
        "Concat" => {
            let ins: Vec<&Info> = inputs.iter().flatten().copied().collect();
            let dt = same_dtype(n, &ins)?;
            let r = ins[0].shape.len();
            let axis = norm_axis(n, n.attr_int("axis", 0)?, r)?;
            let mut out = ins[0].shape.clone();
            for i in &ins[1..] {
                if i.shape.len() != r {
                    return Err(n.shape_err(format!("inputs have ranks {r} and {}", i.shape.len())));
                }
                for (d, (a, b)) in out.iter_mut().zip(&i.shape).enumerate() {
                    if d == axis {
                        *a = a.add(b).ok_or_else(|| n.shape_err("overflow"))?;
                    } else if a != b {
                        if a.is_known() && b.is_known() {
                            return Err(n.shape_err(format!("inputs differ on axis {d}: {a} vs {b}")));
                        }
                        *a = ctx.unify(a, b);
                    }
                }
            }
            one(dt, out)
        }
        "Split" => {
            let x = x0()?;
            let r = x.shape.len();
            let axis = norm_axis(n, n.attr_int("axis", 0)?, r)?;
            let parts = n.num_outputs;
            let sizes: Vec<Dim> = match opt(inputs, 1) {
                Some(s) => known_ints(n, s, "split")?.into_iter().map(Dim::known).collect(),
                None => match n.attr_ints("split")? {
                    Some(s) => s.into_iter().map(Dim::known).collect(),
                    None => {
                        let d = &x.shape[axis];
                        match d.as_known() {
                            Some(k) => {
                                let chunk = (k as usize).div_ceil(parts) as i64;
                                (0..parts).map(|i| Dim::known(chunk.min(k - chunk * i as i64).max(0))).collect()
                            }
                            None => {
                                let q = d
                                    .div_exact(&Dim::known(parts as i64))
                                    .ok_or_else(|| n.shape_err("cannot split a symbolic dim evenly"))?;
                                vec![q; parts]
                            }
                        }
                    }
                },
            };
            if sizes.len() != parts {
                return Err(n.shape_err(format!("{} split sizes for {parts} outputs", sizes.len())));
            }
            Ok(sizes
                .into_iter()
                .map(|s| {
                    let mut shape = x.shape.clone();
                    shape[axis] = s;
                    Info::new(x.dtype, shape)
                })
                .collect())
        }
        "Slice" => {
            let x = x0()?;
            let r = x.shape.len();
            let bound_count = req(n, inputs, 1)?.as_dims().map_or(0, |(d, _)| d.len());
            let axes: Vec<usize> = match opt(inputs, 3) {
                Some(a) => known_ints(n, a, "axes")?.iter().map(|&a| norm_axis(n, a, r)).collect::<Result<_, _>>()?,
                None => (0..bound_count).collect(),
            };
            let starts = slice_bounds(n, ctx, req(n, inputs, 1)?, "starts", &x.shape, &axes)?;
            let ends = slice_bounds(n, ctx, req(n, inputs, 2)?, "ends", &x.shape, &axes)?;
            let steps = match opt(inputs, 4) {
                Some(s) => known_ints(n, s, "steps")?,
                None => vec![1; starts.len()],
            };
            if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
                return Err(n.bad("starts, ends, axes and steps differ in length"));
            }
            let mut out = x.shape.clone();
            for i in 0..starts.len() {
                let (s, e, st) = (starts[i], ends[i], steps[i]);
                if st == 0 {
                    return Err(n.bad("slice step 0"));
                }
                let d = &x.shape[axes[i]];
                out[axes[i]] = slice_len(ctx, d, s, e, st).unwrap_or_else(|| ctx.fresh("slice"));
            }
            one(x.dtype, out)
        }
        "Gather" => {
            let (x, idx) = (x0()?, req(n, inputs, 1)?);
            if !idx.dtype.is_int() {
                return Err(n.dtype_err(format!("indices are {}", idx.dtype)));
            }
            let r = x.shape.len();
            let axis = norm_axis(n, n.attr_int("axis", 0)?, r)?;
            let mut out = x.shape[..axis].to_vec();
            out.extend(idx.shape.iter().cloned());
            out.extend(x.shape[axis + 1..].iter().cloned());
            one(x.dtype, out)
        }
        "GatherElements" => one(x0()?.dtype, req(n, inputs, 1)?.shape.clone()),
        "GatherND" => {
            let (x, idx) = (x0()?, req(n, inputs, 1)?);
            let b = n.attr_int("batch_dims", 0)? as usize;
            let last = idx
                .shape
                .last()
                .and_then(|d| d.as_known())
                .ok_or_else(|| n.shape_err("GatherND needs a known index depth"))? as usize;
            let mut out = idx.shape[..idx.shape.len() - 1].to_vec();
            out.extend(x.shape.get(b + last..).unwrap_or(&[]).iter().cloned());
            one(x.dtype, out)
        }
        "ScatterND" | "ScatterElements" => one(x0()?.dtype, x0()?.shape.clone()),
        "Pad" => infer_pad(n, ctx, inputs),
        "TopK" => reduce::top_k(n, ctx, inputs),
        "NegativeLogLikelihoodLoss" | "SoftmaxCrossEntropyLoss" => reduce::loss(n, ctx, inputs),
        "Einsum" => matmul::einsum(n, ctx, inputs),
        "Expand" => {
            let x = x0()?;
            let s = req(n, inputs, 1)?;
            let (target, _) = s.as_dims().unwrap_or_else(|| {
                let len = s.shape.first().and_then(|d| d.as_known()).unwrap_or(0);
                ((0..len).map(|_| ctx.fresh("expand")).collect(), false)
            });
            one(x.dtype, broadcast(n, ctx, &[&x.shape, &target])?)
        }
        "Tile" => {
            let x = x0()?;
            let reps = req(n, inputs, 1)?;
            let out = match reps.as_dims() {
                Some((r, _)) if r.len() == x.shape.len() => {
                    x.shape.iter().zip(&r).map(|(a, b)| a.mul(b).unwrap_or_else(|| ctx.fresh("tile"))).collect()
                }
                _ => x.shape.iter().map(|_| ctx.fresh("tile")).collect(),
            };
            one(x.dtype, out)
        }
        "Range" => {
            let (s, l, d) = (x0()?, req(n, inputs, 1)?, req(n, inputs, 2)?);
            let dt = same_dtype(n, &[s, l, d])?;
            let len = match (s.as_dims(), l.as_dims(), d.as_dims()) {
                (Some((s, _)), Some((l, _)), Some((d, _))) if s.len() == 1 && l.len() == 1 && d.len() == 1 => {
                    match d[0].as_known() {
                        Some(1) => l[0].sub(&s[0]),
                        Some(k) if k != 0 => match (s[0].as_known(), l[0].as_known()) {
                            (Some(a), Some(b)) => Some(Dim::known(((b - a) as f64 / k as f64).ceil().max(0.0) as i64)),
                            _ => None,
                        },
                        _ => None,
                    }
                }
                _ => None,
            };
            let len = match (len, s.as_const(), l.as_const(), d.as_const()) {
                (Some(len), _, _, _) => len,
                (None, Some(a), Some(b), Some(c)) if dt.is_float() => {
                    let (a, b, c) = (a.to_f64_vec()[0], b.to_f64_vec()[0], c.to_f64_vec()[0]);
                    Dim::known(((b - a) / c).ceil().max(0.0) as i64)
                }
                _ => ctx.fresh("range"),
            };
            one(dt, vec![len])
        }
        "ConstantOfShape" => {
            let s = x0()?;
            let (dims, _) = s.as_dims().unwrap_or_else(|| {
                let len = s.shape.first().and_then(|d| d.as_known()).unwrap_or(0);
                ((0..len).map(|_| ctx.fresh("cos")).collect(), false)
            });
            let dt = match n.attrs.tensor("value").map_err(|e| n.bad(e.to_string()))? {
                Some(t) => t.dtype,
                None => DType::F32,
            };
            one(dt, dims)
        }
        "Constant" => unreachable!("Constant nodes are read by the importer"),
        "Trilu" => one(x0()?.dtype, x0()?.shape.clone()),
        "QuantizeLinear" => {
            let x = x0()?;
            let dt = match (opt(inputs, 2), attr_dtype(n, "output_dtype")?) {
                (Some(zp), _) => zp.dtype,
                (None, Some(d)) => d,
                (None, None) => DType::U8,
            };
            one(dt, x.shape.clone())
        }
        "DequantizeLinear" => {
            let (x, scale) = (x0()?, req(n, inputs, 1)?);
            if let Some(zp) = opt(inputs, 2) {
                if zp.dtype != x.dtype {
                    return Err(n.dtype_err(format!("input is {} but zero point is {}", x.dtype, zp.dtype)));
                }
            }
            one(scale.dtype, x.shape.clone())
        }
        "DynamicQuantizeLinear" => {
            let x = x0()?;
            Ok(vec![Info::new(DType::U8, x.shape.clone()), Info::new(DType::F32, vec![]), Info::new(DType::U8, vec![])])
        }
        "RotaryEmbedding" => one(x0()?.dtype, x0()?.shape.clone()),
        "Attention" => infer_attention(n, ctx, inputs),
        "MatMulNBits" => {
            let a = x0()?;
            let k = n.attr_int("K", -1)?;
            let nn = n.attr_int("N", -1)?;
            if k <= 0 || nn <= 0 {
                return Err(n.bad("MatMulNBits needs positive K and N attributes"));
            }
            let last = a.shape.last().ok_or_else(|| n.shape_err("input A is a scalar"))?;
            if last.as_known().is_some_and(|d| d != k) {
                return Err(n.shape_err(format!("A's last dim is {last} but K = {k}")));
            }
            let mut out = a.shape.clone();
            *out.last_mut().unwrap() = Dim::known(nn);
            one(a.dtype, out)
        }
        "GatherBlockQuantized" => {
            let (data, idx, scales) = (x0()?, req(n, inputs, 1)?, req(n, inputs, 2)?);
            let axis = norm_axis(n, n.attr_int("gather_axis", 0)?, data.shape.len())?;
            let mut logical = data.shape.clone();
            if data.dtype == DType::U8 {
                let bits = n.attr_int("bits", 4)?;
                let per_byte = 8 / bits.clamp(1, 8);
                let last = logical.len() - 1;
                logical[last] = logical[last].mul(&Dim::known(per_byte)).ok_or_else(|| n.shape_err("overflow"))?;
            }
            let mut out = logical[..axis].to_vec();
            out.extend(idx.shape.iter().cloned());
            out.extend(logical[axis + 1..].iter().cloned());
            one(scales.dtype, out)
        }
        "GroupQueryAttention" => infer_gqa(n, ctx, inputs),
        other => Err(n.bad(format!("no shape inference for {other}"))),
    }
}

/// Slice `starts`/`ends` as numbers. A bound may be a symbolic size when it equals the size of
/// the dim it slices (transformers slices the causal mask to the key length,
/// `mask[..., :key.shape[-2]]`), also when the two differ only by one symbol's name (torch.export
/// names each input's sizes apart; the equality is then assumed and recorded): that is "to the
/// end", `i64::MAX`. Any other symbolic bound is an error naming it.
fn slice_bounds(
    n: &NodeCtx,
    ctx: &mut Ctx,
    info: &Info,
    what: &str,
    shape: &[Dim],
    axes: &[usize],
) -> Result<Vec<i64>, ErrorKind> {
    let (dims, _) = info.as_dims().ok_or_else(|| n.bad(format!("{what} must be a constant integer tensor")))?;
    for (i, b) in dims.iter().enumerate() {
        let Some(dim) = axes.get(i).and_then(|&a| shape.get(a)) else { continue };
        let (b, dim) = (ctx.normalize(b), ctx.normalize(dim));
        if !b.is_known() && renamed_symbol(&b, &dim).is_some() {
            ctx.unify(&b, &dim);
        }
    }
    constant_slice_bounds(ctx, &dims, shape, axes).map_err(|(bound, dim)| {
        n.bad(format!("{what} must be constant or the size of the dim it slices; it is {bound}, the dim is {dim}"))
    })
}

/// [`slice_bounds`] on dims: `Err((bound, dim))` names the first bound that is neither.
pub fn constant_slice_bounds(ctx: &Ctx, bounds: &[Dim], shape: &[Dim], axes: &[usize]) -> Result<Vec<i64>, (Dim, Dim)> {
    bounds
        .iter()
        .enumerate()
        .map(|(i, b)| {
            if let Some(k) = b.as_known() {
                return Ok(k);
            }
            let dim = axes.get(i).and_then(|&a| shape.get(a)).map(|d| ctx.normalize(d)).unwrap_or(Dim::known(0));
            if ctx.normalize(b) == dim {
                Ok(i64::MAX)
            } else {
                Err((ctx.normalize(b), dim))
            }
        })
        .collect()
}

/// Length of `d[s:e:st]`, for symbolic `d` only in the common cases (the whole dim, a prefix, a
/// suffix), assuming the dim is long enough for the constant bounds.
fn slice_len(ctx: &Ctx, d: &Dim, s: i64, e: i64, st: i64) -> Option<Dim> {
    let d = ctx.normalize(d);
    if let Some(len) = d.as_known() {
        let clamp = |v: i64, lo: i64, hi: i64| v.clamp(lo, hi);
        let (s, e) = if st > 0 {
            let s = if s < 0 { s + len } else { s };
            let e = if e < 0 { e + len } else { e };
            (clamp(s, 0, len), clamp(e, 0, len))
        } else {
            let s = if s < 0 { s + len } else { s };
            let e = if e < 0 { e + len } else { e };
            (clamp(s, -1, len - 1), clamp(e, -1, len - 1))
        };
        let n = if st > 0 { (e - s + st - 1) / st } else { (s - e + (-st) - 1) / (-st) };
        return Some(Dim::known(n.max(0)));
    }
    if st != 1 {
        return None;
    }
    const OPEN: i64 = 1 << 31;
    let start = if s >= 0 { Dim::known(s) } else { d.add(&Dim::known(s))? };
    let end = if e >= OPEN {
        d.clone()
    } else if e >= 0 {
        Dim::known(e)
    } else {
        d.add(&Dim::known(e))?
    };
    end.sub(&start)
}

/// Pad: each padded dim grows by its begin and end pads (attributes before opset 11, an input
/// from 11, on the `axes` input's dims from 18). Pads given at run time make the padded dims fresh
/// sizes, as a Reshape target given at run time does.
fn infer_pad(n: &NodeCtx, ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    let x = req(n, inputs, 0)?;
    let rank = x.shape.len();
    let attribute = |name: &str| -> Result<Option<Vec<Dim>>, ErrorKind> {
        let pads = n.attr_ints(name)?.ok_or_else(|| n.bad(format!("attribute `{name}` is required")))?;
        Ok(Some(pads.into_iter().map(Dim::known).collect()))
    };
    let pads = match n.opset {
        ..=1 => attribute("paddings")?,
        2..=10 => attribute("pads")?,
        _ => req(n, inputs, 1)?.as_dims().map(|(d, _)| d),
    };
    let axes: Vec<usize> = match opt(inputs, 3).filter(|_| n.opset >= 18) {
        Some(a) => known_ints(n, a, "axes")?.iter().map(|&a| norm_axis(n, a, rank)).collect::<Result<_, _>>()?,
        None => (0..rank).collect(),
    };
    let mut out = x.shape.clone();
    let Some(pads) = pads else {
        axes.iter().for_each(|&a| out[a] = ctx.fresh("pad"));
        return Ok(vec![Info::new(x.dtype, out)]);
    };
    if pads.len() != 2 * axes.len() {
        return Err(n.bad(format!("{} pads for {} axes", pads.len(), axes.len())));
    }
    for (i, &a) in axes.iter().enumerate() {
        let d = x.shape[a].add(&pads[i]).and_then(|d| d.add(&pads[axes.len() + i]));
        out[a] = d.filter(|d| d.as_known().is_none_or(|k| k >= 0)).ok_or_else(|| {
            n.shape_err(format!("pads {} and {} do not fit axis {a} of {}", pads[i], pads[axes.len() + i], x.shape[a]))
        })?;
    }
    Ok(vec![Info::new(x.dtype, out)])
}

fn infer_attention(n: &NodeCtx, ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    let (q, k, v) = (req(n, inputs, 0)?, req(n, inputs, 1)?, req(n, inputs, 2)?);
    let past_k = opt(inputs, 4);
    let mut outs = vec![];
    let (kv_heads, head_k, head_v, kv_len, batch) = if k.shape.len() == 4 {
        (k.shape[1].clone(), k.shape[3].clone(), v.shape[3].clone(), k.shape[2].clone(), k.shape[0].clone())
    } else {
        let kvh = n.attr_int("kv_num_heads", 0)?;
        if kvh <= 0 {
            return Err(n.bad("3-D Attention inputs need kv_num_heads"));
        }
        let hk = k.shape[2]
            .div_exact(&Dim::known(kvh))
            .ok_or_else(|| n.shape_err("key width not divisible by kv_num_heads"))?;
        let hv = v.shape[2]
            .div_exact(&Dim::known(kvh))
            .ok_or_else(|| n.shape_err("value width not divisible by kv_num_heads"))?;
        (Dim::known(kvh), hk, hv, k.shape[1].clone(), k.shape[0].clone())
    };
    // Keys and values have one length (torch.export names the two caches' lengths apart).
    if let Some(v_len) = v.shape.get(if v.shape.len() == 4 { 2 } else { 1 }) {
        ctx.unify(&kv_len, v_len);
    }
    let y = if q.shape.len() == 4 {
        vec![q.shape[0].clone(), q.shape[1].clone(), q.shape[2].clone(), head_v.clone()]
    } else {
        let qh = n.attr_int("q_num_heads", 0)?;
        let w = head_v.mul(&Dim::known(qh)).ok_or_else(|| n.shape_err("overflow"))?;
        vec![q.shape[0].clone(), q.shape[1].clone(), w]
    };
    outs.push(Info::new(q.dtype, y));
    let total = match past_k {
        Some(p) if p.shape.len() == 4 => p.shape[2].add(&kv_len).ok_or_else(|| n.shape_err("overflow"))?,
        _ => kv_len,
    };
    let total = ctx.normalize(&total);
    if n.num_outputs > 1 {
        outs.push(Info::new(k.dtype, vec![batch.clone(), kv_heads.clone(), total.clone(), head_k]));
    }
    if n.num_outputs > 2 {
        outs.push(Info::new(v.dtype, vec![batch, kv_heads, total, head_v]));
    }
    if n.num_outputs > 3 {
        outs.push(Info::new(q.dtype, vec![ctx.fresh("qk")]));
    }
    Ok(outs)
}

fn infer_gqa(n: &NodeCtx, ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    let q = req(n, inputs, 0)?;
    if q.shape.len() != 3 {
        return Err(n.shape_err("query must be [batch, sequence, hidden]"));
    }
    let heads = n.attr_int("num_heads", 0)?;
    let kv_heads = n.attr_int("kv_num_heads", 0)?;
    if heads <= 0 || kv_heads <= 0 || heads % kv_heads != 0 {
        return Err(n.bad(format!(
            "num_heads {heads} and kv_num_heads {kv_heads} must be positive, heads a multiple of kv heads"
        )));
    }
    let width = if opt(inputs, 1).is_some() { heads } else { heads + 2 * kv_heads };
    let head = q.shape[2]
        .div_exact(&Dim::known(width))
        .ok_or_else(|| n.shape_err(format!("query width {} is not a multiple of {width} heads", q.shape[2])))?;
    let past = opt(inputs, 3);
    // The caches hold kv_num_heads heads of the query's head size; the builder declares the
    // last dim as a size of its own (`kv_cache_dim`), which this makes the head size.
    for cache in [past, opt(inputs, 4)].into_iter().flatten().filter(|c| c.shape.len() == 4) {
        for (dim, want) in [(&cache.shape[1], Dim::known(kv_heads)), (&cache.shape[3], head.clone())] {
            let dim = ctx.normalize(dim);
            if dim.is_known() && want.is_known() && dim != want {
                return Err(n.shape_err(format!(
                    "a past cache is {} where {want} is expected",
                    ir::dim::shape_to_string(&cache.shape)
                )));
            }
            ctx.unify(&dim, &want);
        }
    }
    // Without a shared KV buffer the present cache is the past plus this step's tokens, which is
    // what total_sequence_length must then be.
    let appended = match past {
        Some(p) if p.shape.len() == 4 => Some(p.shape[2].add(&q.shape[1]).ok_or_else(|| n.shape_err("overflow"))?),
        _ => None,
    };
    let total = match (opt(inputs, 6).and_then(|t| t.as_dims()), appended) {
        (Some((d, _)), Some(a)) if d.len() == 1 => ctx.unify(&d[0], &a),
        (Some((d, _)), None) if d.len() == 1 => d[0].clone(),
        (_, Some(a)) => a,
        _ => ctx.fresh("total"),
    };
    let total = ctx.normalize(&total);
    let hidden = head.mul(&Dim::known(heads)).ok_or_else(|| n.shape_err("overflow"))?;
    let mut outs = vec![Info::new(q.dtype, vec![q.shape[0].clone(), q.shape[1].clone(), hidden])];
    for _ in 1..n.num_outputs.min(3) {
        outs.push(Info::new(q.dtype, vec![q.shape[0].clone(), Dim::known(kv_heads), total.clone(), head.clone()]));
    }
    if n.num_outputs > 3 {
        outs.push(Info::new(DType::F32, vec![ctx.fresh("qk")]));
    }
    Ok(outs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ir::{Attr, Attrs, Domain};

    fn node<'a>(op: &'static str, attrs: &'a Attrs, num_outputs: usize) -> NodeCtx<'a> {
        NodeCtx { name: "n", domain: Domain::Onnx, op, opset: 23, attrs, num_outputs }
    }

    fn ints(values: &[i64]) -> Info {
        Info::constant(Tensor::from_i64(DType::I64, vec![values.len()], values.to_vec()))
    }

    fn shape(info: &Info) -> String {
        ir::dim::shape_to_string(&info.shape)
    }

    #[test]
    fn top_k_cuts_its_axis_to_k_or_to_a_fresh_size_for_a_run_time_k() {
        let (attrs, mut ctx) = (Attrs::default(), Ctx::default());
        let x = Info::new(DType::F32, vec![Dim::sym("n"), Dim::known(5)]);
        let out = infer_node(&node("TopK", &attrs, 2), &mut ctx, &[Some(&x), Some(&ints(&[2]))]).unwrap();
        assert_eq!((shape(&out[0]), out[0].dtype, out[1].dtype), ("[n,2]".into(), DType::F32, DType::I64));
        let k = Info::new(DType::I64, vec![Dim::known(1)]);
        let out = infer_node(&node("TopK", &attrs, 2), &mut ctx, &[Some(&x), Some(&k)]).unwrap();
        assert!(out[0].shape[1].as_symbol().is_some_and(|s| s.starts_with("topk")), "{}", shape(&out[0]));
        let err = infer_node(&node("TopK", &attrs, 2), &mut ctx, &[Some(&x), Some(&ints(&[6]))]).unwrap_err();
        assert!(err.to_string().contains("k = 6 is outside 0..=5"), "{err}");
    }

    #[test]
    fn pad_grows_the_padded_axes_and_refuses_axes_given_at_run_time() {
        let (attrs, mut ctx) = (Attrs::default(), Ctx::default());
        let x = Info::new(DType::F32, vec![Dim::sym("n"), Dim::known(5)]);
        let pads = ints(&[1, 0, 1, -2]);
        let out = infer_node(&node("Pad", &attrs, 1), &mut ctx, &[Some(&x), Some(&pads)]).unwrap();
        assert_eq!(shape(&out[0]), "[n + 2,3]");
        // Pads given at run time: only the dims of `axes` become fresh sizes.
        let run_time = Info::new(DType::I64, vec![Dim::known(2)]);
        let ins = [Some(&x), Some(&run_time), None, Some(&ints(&[-1]))];
        let out = infer_node(&node("Pad", &attrs, 1), &mut ctx, &ins).unwrap();
        assert_eq!(out[0].shape[0], Dim::sym("n"));
        assert!(out[0].shape[1].as_symbol().is_some_and(|s| s.starts_with("pad")));
        let ins = [Some(&x), Some(&pads), None, Some(&run_time)];
        let err = infer_node(&node("Pad", &attrs, 1), &mut ctx, &ins).unwrap_err();
        assert!(err.to_string().contains("axes must be a constant"), "{err}");
    }

    #[test]
    fn einsum_output_dims_come_from_the_labels() {
        let mut attrs = Attrs::default();
        attrs.set("equation", Attr::Str("bij,bjk->bik".into()));
        let mut ctx = Ctx::default();
        let a = Info::new(DType::F32, vec![Dim::sym("n"), Dim::known(2), Dim::known(3)]);
        let b = Info::new(DType::F32, vec![Dim::sym("n"), Dim::known(3), Dim::known(4)]);
        let out = infer_node(&node("Einsum", &attrs, 1), &mut ctx, &[Some(&a), Some(&b)]).unwrap();
        assert_eq!(shape(&out[0]), "[n,2,4]");
        let c = Info::new(DType::F32, vec![Dim::sym("n"), Dim::known(5), Dim::known(4)]);
        let err = infer_node(&node("Einsum", &attrs, 1), &mut ctx, &[Some(&a), Some(&c)]).unwrap_err();
        assert!(err.to_string().contains("sizes 3 and 5"), "{err}");
    }
}

//! Dtype and symbolic shape inference, with constant and shape-arithmetic folding.
//!
//! Every value gets an [`Info`]: dtype, symbolic shape, and what is known of its contents — a
//! concrete small tensor, or a vector of symbolic dims (what `Shape(x)` and the arithmetic on it
//! produce). Nodes whose inputs are all concrete are evaluated with the reference evaluator;
//! shape arithmetic on symbolic dims is folded exactly on [`Dim`] polynomials. Provable mismatches
//! (a concrete 256 against a concrete 384) are errors naming the node; agreements the frontend has
//! to assume (`total_sequence_length` = `past_sequence_length + sequence_length`) are recorded.

mod creation;
mod dims;
mod elementwise;
mod gather;
mod matmul;
mod node;
mod normalization;
mod reduce;
mod shape_ops;
mod slicing;
mod value;

pub use node::NodeCtx;
pub use shape_ops::reshape_shape;
pub use slicing::constant_slice_bounds;
pub use value::{Ctx, Info, Known};

use crate::error::ErrorKind;
use ir::op::OpRef;
use ir::{DType, Dim, Tensor};
use node::{attr_dtype, norm_axis, opt, req, In};

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
        "Reshape" => shape_ops::reshape(n, ctx, inputs),
        "Flatten" => shape_ops::flatten(n, ctx, inputs),
        "Transpose" => shape_ops::transpose(n, ctx, inputs),
        "Unsqueeze" => shape_ops::unsqueeze(n, ctx, inputs),
        "Squeeze" => shape_ops::squeeze(n, ctx, inputs),
        "Concat" => slicing::concat(n, ctx, inputs),
        "Split" => slicing::split(n, ctx, inputs),
        "Slice" => slicing::slice(n, ctx, inputs),
        "Gather" => gather::gather(n, ctx, inputs),
        "GatherElements" => gather::gather_elements(n, ctx, inputs),
        "GatherND" => gather::gather_nd(n, ctx, inputs),
        "ScatterND" | "ScatterElements" => one(x0()?.dtype, x0()?.shape.clone()),
        "Pad" => slicing::pad(n, ctx, inputs),
        "TopK" => reduce::top_k(n, ctx, inputs),
        "NegativeLogLikelihoodLoss" | "SoftmaxCrossEntropyLoss" => reduce::loss(n, ctx, inputs),
        "Einsum" => matmul::einsum(n, ctx, inputs),
        "Expand" => shape_ops::expand(n, ctx, inputs),
        "Tile" => shape_ops::tile(n, ctx, inputs),
        "Range" => creation::range(n, ctx, inputs),
        "ConstantOfShape" => creation::constant_of_shape(n, ctx, inputs),
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

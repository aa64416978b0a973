//! Reductions: Reduce* over axes (an input from opset 13/18, an attribute before), ArgMax/ArgMin
//! (int64 indices), TopK (the axis cut to k) and the losses (a scalar unless `reduction` is
//! `none`).

use super::node::{axes_of, norm_axis, one, req, In, NodeCtx};
use super::value::{Ctx, Info};
use crate::error::ErrorKind;
use ir::{DType, Dim};

/// Reduce*: the reduced axes dropped, or kept as 1 with `keepdims`; no axes reduce all of them,
/// or none with `noop_with_empty_axes`.
pub(super) fn reduce(n: &NodeCtx, _ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    let x = req(n, inputs, 0)?;
    let keep = n.attr_int("keepdims", 1)? != 0;
    let noop = n.attr_int("noop_with_empty_axes", 0)? != 0;
    let axes = axes_of(n, inputs, 1)?;
    one(x.dtype, reduce_shape(n, x, axes, keep, noop)?)
}

/// ArgMax, ArgMin: int64 indices, `axis` reduced as Reduce* reduces it.
pub(super) fn arg_reduce(n: &NodeCtx, _ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    let x = req(n, inputs, 0)?;
    let keep = n.attr_int("keepdims", 1)? != 0;
    let axis = n.attr_int("axis", 0)?;
    one(DType::I64, reduce_shape(n, x, Some(vec![axis]), keep, false)?)
}

/// TopK: values and int64 indices, the axis cut to `k` (an attribute before opset 10, an input
/// from 10; a `k` given at run time makes it a fresh size).
pub(super) fn top_k(n: &NodeCtx, ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    let x = req(n, inputs, 0)?;
    if x.shape.is_empty() {
        return Err(n.shape_err("the input must have rank at least 1"));
    }
    let axis = norm_axis(n, n.attr_int("axis", -1)?, x.shape.len())?;
    let k = if n.opset < 10 {
        Some(Dim::known(n.attr_int("k", -1)?))
    } else {
        req(n, inputs, 1)?.as_dims().and_then(|(d, _)| (d.len() == 1).then(|| d[0].clone()))
    };
    let k = k.unwrap_or_else(|| ctx.fresh("topk"));
    let dim = ctx.normalize(&x.shape[axis]);
    if let (Some(kk), Some(d)) = (k.as_known(), dim.as_known()) {
        if kk < 0 || kk > d {
            return Err(n.shape_err(format!("k = {kk} is outside 0..={d}, the size of axis {axis}")));
        }
    }
    let mut shape = x.shape.clone();
    shape[axis] = k;
    Ok(vec![Info::new(x.dtype, shape.clone()), Info::new(DType::I64, shape)])
}

/// NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss: the loss is a scalar, or of the target's
/// shape with `reduction = none`; SoftmaxCrossEntropyLoss's optional log-probabilities are of
/// the scores' shape.
pub(super) fn loss(n: &NodeCtx, _ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    let (x, target) = (req(n, inputs, 0)?, req(n, inputs, 1)?);
    let reduced = n.attrs.str("reduction").map_err(|e| n.bad(e.to_string()))? != Some("none");
    let loss = if reduced { vec![] } else { target.shape.clone() };
    let mut outs = vec![Info::new(x.dtype, loss)];
    if n.num_outputs > 1 {
        outs.push(Info::new(x.dtype, x.shape.clone()));
    }
    Ok(outs)
}

/// `x`'s shape with `axes` (none: all of them, or none with `noop_empty`) dropped or kept as 1.
fn reduce_shape(
    n: &NodeCtx,
    x: &Info,
    axes: Option<Vec<i64>>,
    keepdims: bool,
    noop_empty: bool,
) -> Result<Vec<Dim>, ErrorKind> {
    let rank = x.shape.len();
    let axes: Vec<usize> = match axes {
        Some(a) if !a.is_empty() => a.iter().map(|&a| norm_axis(n, a, rank)).collect::<Result<_, _>>()?,
        _ if noop_empty => return Ok(x.shape.clone()),
        _ => (0..rank).collect(),
    };
    let mut out = Vec::new();
    for (i, d) in x.shape.iter().enumerate() {
        if axes.contains(&i) {
            if keepdims {
                out.push(Dim::known(1));
            }
        } else {
            out.push(d.clone());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use crate::infer::testing::*;
    use ir::DType::*;

    #[test]
    fn reductions_drop_or_keep_their_axes() {
        let x = value(F32, &["batch", "seq", "64"]);
        // ReduceMean-18: the axes are an input; keepdims defaults to 1.
        assert_eq!(TestNode::new("mean", "ReduceMean").types(&[&x, &ints(&[-1])]), ["f32[batch,seq,1]"]);
        let drop = TestNode::new("mean", "ReduceMean").int("keepdims", 0);
        assert_eq!(drop.types(&[&x, &ints(&[-1])]), ["f32[batch,seq]"]);
        // ReduceMean-13: the axes are an attribute.
        let old = TestNode::new("mean", "ReduceMean").opset(13).ints("axes", &[0, 2]);
        assert_eq!(old.types(&[&x]), ["f32[1,seq,1]"]);
    }

    #[test]
    fn reductions_without_axes_reduce_every_axis_unless_told_to_do_nothing() {
        let x = value(F32, &["batch", "seq", "64"]);
        assert_eq!(TestNode::new("sum", "ReduceSum").types(&[&x]), ["f32[1,1,1]"]);
        assert_eq!(TestNode::new("sum", "ReduceSum").int("keepdims", 0).types(&[&x]), ["f32[]"]);
        let noop = TestNode::new("sum", "ReduceSum").int("noop_with_empty_axes", 1);
        assert_eq!(noop.types(&[&x, &ints(&[])]), ["f32[batch,seq,64]"]);
    }

    #[test]
    fn reductions_refuse_axes_out_of_range_or_given_at_run_time() {
        let x = value(F32, &["batch", "seq", "64"]);
        let err = TestNode::new("max", "ReduceMax").refusal(&[&x, &ints(&[3])]);
        assert_eq!(err, "node `max` (ReduceMax): shape mismatch: axis 3 is out of range for rank 3");
        let err = TestNode::new("max", "ReduceMax").refusal(&[&x, &value(I64, &["1"])]);
        assert_eq!(err, "node `max` (ReduceMax): axes must be a constant integer tensor");
    }

    #[test]
    fn arg_max_and_arg_min_give_int64_indices() {
        let x = value(F16, &["batch", "seq", "vocab"]);
        let last = TestNode::new("argmax", "ArgMax").int("axis", -1).int("keepdims", 0);
        assert_eq!(last.types(&[&x]), ["i64[batch,seq]"]);
        // The defaults: axis 0, keepdims 1.
        assert_eq!(TestNode::new("argmin", "ArgMin").types(&[&x]), ["i64[1,seq,vocab]"]);
    }

    #[test]
    fn top_k_cuts_its_axis_to_k_or_to_a_fresh_size_for_a_run_time_k() {
        let x = value(F32, &["n", "5"]);
        let top = TestNode::new("top", "TopK").outputs(2);
        assert_eq!(top.types(&[&x, &ints(&[2])]), ["f32[n,2]", "i64[n,2]"]);
        let out = top.run(&[&x, &value(I64, &["1"])]).unwrap();
        assert!(out[0].shape[1].as_symbol().is_some_and(|s| s.starts_with("topk")), "{}", typed(&out[0]));
        // TopK-1: k is an attribute.
        let old = TestNode::new("top", "TopK").opset(1).int("k", 3).outputs(2);
        assert_eq!(old.types(&[&x]), ["f32[n,3]", "i64[n,3]"]);
        let err = top.refusal(&[&x, &ints(&[6])]);
        assert_eq!(err, "node `top` (TopK): shape mismatch: k = 6 is outside 0..=5, the size of axis 1");
    }

    #[test]
    fn losses_are_scalars_unless_reduction_is_none() {
        let (scores, labels) = (value(F32, &["n", "10"]), value(I64, &["n"]));
        // SoftmaxCrossEntropyLoss: reduction `mean` by default; log_prob has the scores' shape.
        let sce = TestNode::new("sce", "SoftmaxCrossEntropyLoss").outputs(2);
        assert_eq!(sce.types(&[&scores, &labels]), ["f32[]", "f32[n,10]"]);
        let none = ir::Attr::Str("none".into());
        let nll = TestNode::new("nll", "NegativeLogLikelihoodLoss").attr("reduction", none);
        assert_eq!(nll.types(&[&scores, &labels]), ["f32[n]"]);
    }
}

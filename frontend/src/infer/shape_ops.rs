//! Ops that rearrange or repeat a tensor without choosing elements: Reshape (0 copies an input
//! dim, -1 is inferred), Flatten, Transpose, Unsqueeze, Squeeze, Expand and Tile. A target shape
//! given at run time makes fresh sizes.

use super::node::{axes_of, broadcast, norm_axis, one, req, In, NodeCtx};
use super::value::{Ctx, Info};
use crate::error::ErrorKind;
use ir::Dim;

/// Reshape to a target of known length; a target whose values are unknown gives fresh sizes.
pub(super) fn reshape(n: &NodeCtx, ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    let x = req(n, inputs, 0)?;
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

/// Flatten: `[d0 ⋯ d(axis−1), d(axis) ⋯ d(r−1)]` to the 2-D `[product before, product from]`.
pub(super) fn flatten(n: &NodeCtx, _ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    let x = req(n, inputs, 0)?;
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

/// Transpose: output dim i is input dim `perm[i]` (default: the axes reversed).
pub(super) fn transpose(n: &NodeCtx, _ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    let x = req(n, inputs, 0)?;
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

/// Unsqueeze: a 1 inserted at each axis, the axes counted in the output's rank.
pub(super) fn unsqueeze(n: &NodeCtx, _ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    let x = req(n, inputs, 0)?;
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

/// Squeeze: the given axes (which must not be known sizes other than 1) removed, or without axes
/// every dim known to be 1.
pub(super) fn squeeze(n: &NodeCtx, _ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    let x = req(n, inputs, 0)?;
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

/// Expand: the input broadcast with the target shape (fresh sizes when the target is unknown).
pub(super) fn expand(n: &NodeCtx, ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    let x = req(n, inputs, 0)?;
    let s = req(n, inputs, 1)?;
    let (target, _) = s.as_dims().unwrap_or_else(|| {
        let len = s.shape.first().and_then(|d| d.as_known()).unwrap_or(0);
        ((0..len).map(|_| ctx.fresh("expand")).collect(), false)
    });
    one(x.dtype, broadcast(n, ctx, &[&x.shape, &target])?)
}

/// Tile: each dim times its repeat count (fresh sizes when the repeats are unknown).
pub(super) fn tile(n: &NodeCtx, ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    let x = req(n, inputs, 0)?;
    let reps = req(n, inputs, 1)?;
    let out = match reps.as_dims() {
        Some((r, _)) if r.len() == x.shape.len() => {
            x.shape.iter().zip(&r).map(|(a, b)| a.mul(b).unwrap_or_else(|| ctx.fresh("tile"))).collect()
        }
        _ => x.shape.iter().map(|_| ctx.fresh("tile")).collect(),
    };
    one(x.dtype, out)
}

#[cfg(test)]
mod tests {
    use crate::infer::testing::*;
    use ir::DType::*;
    use ir::Dim;

    #[test]
    fn reshape_copies_zeros_and_infers_minus_one() {
        let x = value(F32, &["batch", "seq", "576"]);
        let r = TestNode::new("heads", "Reshape");
        assert_eq!(r.types(&[&x, &ints(&[0, 0, 9, 64])]), ["f32[batch,seq,9,64]"]);
        // −1 is batch·seq·576 elements over batch·64: 9·seq.
        assert_eq!(r.types(&[&x, &ints(&[0, -1, 64])]), ["f32[batch,9*seq,64]"]);
        // A target computed from Shape holds symbolic sizes.
        let target = sizes(&[sym("batch"), sym("seq"), Dim::known(9), Dim::known(64)]);
        assert_eq!(r.types(&[&x, &target]), ["f32[batch,seq,9,64]"]);
    }

    #[test]
    fn reshape_refuses_element_counts_that_differ_and_two_minus_ones() {
        let (r, x) = (TestNode::new("r", "Reshape"), value(F32, &["2", "3"]));
        let err = r.refusal(&[&x, &ints(&[4])]);
        assert_eq!(err, "node `r` (Reshape): shape mismatch: cannot reshape [2,3] (6 elements) to [4] (4 elements)");
        let err = r.refusal(&[&x, &ints(&[-1, -1])]);
        assert_eq!(err, "node `r` (Reshape): shape mismatch: more than one -1 in the target shape");
    }

    #[test]
    fn a_reshape_target_given_at_run_time_gives_fresh_sizes() {
        let out = TestNode::new("r", "Reshape").run(&[&value(F32, &["n"]), &value(I64, &["2"])]).unwrap();
        let fresh = |d: &Dim| d.as_symbol().is_some_and(|s| s.starts_with("reshape"));
        assert!(out[0].shape.len() == 2 && out[0].shape.iter().all(fresh), "{}", typed(&out[0]));
        assert_ne!(out[0].shape[0], out[0].shape[1]);
    }

    #[test]
    fn flatten_multiplies_the_dims_on_either_side_of_its_axis() {
        let x = value(F32, &["batch", "seq", "4", "8"]);
        assert_eq!(TestNode::new("f", "Flatten").types(&[&x]), ["f32[batch,32*seq]"]);
        assert_eq!(TestNode::new("f", "Flatten").int("axis", 0).types(&[&x]), ["f32[1,32*batch*seq]"]);
        assert_eq!(TestNode::new("f", "Flatten").int("axis", -1).types(&[&x]), ["f32[4*batch*seq,8]"]);
        let err = TestNode::new("f", "Flatten").int("axis", 5).refusal(&[&x]);
        assert_eq!(err, "node `f` (Flatten): shape mismatch: axis 5 out of range for rank 4");
    }

    #[test]
    fn transpose_permutes_the_dims_and_reverses_them_by_default() {
        let x = value(F32, &["batch", "seq", "heads", "64"]);
        let swap = TestNode::new("t", "Transpose").ints("perm", &[0, 2, 1, 3]);
        assert_eq!(swap.types(&[&x]), ["f32[batch,heads,seq,64]"]);
        assert_eq!(TestNode::new("t", "Transpose").types(&[&x]), ["f32[64,heads,seq,batch]"]);
        let err = TestNode::new("t", "Transpose").ints("perm", &[0, 0, 1, 2]).refusal(&[&x]);
        assert_eq!(err, "node `t` (Transpose): shape mismatch: perm [0, 0, 1, 2] repeats an axis");
    }

    #[test]
    fn unsqueeze_counts_its_axes_in_the_output_rank() {
        // Axes 0 and −1 of the rank-4 output are axes 0 and 3.
        let x = value(I64, &["seq", "4"]);
        assert_eq!(TestNode::new("u", "Unsqueeze").types(&[&x, &ints(&[0, -1])]), ["i64[1,seq,4,1]"]);
        // Unsqueeze-11: the axes are an attribute.
        assert_eq!(TestNode::new("u", "Unsqueeze").opset(11).ints("axes", &[1]).types(&[&x]), ["i64[seq,1,4]"]);
        // One axis makes a rank-3 output, whose axes are −3 to 2.
        let err = TestNode::new("u", "Unsqueeze").refusal(&[&x, &ints(&[3])]);
        assert_eq!(err, "node `u` (Unsqueeze): shape mismatch: axis 3 is out of range for rank 3");
    }

    #[test]
    fn squeeze_removes_the_given_axes_or_every_dim_known_to_be_1() {
        let x = value(F32, &["1", "n", "1"]);
        assert_eq!(TestNode::new("s", "Squeeze").types(&[&x, &ints(&[-1])]), ["f32[1,n]"]);
        assert_eq!(TestNode::new("s", "Squeeze").types(&[&x]), ["f32[n]"]);
        let err = TestNode::new("s", "Squeeze").refusal(&[&value(F32, &["1", "4"]), &ints(&[1])]);
        assert_eq!(err, "node `s` (Squeeze): shape mismatch: cannot squeeze axis 1 of size 4");
    }

    #[test]
    fn expand_broadcasts_with_its_target_and_tile_multiplies_by_the_repeats() {
        let x = value(F32, &["n", "1"]);
        assert_eq!(TestNode::new("e", "Expand").types(&[&x, &ints(&[2, 1, 4])]), ["f32[2,n,4]"]);
        let err = TestNode::new("e", "Expand").refusal(&[&value(F32, &["3"]), &ints(&[4])]);
        assert_eq!(err, "node `e` (Expand): shape mismatch: cannot broadcast [3] with [4] (dim 3 vs 4)");
        let tile = TestNode::new("tile", "Tile");
        assert_eq!(tile.types(&[&value(F32, &["n", "4"]), &ints(&[2, 3])]), ["f32[2*n,12]"]);
    }
}

//! Ops that cut, join or extend tensors along axes: Concat, Split, Slice and Pad.
//! Slice bounds must be constants, or the size of the dim they slice ("to the end").

use super::node::{known_ints, norm_axis, one, opt, req, same_dtype, In, NodeCtx};
use super::value::{renamed_symbol, Ctx, Info};
use crate::error::ErrorKind;
use ir::Dim;

/// Concat: the axis dims add up; every other dim must agree (two symbolic ones are unified).
pub(super) fn concat(n: &NodeCtx, ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
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

/// Split: one output per part, the axis cut to the `split` sizes (an input from opset 13, an
/// attribute before) or into equal parts.
pub(super) fn split(n: &NodeCtx, _ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    let x = req(n, inputs, 0)?;
    let axis = norm_axis(n, n.attr_int("axis", 0)?, x.shape.len())?;
    let parts = n.num_outputs;
    let sizes: Vec<Dim> = match opt(inputs, 1) {
        Some(s) => known_ints(n, s, "split")?.into_iter().map(Dim::known).collect(),
        None => match n.attr_ints("split")? {
            Some(s) => s.into_iter().map(Dim::known).collect(),
            None => equal_parts(n, &x.shape[axis], parts)?,
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

/// `d` split into `parts` parts: of ⌈d / parts⌉ each and the rest in the last for a known `d`,
/// exactly `d / parts` each for a symbolic one.
fn equal_parts(n: &NodeCtx, d: &Dim, parts: usize) -> Result<Vec<Dim>, ErrorKind> {
    Ok(match d.as_known() {
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
    })
}

/// Slice: each sliced axis gets the length of `d[start:end:step]`, a fresh size when that length
/// is not a polynomial.
pub(super) fn slice(n: &NodeCtx, ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    let x = req(n, inputs, 0)?;
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
pub(super) fn pad(n: &NodeCtx, ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
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

#[cfg(test)]
mod tests {
    use crate::infer::testing::*;
    use crate::infer::{Ctx, Info};
    use ir::DType::*;
    use ir::Dim;

    #[test]
    fn concat_adds_up_its_axis_and_unifies_the_other_dims() {
        let past = value(F16, &["batch", "kv_heads", "past", "64"]);
        let new = value(F16, &["batch", "kv_heads", "seq", "64"]);
        let out = TestNode::new("cat", "Concat").int("axis", -2).run(&[&past, &new]).unwrap();
        assert_eq!(out[0].shape, [sym("batch"), sym("kv_heads"), sum("past", "seq"), Dim::known(64)]);
        let mut ctx = Ctx::default();
        let (a, b) = (value(F32, &["n", "4"]), value(F32, &["m", "4"]));
        let out = TestNode::new("cat", "Concat").int("axis", 1).infer(&mut ctx, &[Some(&a), Some(&b)]).unwrap();
        assert_eq!(typed(&out[0]), "f32[m,8]");
        assert_eq!(ctx.substitutions, [("n".to_string(), sym("m"))]);
    }

    #[test]
    fn concat_refuses_known_dims_that_differ_and_ranks_that_differ() {
        let cat = TestNode::new("cat", "Concat");
        let err = cat.refusal(&[&value(F32, &["2", "3"]), &value(F32, &["2", "4"])]);
        assert_eq!(err, "node `cat` (Concat): shape mismatch: inputs differ on axis 1: 3 vs 4");
        let err = cat.refusal(&[&value(F32, &["2", "3"]), &value(F32, &["2"])]);
        assert_eq!(err, "node `cat` (Concat): shape mismatch: inputs have ranks 2 and 1");
    }

    #[test]
    fn split_cuts_its_axis_by_the_sizes_or_into_equal_parts() {
        let x = value(F32, &["n", "10"]);
        let two = TestNode::new("sp", "Split").int("axis", -1).outputs(2);
        assert_eq!(two.types(&[&x, &ints(&[4, 6])]), ["f32[n,4]", "f32[n,6]"]);
        // Split-18 without sizes: parts of ⌈10 / 3⌉ = 4, the last one smaller.
        let three = TestNode::new("sp", "Split").int("axis", 1).outputs(3);
        assert_eq!(three.types(&[&x]), ["f32[n,4]", "f32[n,4]", "f32[n,2]"]);
        // A symbolic size 2·h splits into two parts of h.
        let qk = Info::new(F32, vec![sym("h").mul(&Dim::known(2)).unwrap()]);
        assert_eq!(TestNode::new("sp", "Split").outputs(2).types(&[&qk]), ["f32[h]", "f32[h]"]);
        let err = two.refusal(&[&x, &ints(&[3, 3, 4])]);
        assert_eq!(err, "node `sp` (Split): shape mismatch: 3 split sizes for 2 outputs");
        let err = TestNode::new("sp", "Split").outputs(2).refusal(&[&value(F32, &["n"])]);
        assert_eq!(err, "node `sp` (Split): shape mismatch: cannot split a symbolic dim evenly");
    }

    #[test]
    fn slice_lengths_follow_negative_clamped_and_strided_bounds() {
        let x = value(F32, &["batch", "seq", "64"]);
        let s = TestNode::new("sl", "Slice");
        // x[..., :32]
        assert_eq!(s.types(&[&x, &ints(&[0]), &ints(&[32]), &ints(&[-1])]), ["f32[batch,seq,32]"]);
        // x[:, -1:]: the last position of a symbolic length.
        assert_eq!(s.types(&[&x, &ints(&[-1]), &ints(&[i64::MAX]), &ints(&[1])]), ["f32[batch,1,64]"]);
        // x[..., 1:100:3]: the end clamps to 64, so 1, 4, …, 61.
        let strided = [&x, &ints(&[1]), &ints(&[100]), &ints(&[2]), &ints(&[3])];
        assert_eq!(s.types(&strided), ["f32[batch,seq,21]"]);
        // x[..., ::-1]: start −1 is 63, end INT64_MIN clamps to −1.
        let reversed = [&x, &ints(&[-1]), &ints(&[i64::MIN]), &ints(&[2]), &ints(&[-1])];
        assert_eq!(s.types(&reversed), ["f32[batch,seq,64]"]);
        let err = s.refusal(&[&x, &ints(&[0]), &ints(&[4]), &ints(&[2]), &ints(&[0])]);
        assert_eq!(err, "node `sl` (Slice): slice step 0");
    }

    #[test]
    fn a_bound_that_is_the_sliced_dims_size_slices_to_the_end() {
        // transformers: mask[:, :, :, :key_length], the key length read with Shape.
        let mask = value(F32, &["1", "1", "seq", "total"]);
        let s = TestNode::new("sl", "Slice");
        let to_key_length = [&mask, &ints(&[0]), &sizes(&[sym("total")]), &ints(&[3])];
        assert_eq!(s.types(&to_key_length), ["f32[1,1,seq,total]"]);
        // The same size under another name (torch.export) is assumed equal.
        let mut ctx = Ctx::default();
        let renamed = sizes(&[sym("kv")]);
        let inputs = [Some(&mask), Some(&ints(&[0])), Some(&renamed), Some(&ints(&[3]))];
        assert_eq!(typed(&s.infer(&mut ctx, &inputs).unwrap()[0]), "f32[1,1,seq,total]");
        assert_eq!(ctx.substitutions, [("kv".to_string(), sym("total"))]);
        // Any other symbolic bound is refused, naming it.
        let other = sizes(&[sym("seq").add(&Dim::known(1)).unwrap()]);
        let err = s.refusal(&[&mask, &ints(&[0]), &other, &ints(&[3])]);
        let want = "ends must be constant or the size of the dim it slices; it is seq + 1, the dim is total";
        assert_eq!(err, format!("node `sl` (Slice): {want}"));
    }

    #[test]
    fn pad_before_opset_11_reads_its_pads_attribute_and_refuses_negative_sizes() {
        let x = value(F32, &["n", "3"]);
        let pad = TestNode::new("pad", "Pad").opset(10).ints("pads", &[0, 1, 0, 2]);
        assert_eq!(pad.types(&[&x]), ["f32[n,6]"]);
        let err = TestNode::new("pad", "Pad").refusal(&[&x, &ints(&[0, -2, 0, -2])]);
        assert_eq!(err, "node `pad` (Pad): shape mismatch: pads -2 and -2 do not fit axis 1 of 3");
    }

    #[test]
    fn pad_grows_the_padded_axes_and_refuses_axes_given_at_run_time() {
        let x = value(F32, &["n", "5"]);
        let pad = TestNode::new("pad", "Pad");
        // Pads are [begin of each axis, end of each axis]: axis 0 grows by 1 + 1, axis 1 by 0 − 2.
        let pads = ints(&[1, 0, 1, -2]);
        assert_eq!(pad.types(&[&x, &pads]), ["f32[n + 2,3]"]);
        // Pads given at run time: only the dims of `axes` become fresh sizes.
        let run_time = value(I64, &["2"]);
        let out = pad.infer(&mut Default::default(), &[Some(&x), Some(&run_time), None, Some(&ints(&[-1]))]).unwrap();
        assert_eq!(out[0].shape[0], sym("n"));
        assert!(out[0].shape[1].as_symbol().is_some_and(|s| s.starts_with("pad")));
        let err = refusal(pad.infer(&mut Default::default(), &[Some(&x), Some(&pads), None, Some(&run_time)]));
        assert_eq!(err, "node `pad` (Pad): axes must be a constant integer tensor");
    }
}

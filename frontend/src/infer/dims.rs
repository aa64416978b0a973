//! Shape arithmetic folded on symbolic dims: `Shape` and `Size` always, and the integer ops
//! exporters compute shapes with (Gather, Concat, Slice, Add/Sub/Mul/Div, Equal, Where, Max/Min,
//! ...) when an input is a vector of [`Dim`]s, so `Shape → Gather → Add → Concat → Reshape` folds
//! exactly without knowing any size.

use super::node::{attr_dtype, axes_of, known_ints, opt, req, In, NodeCtx};
use super::value::{Ctx, Info, Known};
use crate::error::ErrorKind;
use ir::{DType, Dim, Tensor};

/// Folded contents: the dims, and whether they are a scalar rather than a vector.
type Folded = Option<(Vec<Dim>, bool)>;

/// Folds integer shape arithmetic whose inputs are symbolic dims. `None` when the node is not
/// shape arithmetic on symbolic values (including when everything is concrete: the evaluator
/// folds those).
pub(super) fn fold(n: &NodeCtx, ctx: &Ctx, inputs: In) -> Result<Option<Info>, ErrorKind> {
    match n.op {
        "Shape" => return shape(n, ctx, inputs).map(Some),
        "Size" => return size(n, inputs).map(Some),
        _ => {}
    }
    if !inputs.iter().flatten().any(|i| matches!(i.known, Known::Dims { .. })) {
        return Ok(None);
    }
    let out_dtype = req(n, inputs, 0)?.dtype;
    let result = match n.op {
        "Identity" => dims(inputs, 0),
        "Cast" => return cast(n, inputs),
        "Gather" => gather(n, inputs)?,
        "Unsqueeze" => unsqueeze(n, inputs)?,
        "Squeeze" => squeeze(inputs),
        "Concat" => concat(inputs),
        "Reshape" => reshape(n, inputs),
        "Slice" => slice(n, inputs)?,
        "Add" | "Sub" | "Mul" | "Div" => arithmetic(n, inputs),
        "Equal" => return Ok(equal(ctx, inputs)),
        "Where" => return where_(n, inputs),
        "Max" | "Min" => max_min(n, inputs),
        _ => None,
    };
    Ok(result.map(|(d, s)| Info::from_dims(out_dtype, d, s)))
}

/// Input `i`'s contents as symbolic dims, when known.
fn dims(inputs: In, i: usize) -> Folded {
    opt(inputs, i).and_then(|x| x.as_dims())
}

/// Element `i` of `v`, or its only element when `v` broadcasts.
fn at<T>(v: &[T], i: usize) -> &T {
    &v[if v.len() == 1 { 0 } else { i }]
}

/// The dims of inputs 0 and 1 side by side, a vector of one broadcast against the other, and
/// whether both were scalars; `None` when either is not dims or their lengths do not broadcast.
fn paired_dims(inputs: In) -> Option<(Vec<(Dim, Dim)>, bool)> {
    let (Some((a, sa)), Some((b, sb))) = (dims(inputs, 0), dims(inputs, 1)) else { return None };
    if a.len() != b.len() && a.len() != 1 && b.len() != 1 {
        return None;
    }
    let pairs = (0..a.len().max(b.len())).map(|i| (at(&a, i).clone(), at(&b, i).clone())).collect();
    Some((pairs, sa && sb))
}

/// `Shape(x)[start:end]`, the dims of x (clamped as Slice clamps).
fn shape(n: &NodeCtx, ctx: &Ctx, inputs: In) -> Result<Info, ErrorKind> {
    let x = req(n, inputs, 0)?;
    let r = x.shape.len() as i64;
    let clamp = |v: i64| if v < 0 { (v + r).max(0) } else { v.min(r) };
    let start = clamp(n.attr_int("start", 0)?) as usize;
    let end = clamp(n.attr_int("end", r)?) as usize;
    let dims: Vec<Dim> = x.shape[start..end.max(start)].iter().map(|d| ctx.normalize(d)).collect();
    Ok(Info::from_dims(DType::I64, dims, false))
}

/// `Size(x)`, the product of x's dims.
fn size(n: &NodeCtx, inputs: In) -> Result<Info, ErrorKind> {
    let x = req(n, inputs, 0)?;
    let mut p = Dim::known(1);
    for d in &x.shape {
        p = p.mul(d).ok_or_else(|| n.shape_err("element count overflows"))?;
    }
    Ok(Info::from_dims(DType::I64, vec![p], true))
}

/// A cast to an integer type keeps the dims; a cast to anything else is not shape arithmetic.
fn cast(n: &NodeCtx, inputs: In) -> Result<Option<Info>, ErrorKind> {
    let to = attr_dtype(n, "to")?.ok_or_else(|| n.bad("Cast needs `to`"))?;
    if !to.is_int() {
        return Ok(None);
    }
    Ok(dims(inputs, 0).map(|(d, s)| Info::from_dims(to, d, s)))
}

/// Gather on axis 0 of a dims vector with constant indices.
fn gather(n: &NodeCtx, inputs: In) -> Result<Folded, ErrorKind> {
    let (data, _) = dims(inputs, 0).filter(|(_, s)| !*s).ok_or_else(|| n.bad("gathering from a symbolic scalar"))?;
    if n.attr_int("axis", 0)? != 0 {
        return Ok(None);
    }
    let Some((idx, scalar)) = dims(inputs, 1) else { return Ok(None) };
    let mut out = Vec::new();
    for i in &idx {
        let Some(i) = i.as_known() else { return Ok(None) };
        let j = if i < 0 { i + data.len() as i64 } else { i };
        let d = data.get(j as usize).filter(|_| j >= 0).ok_or_else(|| {
            n.shape_err(format!("index {i} is out of range for a shape vector of {} dims", data.len()))
        })?;
        out.push(d.clone());
    }
    Ok(Some((out, scalar)))
}

/// A scalar unsqueezed on its only axis becomes a one-element vector.
fn unsqueeze(n: &NodeCtx, inputs: In) -> Result<Folded, ErrorKind> {
    Ok(match (dims(inputs, 0), axes_of(n, inputs, 1)?) {
        (Some((d, true)), Some(axes)) if axes == [0] || axes == [-1] => Some((d, false)),
        _ => None,
    })
}

/// A one-element vector squeezed becomes a scalar.
fn squeeze(inputs: In) -> Folded {
    match dims(inputs, 0) {
        Some((d, false)) if d.len() == 1 => Some((d, true)),
        _ => None,
    }
}

/// Concat of dims vectors.
fn concat(inputs: In) -> Folded {
    let mut out = Vec::new();
    for i in 0..inputs.len() {
        match dims(inputs, i) {
            Some((d, false)) => out.extend(d),
            _ => return None,
        }
    }
    Some((out, false))
}

/// Reshape of a dims vector to a scalar, or to the vector it already is.
fn reshape(n: &NodeCtx, inputs: In) -> Folded {
    match (dims(inputs, 0), opt(inputs, 1).and_then(|s| known_ints(n, s, "shape").ok())) {
        (Some((d, _)), Some(shape)) if shape.is_empty() && d.len() == 1 => Some((d, true)),
        (Some((d, _)), Some(shape)) if shape.len() == 1 && (shape[0] == -1 || shape[0] == d.len() as i64) => {
            Some((d, false))
        }
        _ => None,
    }
}

/// A Slice of a dims vector with one constant start and end and step 1.
fn slice(n: &NodeCtx, inputs: In) -> Result<Folded, ErrorKind> {
    let Some((d, false)) = dims(inputs, 0) else { return Ok(None) };
    let starts = known_ints(n, req(n, inputs, 1)?, "starts")?;
    let ends = known_ints(n, req(n, inputs, 2)?, "ends")?;
    let steps = match opt(inputs, 4) {
        Some(s) => known_ints(n, s, "steps")?,
        None => vec![1],
    };
    if starts.len() != 1 || ends.len() != 1 || steps != [1] {
        return Ok(None);
    }
    let len = d.len() as i64;
    let clamp = |v: i64| if v < 0 { (v + len).max(0) } else { v.min(len) };
    let (s, e) = (clamp(starts[0]) as usize, clamp(ends[0]) as usize);
    Ok(Some((d[s..e.max(s)].to_vec(), false)))
}

/// Add, Sub, Mul and exact Div of two dims vectors of one length (or one of length 1).
fn arithmetic(n: &NodeCtx, inputs: In) -> Folded {
    let (pairs, scalar) = paired_dims(inputs)?;
    let mut out = Vec::with_capacity(pairs.len());
    for (x, y) in &pairs {
        let r = match n.op {
            "Add" => x.add(y),
            "Sub" => x.sub(y),
            "Mul" => x.mul(y),
            _ => x.div_exact(y),
        };
        out.push(r?);
    }
    Some((out, scalar))
}

/// Equal on dims, decided where the sizes decide it: the same polynomial, two known values,
/// polynomials a nonzero constant apart, or a size against a sentinel ≤ 0.
fn equal(ctx: &Ctx, inputs: In) -> Option<Info> {
    let (pairs, scalar) = paired_dims(inputs)?;
    let len = pairs.len();
    let mut out = Vec::with_capacity(len);
    for (x, y) in &pairs {
        let (x, y) = (ctx.normalize(x), ctx.normalize(y));
        if x == y {
            out.push(1);
        } else if let (Some(p), Some(q)) = (x.as_known(), y.as_known()) {
            out.push((p == q) as i64);
        } else if x.symbols().chain(y.symbols()).count() > 0
            && x.sub(&y).and_then(|d| d.as_known()).is_some_and(|k| k != 0)
        {
            out.push(0);
        } else if y.as_known().is_some_and(|k| k <= 0) || x.as_known().is_some_and(|k| k <= 0) {
            // Exporters compare shape entries with -1 or 0 sentinels; sizes are positive.
            out.push(0);
        } else {
            return None;
        }
    }
    let shape = if scalar { vec![] } else { vec![len] };
    Some(Info::constant(Tensor::from_i64(DType::Bool, shape, out)))
}

/// Where with a constant condition picks between two dims vectors.
fn where_(n: &NodeCtx, inputs: In) -> Result<Option<Info>, ErrorKind> {
    let cond = req(n, inputs, 0)?.as_const().and_then(|t| t.as_i64().map(|v| v.to_vec()));
    let (Some(c), Some((a, _)), Some((b, _))) = (cond, dims(inputs, 1), dims(inputs, 2)) else { return Ok(None) };
    let len = c.len().max(a.len()).max(b.len());
    let out = (0..len).map(|i| if *at(&c, i) != 0 { at(&a, i).clone() } else { at(&b, i).clone() }).collect();
    let dt = req(n, inputs, 1)?.dtype;
    Ok(Some(Info::from_dims(dt, out, false)))
}

/// Max and Min of two dims vectors, decided where sizes being at least 1 decides them.
fn max_min(n: &NodeCtx, inputs: In) -> Folded {
    let (Some((a, sa)), Some((b, sb))) = (dims(inputs, 0), dims(inputs, 1)) else { return None };
    if inputs.len() != 2 || a.len() != b.len() {
        return None;
    }
    let mut out = Vec::new();
    for (x, y) in a.iter().zip(&b) {
        // Sizes are at least 1: max(d, 1) = d and max(d, 0) = d for a symbolic size d.
        let pick = match (x.as_known(), y.as_known()) {
            (None, Some(k)) if k <= 1 => Some(if n.op == "Max" { x.clone() } else { y.clone() }),
            (Some(k), None) if k <= 1 => Some(if n.op == "Max" { y.clone() } else { x.clone() }),
            _ if x == y => Some(x.clone()),
            _ => None,
        };
        out.push(pick?);
    }
    Some((out, sa && sb))
}

#[cfg(test)]
mod tests {
    use crate::infer::testing::*;
    use crate::infer::{Ctx, Info};
    use ir::DType::*;
    use ir::{Dim, Tensor};

    /// The output of a node that must infer, in `ctx`.
    fn step(ctx: &mut Ctx, node: TestNode, inputs: &[&Info]) -> Info {
        let inputs: Vec<Option<&Info>> = inputs.iter().map(|&i| Some(i)).collect();
        node.infer(ctx, &inputs).unwrap().remove(0)
    }

    #[test]
    fn shape_gives_the_dims_as_values() {
        let x = value(F32, &["batch", "seq", "576"]);
        let out = TestNode::new("shape", "Shape").run(&[&x]).unwrap();
        assert_eq!(typed(&out[0]), "i64[3]");
        assert_eq!(out[0].as_dims(), Some((vec![sym("batch"), sym("seq"), Dim::known(576)], false)));
        // Shape-15's start and end slice the dims: [1:-1].
        let out = TestNode::new("shape", "Shape").int("start", 1).int("end", -1).run(&[&x]).unwrap();
        assert_eq!(out[0].as_dims(), Some((vec![sym("seq")], false)));
        // A shape of known dims is a constant.
        let out = TestNode::new("shape", "Shape").run(&[&value(F32, &["2", "3"])]).unwrap();
        assert_eq!(out[0].as_const().and_then(|t| t.as_i64()), Some(&[2, 3][..]));
    }

    #[test]
    fn size_is_the_product_of_the_dims() {
        let out = TestNode::new("size", "Size").run(&[&value(F32, &["batch", "seq", "4"])]).unwrap();
        let product = sym("batch").mul(&sym("seq")).and_then(|d| d.mul(&Dim::known(4))).unwrap();
        assert_eq!((typed(&out[0]), out[0].as_dims()), ("i64[]".into(), Some((vec![product], true))));
    }

    #[test]
    fn shape_arithmetic_folds_into_a_reshape_target() {
        // Exporters compute [batch, past + seq, -1] with Shape → Gather → Add → Unsqueeze → Concat.
        let mut ctx = Ctx::default();
        let x_shape = step(&mut ctx, TestNode::new("shape", "Shape"), &[&value(F32, &["batch", "seq", "576"])]);
        let cache_shape =
            step(&mut ctx, TestNode::new("shape", "Shape"), &[&value(F32, &["batch", "3", "past", "64"])]);
        let seq = step(&mut ctx, TestNode::new("seq", "Gather"), &[&x_shape, &int(1)]);
        assert_eq!(seq.as_dims(), Some((vec![sym("seq")], true)));
        let past = step(&mut ctx, TestNode::new("past", "Gather"), &[&cache_shape, &int(-2)]);
        let total = step(&mut ctx, TestNode::new("total", "Add"), &[&past, &seq]);
        assert_eq!((typed(&total), total.as_dims()), ("i64[]".into(), Some((vec![sum("past", "seq")], true))));
        let total = step(&mut ctx, TestNode::new("total_1d", "Unsqueeze"), &[&total, &ints(&[0])]);
        let batch = step(&mut ctx, TestNode::new("batch", "Gather"), &[&x_shape, &ints(&[0])]);
        let target = step(&mut ctx, TestNode::new("target", "Concat"), &[&batch, &total, &ints(&[-1])]);
        assert_eq!(target.as_dims(), Some((vec![sym("batch"), sum("past", "seq"), Dim::known(-1)], false)));
        assert_eq!(typed(&target), "i64[3]");
    }

    #[test]
    fn gather_from_a_shape_refuses_indices_out_of_range_and_scalar_data() {
        let shape = sizes(&[sym("batch"), sym("seq")]);
        let err = TestNode::new("g", "Gather").refusal(&[&shape, &int(2)]);
        assert_eq!(err, "node `g` (Gather): shape mismatch: index 2 is out of range for a shape vector of 2 dims");
        let err = TestNode::new("g", "Gather").refusal(&[&size(sym("seq")), &int(0)]);
        assert_eq!(err, "node `g` (Gather): gathering from a symbolic scalar");
    }

    #[test]
    fn equal_on_sizes_is_decided_where_the_sizes_decide_it() {
        let shape = sizes(&[sym("batch"), sym("seq")]);
        let eq = TestNode::new("eq", "Equal");
        // Sizes are positive, so never equal to the −1 sentinel exporters compare with.
        let out = eq.run(&[&shape, &ints(&[-1, -1])]).unwrap();
        assert_eq!(out[0].as_const().and_then(|t| t.as_i64()), Some(&[0, 0][..]));
        // The same polynomial is equal; seq and seq + 1 differ by a constant.
        let other = sizes(&[sym("batch"), sym("seq").add(&Dim::known(1)).unwrap()]);
        let out = eq.run(&[&shape, &other]).unwrap();
        assert_eq!((typed(&out[0]), out[0].as_const().and_then(|t| t.as_i64())), ("bool[2]".into(), Some(&[1, 0][..])));
        // Two unrelated sizes: not decided, the comparison stays a node.
        let out = eq.run(&[&sizes(&[sym("seq")]), &sizes(&[sym("total")])]).unwrap();
        assert_eq!((typed(&out[0]), out[0].as_const().is_none()), ("bool[1]".into(), true));
    }

    #[test]
    fn casts_where_max_and_slice_keep_sizes_symbolic() {
        let shape = sizes(&[sym("batch"), sym("seq")]);
        // Cast to an integer type keeps the values; `to` 6 is INT32.
        let out = TestNode::new("c", "Cast").int("to", 6).run(&[&shape]).unwrap();
        assert_eq!(
            (typed(&out[0]), out[0].as_dims()),
            ("i32[2]".into(), Some((vec![sym("batch"), sym("seq")], false)))
        );
        // Where with a constant condition picks per element.
        let cond = Info::constant(Tensor::from_i64(Bool, vec![2], vec![1, 0]));
        let out = TestNode::new("w", "Where").run(&[&cond, &shape, &ints(&[7, 8])]).unwrap();
        assert_eq!(out[0].as_dims(), Some((vec![sym("batch"), Dim::known(8)], false)));
        // A size is at least 1: Max(seq, 1) = seq.
        let out = TestNode::new("m", "Max").run(&[&sizes(&[sym("seq")]), &ints(&[1])]).unwrap();
        assert_eq!(out[0].as_dims(), Some((vec![sym("seq")], false)));
        // shape[1:] clamps its end to the length.
        let out = TestNode::new("s", "Slice").run(&[&shape, &ints(&[1]), &ints(&[i64::MAX])]).unwrap();
        assert_eq!(out[0].as_dims(), Some((vec![sym("seq")], false)));
    }
}

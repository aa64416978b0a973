//! Reductions and scans: ReduceMean/Sum/Max/Min, ArgMax, CumSum and Softmax. Float sums
//! accumulate in f64 and round once to the output dtype.

use super::layout::{strided_offsets, strides};
use super::{float_tensor, int_scalar, int_values, norm_axis, Ctx, Res};
use crate::dtype::DType;
use crate::tensor::{Data, Tensor};

/// The offsets of every kept position and, relative to each, of every reduced position.
struct Reduction {
    bases: Vec<usize>,
    members: Vec<usize>,
    out_shape: Vec<usize>,
}

fn plan(shape: &[usize], axes: &[usize], keepdims: bool) -> Reduction {
    let st = strides(shape);
    let (mut kept, mut kept_steps, mut red, mut red_steps) = (vec![], vec![], vec![], vec![]);
    for (d, (&n, &s)) in shape.iter().zip(&st).enumerate() {
        if axes.contains(&d) {
            red.push(n);
            red_steps.push(s as isize);
        } else {
            kept.push(n);
            kept_steps.push(s as isize);
        }
    }
    let out_shape = if keepdims {
        shape.iter().enumerate().map(|(d, &n)| if axes.contains(&d) { 1 } else { n }).collect()
    } else {
        kept.clone()
    };
    Reduction {
        bases: strided_offsets(&kept, &kept_steps, 0),
        members: strided_offsets(&red, &red_steps, 0),
        out_shape,
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Sum,
    Mean,
    Max,
    Min,
}

/// ReduceSum/Mean/Max/Min. Axes come from input 1 when given (ReduceSum from opset 13, the others
/// from 18) or else the `axes` attribute; no axes reduces everything unless
/// `noop_with_empty_axes`. Max/Min over an empty set give -inf/+inf (the integer extremes for
/// integer types); Mean over an empty set is NaN; integer Mean truncates.
pub(super) fn reduce(cx: &Ctx) -> Res<Vec<Tensor>> {
    let x = cx.input(0, "data")?;
    let kind = match cx.op.op {
        "ReduceSum" => Kind::Sum,
        "ReduceMean" => Kind::Mean,
        "ReduceMax" => Kind::Max,
        _ => Kind::Min,
    };
    let keepdims = cx.attrs().int_or("keepdims", 1)? != 0;
    let noop = cx.attrs().int_or("noop_with_empty_axes", 0)? != 0;
    let given: Vec<i64> = match cx.opt(1) {
        Some(t) => int_values(t, "axes")?.to_vec(),
        None => cx.attrs().ints("axes")?.map(<[i64]>::to_vec).unwrap_or_default(),
    };
    if given.is_empty() && noop {
        return Ok(vec![x.clone()]);
    }
    let mut axes: Vec<usize> = given.iter().map(|&a| norm_axis(a, x.rank(), "axis")).collect::<Res<_>>()?;
    axes.sort_unstable();
    axes.dedup();
    if given.is_empty() {
        axes = (0..x.rank()).collect();
    }
    let r = plan(&x.shape, &axes, keepdims);
    let count = r.members.len();
    let out = match &x.data {
        Data::F32(_) | Data::F64(_) => {
            let v = x.to_f64_vec();
            let values = r
                .bases
                .iter()
                .map(|&b| {
                    let items = r.members.iter().map(|&m| v[b + m]);
                    match kind {
                        Kind::Sum => items.sum(),
                        Kind::Mean => items.sum::<f64>() / count as f64,
                        Kind::Max => {
                            items.fold(
                                f64::NEG_INFINITY,
                                |a, p| if a.is_nan() || p.is_nan() { f64::NAN } else { a.max(p) },
                            )
                        }
                        Kind::Min => {
                            items.fold(f64::INFINITY, |a, p| if a.is_nan() || p.is_nan() { f64::NAN } else { a.min(p) })
                        }
                    }
                })
                .collect();
            float_tensor(x.dtype, r.out_shape, values)
        }
        Data::I64(v) => {
            if x.dtype == DType::Bool && matches!(kind, Kind::Sum | Kind::Mean) {
                bail!("{} does not take bool tensors", cx.op.op);
            }
            if kind == Kind::Mean && count == 0 {
                bail!("integer mean over an empty set");
            }
            let unsigned = x.dtype == DType::U64;
            let (lo, hi) = x.dtype.int_range().unwrap_or((i64::MIN, i64::MAX));
            let values = r
                .bases
                .iter()
                .map(|&b| {
                    let items = r.members.iter().map(|&m| v[b + m]);
                    match kind {
                        Kind::Sum => items.fold(0i64, i64::wrapping_add),
                        Kind::Mean if unsigned => ((items.fold(0i64, i64::wrapping_add) as u64) / count as u64) as i64,
                        Kind::Mean => items.fold(0i64, i64::wrapping_add) / count as i64,
                        Kind::Max if unsigned => items.map(|p| p as u64).max().unwrap_or(0) as i64,
                        Kind::Min if unsigned => items.map(|p| p as u64).min().unwrap_or(u64::MAX) as i64,
                        Kind::Max => items.max().unwrap_or(lo),
                        Kind::Min => items.min().unwrap_or(hi),
                    }
                })
                .collect();
            Tensor::from_i64(x.dtype, r.out_shape, values)
        }
        Data::Str(_) => bail!("{} does not take string tensors", cx.op.op),
    };
    Ok(vec![out])
}

/// ArgMax along `axis`; ties pick the first index, or the last with `select_last_index`.
pub(super) fn arg_max(cx: &Ctx) -> Res<Vec<Tensor>> {
    let x = cx.input(0, "data")?;
    let axis = norm_axis(cx.attrs().int_or("axis", 0)?, x.rank(), "axis")?;
    let keepdims = cx.attrs().int_or("keepdims", 1)? != 0;
    let last = cx.attrs().int_or("select_last_index", 0)? != 0;
    if x.shape[axis] == 0 {
        bail!("ArgMax over an empty axis");
    }
    if matches!(x.data, Data::Str(_)) {
        bail!("ArgMax does not take string tensors");
    }
    let r = plan(&x.shape, &[axis], keepdims);
    let v = x.to_f64_vec();
    let values = r
        .bases
        .iter()
        .map(|&b| {
            let mut best = 0;
            for (k, &m) in r.members.iter().enumerate() {
                let (p, q) = (v[b + m], v[b + r.members[best]]);
                if p > q || (last && p == q) {
                    best = k;
                }
            }
            best as i64
        })
        .collect();
    Ok(vec![Tensor::from_i64(DType::I64, r.out_shape, values)])
}

/// CumSum along the axis given as input 1, optionally exclusive and/or reversed.
pub(super) fn cum_sum(cx: &Ctx) -> Res<Vec<Tensor>> {
    let x = cx.input(0, "x")?;
    let axis = norm_axis(int_scalar(cx.input(1, "axis")?, "axis")?, x.rank(), "axis")?;
    let exclusive = cx.attrs().int_or("exclusive", 0)? != 0;
    let reverse = cx.attrs().int_or("reverse", 0)? != 0;
    let dim = x.shape[axis];
    let inner: usize = x.shape[axis + 1..].iter().product();
    let outer: usize = x.shape[..axis].iter().product();
    let order: Vec<usize> = if reverse { (0..dim).rev().collect() } else { (0..dim).collect() };
    let at = |o: usize, k: usize, i: usize| (o * dim + k) * inner + i;
    let out = match &x.data {
        Data::F32(_) | Data::F64(_) => {
            let v = x.to_f64_vec();
            let mut out = vec![0.0; v.len()];
            for o in 0..outer {
                for i in 0..inner {
                    let mut acc = 0.0;
                    for &k in &order {
                        let p = v[at(o, k, i)];
                        if !exclusive {
                            acc += p;
                        }
                        out[at(o, k, i)] = acc;
                        if exclusive {
                            acc += p;
                        }
                    }
                }
            }
            float_tensor(x.dtype, x.shape.clone(), out)
        }
        Data::I64(v) if x.dtype != DType::Bool => {
            let mut out = vec![0i64; v.len()];
            for o in 0..outer {
                for i in 0..inner {
                    let mut acc = 0i64;
                    for &k in &order {
                        let p = v[at(o, k, i)];
                        if !exclusive {
                            acc = acc.wrapping_add(p);
                        }
                        out[at(o, k, i)] = acc;
                        if exclusive {
                            acc = acc.wrapping_add(p);
                        }
                    }
                }
            }
            Tensor::from_i64(x.dtype, x.shape.clone(), out)
        }
        _ => bail!("CumSum does not take {} tensors", x.dtype),
    };
    Ok(vec![out])
}

/// Softmax over `axis` (default -1) from opset 13; before that, over the flattened trailing
/// block starting at `axis` (default 1). Computed in f64 with the maximum subtracted.
pub(super) fn softmax(cx: &Ctx) -> Res<Vec<Tensor>> {
    let x = cx.input(0, "input")?;
    super::require_float(x, "input")?;
    let legacy = cx.opset() < 13;
    let rank = x.rank().max(1);
    let axis = norm_axis(cx.attrs().int_or("axis", if legacy { 1 } else { -1 })?, rank, "axis")?;
    let shape: &[usize] = if x.rank() == 0 { &[1] } else { &x.shape };
    let outer: usize = shape[..axis].iter().product();
    let (dim, inner) = if legacy {
        (shape[axis..].iter().product::<usize>(), 1)
    } else {
        (shape[axis], shape[axis + 1..].iter().product::<usize>())
    };
    let v = x.to_f64_vec();
    let mut out = vec![0.0; v.len()];
    for o in 0..outer {
        for i in 0..inner {
            let at = |k: usize| (o * dim + k) * inner + i;
            let max = (0..dim).map(|k| v[at(k)]).fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = (0..dim).map(|k| (v[at(k)] - max).exp()).sum();
            for k in 0..dim {
                out[at(k)] = (v[at(k)] - max).exp() / sum;
            }
        }
    }
    Ok(vec![float_tensor(x.dtype, x.shape.clone(), out)])
}

/// Softmax of one row in f64, with an optional extra "sink" logit that joins the denominator
/// but gets no output (smooth softmax uses a sink of 0). Masked entries are `-inf`; a row whose
/// entries are all `-inf` (and has no sink) gives zeros.
pub(crate) fn softmax_row(row: &mut [f64], sink: Option<f64>) {
    let max = row.iter().copied().chain(sink).fold(f64::NEG_INFINITY, f64::max);
    if max == f64::NEG_INFINITY {
        row.iter_mut().for_each(|p| *p = 0.0);
        return;
    }
    let mut sum = sink.map_or(0.0, |s| (s - max).exp());
    for p in row.iter_mut() {
        *p = (*p - max).exp();
        sum += *p;
    }
    for p in row.iter_mut() {
        *p /= sum;
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use crate::attr::Attr;
    use crate::dtype::DType;

    #[test]
    fn reduce_axes_come_from_the_attribute_or_the_input() {
        let x = f32t(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let y = run_at("ReduceMean", 13, &[("axes", Attr::Ints(vec![1]))], &[Some(&x)], 1).unwrap();
        assert_eq!((y[0].shape.clone(), f32s(&y[0])), (vec![2, 1], vec![2.0, 5.0]));
        let y = run_at("ReduceMean", 13, &[("axes", Attr::Ints(vec![1])), ("keepdims", Attr::Int(0))], &[Some(&x)], 1)
            .unwrap();
        assert_eq!(y[0].shape, vec![2]);
        let y = run1("ReduceMean", &[], &[&x, &i64t(&[1], &[-2])]);
        assert_eq!((y.shape.clone(), f32s(&y)), (vec![1, 3], vec![2.5, 3.5, 4.5]));
        let y = run("ReduceSum", &[], &[Some(&x)], 1).unwrap();
        assert_eq!((y[0].shape.clone(), f32s(&y[0])), (vec![1, 1], vec![21.0]));
        let y = run("ReduceSum", &[("noop_with_empty_axes", Attr::Int(1))], &[Some(&x), Some(&i64t(&[0], &[]))], 1)
            .unwrap();
        assert_eq!(y[0], x);
    }

    #[test]
    fn reduce_max_min_propagate_nan_and_cover_empty_sets() {
        let x = f32t(&[2, 2], &[1.0, f32::NAN, 3.0, 2.0]);
        let y = f32s(&run1("ReduceMax", &[("keepdims", Attr::Int(0))], &[&x, &i64t(&[1], &[1])]));
        assert!(y[0].is_nan());
        assert_eq!(y[1], 3.0);
        let empty = f32t(&[2, 0], &[]);
        let y = run1("ReduceMax", &[("keepdims", Attr::Int(0))], &[&empty, &i64t(&[1], &[1])]);
        assert_eq!(f32s(&y), vec![f32::NEG_INFINITY; 2]);
        let xi = typed(DType::I32, &[2], &[1, 2]);
        assert_eq!(ints(&run1("ReduceMean", &[("keepdims", Attr::Int(0))], &[&xi])), vec![1]);
        assert_eq!(ints(&run1("ReduceMin", &[("keepdims", Attr::Int(0))], &[&xi])), vec![1]);
    }

    #[test]
    fn arg_max_breaks_ties_first_or_last() {
        let x = f32t(&[2, 3], &[1.0, 3.0, 3.0, 2.0, 2.0, 1.0]);
        let y = run1("ArgMax", &[("axis", Attr::Int(1))], &[&x]);
        assert_eq!((y.dtype, y.shape.clone(), ints(&y)), (DType::I64, vec![2, 1], vec![1, 0]));
        let y = run1(
            "ArgMax",
            &[("axis", Attr::Int(1)), ("select_last_index", Attr::Int(1)), ("keepdims", Attr::Int(0))],
            &[&x],
        );
        assert_eq!((y.shape.clone(), ints(&y)), (vec![2], vec![2, 1]));
    }

    #[test]
    fn cum_sum_exclusive_and_reverse() {
        let x = f32t(&[4], &[1.0, 2.0, 3.0, 4.0]);
        let axis = typed(DType::I32, &[], &[0]);
        let cs = |ex: i64, rev: i64| {
            f32s(&run1("CumSum", &[("exclusive", Attr::Int(ex)), ("reverse", Attr::Int(rev))], &[&x, &axis]))
        };
        assert_eq!(cs(0, 0), vec![1.0, 3.0, 6.0, 10.0]);
        assert_eq!(cs(1, 0), vec![0.0, 1.0, 3.0, 6.0]);
        assert_eq!(cs(0, 1), vec![10.0, 9.0, 7.0, 4.0]);
        assert_eq!(cs(1, 1), vec![9.0, 7.0, 4.0, 0.0]);
        let m = i64t(&[2, 2], &[1, 1, 1, 1]);
        assert_eq!(ints(&run1("CumSum", &[], &[&m, &i64t(&[1], &[-1])])), vec![1, 2, 1, 2]);
    }

    #[test]
    fn softmax_uses_one_axis_from_opset_13_and_a_flattened_block_before() {
        let y = run1("Softmax", &[], &[&f32t(&[3], &[1.0, 2.0, 3.0])]);
        assert_close(&f32s(&y), &[0.090_030_57, 0.244_728_48, 0.665_240_94], 1e-7);
        let x = f32t(&[1, 2, 2], &[0.0, 1.0, 2.0, 3.0]);
        let y = run_at("Softmax", 13, &[], &[Some(&x)], 1).unwrap();
        assert_close(&f32s(&y[0]), &[0.268_941_43, 0.731_058_6, 0.268_941_43, 0.731_058_6], 1e-7);
        let y = run_at("Softmax", 11, &[], &[Some(&x)], 1).unwrap();
        assert_close(&f32s(&y[0]), &[0.032_058_6, 0.087_144_32, 0.236_882_82, 0.643_914_2], 1e-7);
    }
}

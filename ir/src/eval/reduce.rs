//! Reductions, selections and scans: the Reduce* ops, ArgMax/ArgMin, TopK, CumSum and the
//! row normalisers Softmax, LogSoftmax and Hardmax. Float sums accumulate in f64 and round once
//! to the output dtype.

use super::layout::{checked_numel, strided_offsets, strides, take};
use super::{float_tensor, int_scalar, int_values, norm_axis, Ctx, Res};
use crate::dtype::DType;
use crate::tensor::{Data, Tensor};
use std::cmp::Ordering;

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
    Prod,
    L1,
    L2,
    SumSquare,
    LogSum,
    LogSumExp,
}

impl Kind {
    fn of(op: &str) -> Res<Kind> {
        Ok(match op {
            "ReduceSum" => Kind::Sum,
            "ReduceMean" => Kind::Mean,
            "ReduceMax" => Kind::Max,
            "ReduceMin" => Kind::Min,
            "ReduceProd" => Kind::Prod,
            "ReduceL1" => Kind::L1,
            "ReduceL2" => Kind::L2,
            "ReduceSumSquare" => Kind::SumSquare,
            "ReduceLogSum" => Kind::LogSum,
            "ReduceLogSumExp" => Kind::LogSumExp,
            _ => bail!("{op} is not a reduction"),
        })
    }
}

/// The Reduce* ops. Axes come from input 1 (ReduceSum from opset 13, the others from 18) or else
/// the `axes` attribute; no axes reduces everything, unless `noop_with_empty_axes`, which reduces
/// over no axis: each element is reduced alone, so the elementwise part still applies (ReduceL1
/// gives |x|, ReduceSumSquare x², ReduceLogSum log x), as ONNX settled it. Over an empty set Sum,
/// L1, L2 and SumSquare give 0, Prod 1, Max/Min -inf/+inf (the integer extremes for integer
/// types), LogSum and LogSumExp -inf, Mean NaN. Integer Mean truncates; integer L2, LogSum and
/// LogSumExp compute in f64 and truncate.
pub(super) fn reduce(cx: &Ctx) -> Res<Vec<Tensor>> {
    let x = cx.input(0, "data")?;
    let kind = Kind::of(cx.op.op)?;
    let keepdims = cx.attrs().int_or("keepdims", 1)? != 0;
    let r = plan(&x.shape, &reduce_axes(cx, x.rank())?, keepdims);
    let count = r.members.len();
    let out = match &x.data {
        Data::F32(_) | Data::F64(_) => {
            let v = x.to_f64_vec();
            let values =
                r.bases.iter().map(|&b| float_reduce(kind, count, r.members.iter().map(|&m| v[b + m]))).collect();
            float_tensor(x.dtype, r.out_shape, values)
        }
        Data::I64(v) => {
            if x.dtype == DType::Bool && !matches!(kind, Kind::Max | Kind::Min) {
                bail!("{} does not take bool tensors", cx.op.op);
            }
            if count == 0 && matches!(kind, Kind::Mean | Kind::LogSum | Kind::LogSumExp) {
                bail!("{} of an empty set is undefined for {}", cx.op.op, x.dtype);
            }
            let unsigned = x.dtype == DType::U64;
            let extremes = x.dtype.int_range().unwrap_or((i64::MIN, i64::MAX));
            let values = r
                .bases
                .iter()
                .map(|&b| int_reduce(kind, unsigned, extremes, r.members.iter().map(|&m| v[b + m])))
                .collect();
            Tensor::from_i64(x.dtype, r.out_shape, values)
        }
        Data::Str(_) => bail!("{} does not take string tensors", cx.op.op),
    };
    Ok(vec![out])
}

/// The reduced axes, sorted and unique; empty when `noop_with_empty_axes` and none are given.
fn reduce_axes(cx: &Ctx, rank: usize) -> Res<Vec<usize>> {
    let noop = cx.attrs().int_or("noop_with_empty_axes", 0)? != 0;
    let given: Vec<i64> = match cx.opt(1) {
        Some(t) => int_values(t, "axes")?.to_vec(),
        None => cx.attrs().ints("axes")?.map(<[i64]>::to_vec).unwrap_or_default(),
    };
    if given.is_empty() {
        return Ok(if noop { vec![] } else { (0..rank).collect() });
    }
    let mut axes: Vec<usize> = given.iter().map(|&a| norm_axis(a, rank, "axis")).collect::<Res<_>>()?;
    axes.sort_unstable();
    axes.dedup();
    Ok(axes)
}

/// One float reduction in f64; Max and Min propagate NaN.
fn float_reduce(kind: Kind, count: usize, items: impl Iterator<Item = f64>) -> f64 {
    let nan_or = |a: f64, p: f64, f: fn(f64, f64) -> f64| if a.is_nan() || p.is_nan() { f64::NAN } else { f(a, p) };
    match kind {
        Kind::Sum => items.sum(),
        Kind::Mean => items.sum::<f64>() / count as f64,
        Kind::Max => items.fold(f64::NEG_INFINITY, |a, p| nan_or(a, p, f64::max)),
        Kind::Min => items.fold(f64::INFINITY, |a, p| nan_or(a, p, f64::min)),
        Kind::Prod => items.product(),
        Kind::L1 => items.map(f64::abs).sum(),
        Kind::L2 => items.map(|p| p * p).sum::<f64>().sqrt(),
        Kind::SumSquare => items.map(|p| p * p).sum(),
        Kind::LogSum => items.sum::<f64>().ln(),
        Kind::LogSumExp => log_sum_exp(&items.collect::<Vec<_>>()),
    }
}

/// `log Σ exp(x)` with the maximum taken out, so large values do not overflow.
fn log_sum_exp(values: &[f64]) -> f64 {
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if max.is_infinite() {
        // Empty or all -inf gives -inf; any +inf gives +inf.
        return max;
    }
    max + values.iter().map(|&p| (p - max).exp()).sum::<f64>().ln()
}

/// One integer reduction, wrapping like the dtype's arithmetic (`unsigned` orders u64 values as
/// unsigned); `(lo, hi)` are the dtype's extremes for Max/Min over an empty set.
fn int_reduce(kind: Kind, unsigned: bool, (lo, hi): (i64, i64), items: impl Iterator<Item = i64>) -> i64 {
    match kind {
        Kind::Sum => wrapping_sum(items),
        Kind::Mean => {
            let v: Vec<i64> = items.collect();
            let total = wrapping_sum(v.iter().copied());
            if unsigned {
                ((total as u64) / v.len() as u64) as i64
            } else {
                total / v.len() as i64
            }
        }
        Kind::Max if unsigned => items.map(|p| p as u64).max().unwrap_or(0) as i64,
        Kind::Min if unsigned => items.map(|p| p as u64).min().unwrap_or(u64::MAX) as i64,
        Kind::Max => items.max().unwrap_or(lo),
        Kind::Min => items.min().unwrap_or(hi),
        Kind::Prod => items.fold(1i64, i64::wrapping_mul),
        Kind::L1 => wrapping_sum(items.map(|p| if unsigned { p } else { p.wrapping_abs() })),
        Kind::SumSquare => wrapping_sum(items.map(|p| p.wrapping_mul(p))),
        // `as` truncates toward zero, as the cast back to the integer type does.
        Kind::L2 => (wrapping_sum(items.map(|p| p.wrapping_mul(p))) as f64).sqrt() as i64,
        Kind::LogSum => (wrapping_sum(items) as f64).ln() as i64,
        Kind::LogSumExp => log_sum_exp(&items.map(|p| p as f64).collect::<Vec<_>>()) as i64,
    }
}

fn wrapping_sum(items: impl Iterator<Item = i64>) -> i64 {
    items.fold(0i64, i64::wrapping_add)
}

/// ArgMax (or ArgMin, `max == false`) along `axis`; ties pick the first index, or the last with
/// `select_last_index`.
pub(super) fn arg_extreme(cx: &Ctx, max: bool) -> Res<Vec<Tensor>> {
    let x = cx.input(0, "data")?;
    let axis = norm_axis(cx.attrs().int_or("axis", 0)?, x.rank(), "axis")?;
    let keepdims = cx.attrs().int_or("keepdims", 1)? != 0;
    let last = cx.attrs().int_or("select_last_index", 0)? != 0;
    if x.shape[axis] == 0 {
        bail!("{} over an empty axis", cx.op.op);
    }
    let keys = SortKeys::of(x, cx.op.op)?;
    let r = plan(&x.shape, &[axis], keepdims);
    let wanted = if max { Ordering::Greater } else { Ordering::Less };
    let values = r
        .bases
        .iter()
        .map(|&b| {
            let mut best = 0;
            for (k, &m) in r.members.iter().enumerate() {
                let order = keys.cmp(b + m, b + r.members[best]);
                if order == wanted || (last && order == Ordering::Equal) {
                    best = k;
                }
            }
            best as i64
        })
        .collect();
    Ok(vec![Tensor::from_i64(DType::I64, r.out_shape, values)])
}

/// Element values put in order: floats with NaN above every number (and -0 equal to +0), u64 as
/// unsigned, other integers and bools as signed.
enum SortKeys {
    Float(Vec<f64>),
    Signed(Vec<i64>),
    Unsigned(Vec<u64>),
}

impl SortKeys {
    fn of(x: &Tensor, op: &str) -> Res<SortKeys> {
        Ok(match &x.data {
            Data::F32(_) | Data::F64(_) => SortKeys::Float(x.to_f64_vec()),
            Data::I64(v) if x.dtype == DType::U64 => SortKeys::Unsigned(v.iter().map(|&p| p as u64).collect()),
            Data::I64(v) => SortKeys::Signed(v.clone()),
            Data::Str(_) => bail!("{op} does not take string tensors"),
        })
    }

    fn cmp(&self, a: usize, b: usize) -> Ordering {
        match self {
            SortKeys::Float(v) => match (v[a].is_nan(), v[b].is_nan()) {
                (true, true) => Ordering::Equal,
                (true, false) => Ordering::Greater,
                (false, true) => Ordering::Less,
                (false, false) => v[a].partial_cmp(&v[b]).unwrap_or(Ordering::Equal),
            },
            SortKeys::Signed(v) => v[a].cmp(&v[b]),
            SortKeys::Unsigned(v) => v[a].cmp(&v[b]),
        }
    }
}

/// TopK along `axis` (default -1): the `k` largest elements (the smallest with `largest=0`, from
/// opset 11) and their indices, largest (smallest) first; equal values come in index order, the
/// lower index first, as ONNX specifies. `k` is an attribute before opset 10 and a one-element
/// input from 10. With `sorted=0` the order is unspecified and this gives the sorted one.
pub(super) fn top_k(cx: &Ctx) -> Res<Vec<Tensor>> {
    let x = cx.input(0, "X")?;
    if x.rank() == 0 {
        bail!("the input must have rank at least 1");
    }
    let axis = norm_axis(cx.attrs().int_or("axis", -1)?, x.rank(), "axis")?;
    let k = top_k_count(cx)?;
    let largest = cx.opset() < 11 || cx.attrs().int_or("largest", 1)? != 0;
    let dim = x.shape[axis];
    if k < 0 || k as usize > dim {
        bail!("k = {k} is outside 0..={dim}, the size of axis {axis} of {:?}", x.shape);
    }
    let k = k as usize;
    let keys = SortKeys::of(x, "TopK")?;
    let mut shape = x.shape.clone();
    shape[axis] = k;
    let n = checked_numel(&shape)?;
    let outer: usize = x.shape[..axis].iter().product();
    let inner: usize = x.shape[axis + 1..].iter().product();
    let (mut picks, mut indices) = (vec![0usize; n], vec![0i64; n]);
    let mut order: Vec<usize> = (0..dim).collect();
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| (o * dim + j) * inner + i;
            order.sort_by(|&a, &b| {
                let by_value = keys.cmp(at(a), at(b));
                (if largest { by_value.reverse() } else { by_value }).then(a.cmp(&b))
            });
            for (rank, &j) in order[..k].iter().enumerate() {
                let out = (o * k + rank) * inner + i;
                (picks[out], indices[out]) = (at(j), j as i64);
            }
        }
    }
    let values = Tensor { dtype: x.dtype, shape: shape.clone(), data: take(&x.data, &picks) };
    Ok(vec![values, Tensor::from_i64(DType::I64, shape, indices)])
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

/// TopK's `k`: an attribute before opset 10, a one-element input from 10.
fn top_k_count(cx: &Ctx) -> Res<i64> {
    if cx.opset() >= 10 {
        return int_scalar(cx.input(1, "K")?, "K");
    }
    match cx.attrs().int("k")? {
        Some(k) => Ok(k),
        None => bail!("attribute `k` is required before opset 10"),
    }
}

/// What a row normaliser computes along its axis.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Normalizer {
    Softmax,
    LogSoftmax,
    /// 1 at the first maximum, 0 elsewhere.
    Hardmax,
}

/// Softmax, LogSoftmax or Hardmax over `axis` (default -1) from opset 13; before that over the
/// flattened trailing block starting at `axis` (default 1), the input coerced to 2-D there.
/// Computed in f64 with the maximum subtracted.
pub(super) fn normalize(cx: &Ctx, which: Normalizer) -> Res<Vec<Tensor>> {
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
    let mut row = vec![0.0; dim];
    for o in 0..outer {
        for i in 0..inner {
            let at = |k: usize| (o * dim + k) * inner + i;
            row.iter_mut().enumerate().for_each(|(k, p)| *p = v[at(k)]);
            normalize_row(which, &mut row);
            row.iter().enumerate().for_each(|(k, &p)| out[at(k)] = p);
        }
    }
    Ok(vec![float_tensor(x.dtype, x.shape.clone(), out)])
}

fn normalize_row(which: Normalizer, row: &mut [f64]) {
    let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    match which {
        Normalizer::Softmax => {
            let sum: f64 = row.iter().map(|&p| (p - max).exp()).sum();
            row.iter_mut().for_each(|p| *p = (*p - max).exp() / sum);
        }
        Normalizer::LogSoftmax => {
            let log_sum = row.iter().map(|&p| (p - max).exp()).sum::<f64>().ln();
            row.iter_mut().for_each(|p| *p = *p - max - log_sum);
        }
        Normalizer::Hardmax => {
            let first = (0..row.len()).fold(0, |best, k| if row[k] > row[best] { k } else { best });
            row.iter_mut().enumerate().for_each(|(k, p)| *p = (k == first) as u8 as f64);
        }
    }
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
    fn arg_min_picks_the_first_or_last_minimum() {
        let x = i64t(&[2, 3], &[4, 1, 1, 0, 5, 0]);
        assert_eq!(ints(&run1("ArgMin", &[("axis", Attr::Int(-1))], &[&x])), vec![1, 0]);
        let last = [("axis", Attr::Int(1)), ("select_last_index", Attr::Int(1))];
        assert_eq!(ints(&run1("ArgMin", &last, &[&x])), vec![2, 2]);
    }

    #[test]
    fn norms_products_and_log_sums_over_axes_empty_sets_and_no_axes() {
        let x = f32t(&[2, 2], &[1.0, -2.0, 3.0, 4.0]);
        let all = |op: &str| f32s(&run1(op, &[("keepdims", Attr::Int(0))], &[&x]))[0];
        assert_eq!([all("ReduceL1"), all("ReduceSumSquare"), all("ReduceProd")], [10.0, 30.0, -24.0]);
        assert_close(&[all("ReduceL2")], &[30f32.sqrt()], 1e-6);
        // log(e + e^-2) = 1 + log(1 + e^-3); log(e^3 + e^4) = 4 + log(1 + e^-1).
        let rows = run1("ReduceLogSumExp", &[("keepdims", Attr::Int(0))], &[&x, &i64t(&[1], &[1])]);
        assert_close(&f32s(&rows), &[1.048_587_4, 4.313_262], 1e-6);
        let empty = f32t(&[2, 0], &[]);
        let over_empty = |op: &str| f32s(&run1(op, &[("keepdims", Attr::Int(0))], &[&empty, &i64t(&[1], &[1])]));
        assert_eq!(over_empty("ReduceL1"), vec![0.0, 0.0]);
        assert_eq!(over_empty("ReduceProd"), vec![1.0, 1.0]);
        assert_eq!(over_empty("ReduceLogSum"), vec![f32::NEG_INFINITY; 2]);
        // Reducing over no axis still squares each element.
        let noop = run1("ReduceSumSquare", &[("noop_with_empty_axes", Attr::Int(1))], &[&x]);
        assert_eq!(f32s(&noop), vec![1.0, 4.0, 9.0, 16.0]);
        let xi = typed(DType::I32, &[2], &[3, 4]);
        assert_eq!(ints(&run1("ReduceL2", &[("keepdims", Attr::Int(0))], &[&xi])), vec![5]);
        assert_eq!(ints(&run1("ReduceProd", &[("keepdims", Attr::Int(0))], &[&xi])), vec![12]);
    }

    #[test]
    fn top_k_breaks_ties_by_the_lower_index() {
        let x = f32t(&[4], &[3.0, 1.0, 3.0, 2.0]);
        let top = |a: &[(&str, Attr)], k: i64| {
            let y = run("TopK", a, &[Some(&x), Some(&i64t(&[1], &[k]))], 2).unwrap();
            (f32s(&y[0]), ints(&y[1]))
        };
        // The two 3s tie: index 0 before index 2.
        assert_eq!(top(&[], 2), (vec![3.0, 3.0], vec![0, 2]));
        assert_eq!(top(&[("largest", Attr::Int(0))], 3), (vec![1.0, 2.0, 3.0], vec![1, 3, 0]));
        assert_eq!(top(&[], 0), (vec![], vec![]));
        assert!(err_msg(run("TopK", &[], &[Some(&x), Some(&i64t(&[1], &[5]))], 2)).contains("outside 0..=4"));
        // Along axis 0 of a matrix, per column; NaN ranks above every number.
        let m = f32t(&[2, 2], &[1.0, f32::NAN, 2.0, 0.0]);
        let y = run("TopK", &[("axis", Attr::Int(0))], &[Some(&m), Some(&i64t(&[1], &[1]))], 2).unwrap();
        assert_eq!(ints(&y[1]), vec![1, 0]);
        // Before opset 10, k is an attribute.
        let y = run_at("TopK", 1, &[("k", Attr::Int(1))], &[Some(&x)], 2).unwrap();
        assert_eq!((f32s(&y[0]), ints(&y[1])), (vec![3.0], vec![0]));
    }

    #[test]
    fn log_softmax_and_hardmax_coerce_to_2d_before_opset_13() {
        let x = f32t(&[1, 2, 2], &[0.0, 1.0, 2.0, 3.0]);
        // One block of four: log(1 + e + e² + e³) = 3.440_19.
        let y = run_at("LogSoftmax", 11, &[], &[Some(&x)], 1).unwrap();
        assert_close(&f32s(&y[0]), &[-3.440_19, -2.440_19, -1.440_19, -0.440_19], 1e-5);
        // Rows of two: log(1 + e) = 1.313_262.
        let y = run_at("LogSoftmax", 13, &[], &[Some(&x)], 1).unwrap();
        assert_close(&f32s(&y[0]), &[-1.313_262, -0.313_262, -1.313_262, -0.313_262], 1e-6);
        let h = f32t(&[1, 2, 2], &[1.0, 4.0, 4.0, 0.0]);
        // The first maximum of the whole block, or of each row.
        assert_eq!(f32s(&run_at("Hardmax", 11, &[], &[Some(&h)], 1).unwrap()[0]), vec![0.0, 1.0, 0.0, 0.0]);
        assert_eq!(f32s(&run_at("Hardmax", 13, &[], &[Some(&h)], 1).unwrap()[0]), vec![0.0, 1.0, 1.0, 0.0]);
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

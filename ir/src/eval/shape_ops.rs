//! Shape and data-movement ops: Shape, Size, Reshape, Flatten, Transpose, Unsqueeze, Squeeze,
//! Concat, Split, Slice, Gather, GatherElements, GatherND, ScatterND, ScatterElements, Expand,
//! Tile, Range, ConstantOfShape, Constant and Trilu. None of them does arithmetic on float values, so they
//! work on any storage by moving elements.

use super::layout::{
    broadcast_index_map, broadcast_shapes, checked_numel, strided_offsets, strides, take, DataBuilder,
};
use super::{check_storage, float_tensor, int_scalar, int_values, norm_axis, numeric_values, Ctx, Res};
use crate::attr::Attr;
use crate::dtype::DType;
use crate::tensor::{numel, Data, Tensor};

fn i64_tensor(shape: Vec<usize>, values: Vec<i64>) -> Tensor {
    Tensor::from_i64(DType::I64, shape, values)
}

/// The same elements under a new shape (element counts must already agree).
fn reshaped(t: &Tensor, shape: Vec<usize>) -> Tensor {
    Tensor { dtype: t.dtype, shape, data: t.data.clone() }
}

fn product(dims: &[usize]) -> usize {
    dims.iter().product()
}

/// Resolves a possibly negative index against a dimension of size `dim`.
fn resolve_index(i: i64, dim: usize, what: &str) -> Res<usize> {
    let d = dim as i64;
    if i < -d || i >= d {
        bail!("{what} {i} is out of range for a dimension of size {dim}");
    }
    Ok(if i < 0 { (i + d) as usize } else { i as usize })
}

/// Reads a list of non-negative dimensions from an integer tensor.
fn dims_from(t: &Tensor, what: &str) -> Res<Vec<usize>> {
    int_values(t, what)?
        .iter()
        .map(|&d| if d < 0 { bail!("{what} has negative dimension {d}") } else { Ok(d as usize) })
        .collect()
}

/// Shape, optionally sliced by `start`/`end` (clamped like Slice).
pub(super) fn shape(cx: &Ctx) -> Res<Vec<Tensor>> {
    let x = cx.input(0, "data")?;
    let rank = x.rank() as i64;
    let clamp_axis = |a: i64| (if a < 0 { a + rank } else { a }).clamp(0, rank) as usize;
    let start = clamp_axis(cx.attrs().int_or("start", 0)?);
    let end = clamp_axis(cx.attrs().int_or("end", rank)?);
    let dims: Vec<i64> = if start < end { x.shape[start..end].iter().map(|&d| d as i64).collect() } else { vec![] };
    Ok(vec![i64_tensor(vec![dims.len()], dims)])
}

pub(super) fn size(cx: &Ctx) -> Res<Vec<Tensor>> {
    let x = cx.input(0, "data")?;
    Ok(vec![i64_tensor(vec![], vec![x.numel() as i64])])
}

/// Reshape: 0 copies the input dimension (unless `allowzero`), one -1 is inferred.
pub(super) fn reshape(cx: &Ctx) -> Res<Vec<Tensor>> {
    let x = cx.input(0, "data")?;
    let spec = int_values(cx.input(1, "shape")?, "shape")?;
    let allow_zero = cx.opset() >= 14 && cx.attrs().int_or("allowzero", 0)? != 0;
    let mut out = Vec::with_capacity(spec.len());
    let mut inferred = None;
    for (i, &d) in spec.iter().enumerate() {
        match d {
            -1 => {
                if inferred.replace(i).is_some() {
                    bail!("shape {spec:?} has more than one -1");
                }
                out.push(1);
            }
            0 if !allow_zero => match x.shape.get(i) {
                Some(&n) => out.push(n),
                None => bail!("shape {spec:?} copies dimension {i} but the input has rank {}", x.rank()),
            },
            d if d < 0 => bail!("shape {spec:?} has invalid dimension {d}"),
            d => out.push(d as usize),
        }
    }
    if allow_zero && inferred.is_some() && spec.contains(&0) {
        bail!("shape {spec:?} has both 0 and -1 with allowzero=1");
    }
    let Some(known) = numel(&out) else {
        bail!("shape {spec:?} overflows");
    };
    if let Some(i) = inferred {
        if known == 0 || x.numel() % known != 0 {
            bail!("cannot infer -1 in {spec:?} for {} elements of shape {:?}", x.numel(), x.shape);
        }
        out[i] = x.numel() / known;
    }
    if numel(&out) != Some(x.numel()) {
        bail!("cannot reshape {:?} ({} elements) to {spec:?}", x.shape, x.numel());
    }
    Ok(vec![reshaped(x, out)])
}

pub(super) fn flatten(cx: &Ctx) -> Res<Vec<Tensor>> {
    let x = cx.input(0, "input")?;
    let rank = x.rank() as i64;
    let axis = cx.attrs().int_or("axis", 1)?;
    if axis < -rank || axis > rank {
        bail!("axis {axis} is out of range for rank {rank}");
    }
    let axis = if axis < 0 { axis + rank } else { axis } as usize;
    Ok(vec![reshaped(x, vec![product(&x.shape[..axis]), product(&x.shape[axis..])])])
}

pub(super) fn transpose(cx: &Ctx) -> Res<Vec<Tensor>> {
    let x = cx.input(0, "data")?;
    let rank = x.rank();
    let perm: Vec<usize> = match cx.attrs().ints("perm")? {
        Some(p) => p.iter().map(|&a| norm_axis(a, rank, "perm entry")).collect::<Res<_>>()?,
        None => (0..rank).rev().collect(),
    };
    let mut seen = vec![false; rank];
    if perm.len() != rank || perm.iter().any(|&a| std::mem::replace(&mut seen[a], true)) {
        bail!("perm {perm:?} is not a permutation of the {rank} axes");
    }
    let src = strides(&x.shape);
    let shape: Vec<usize> = perm.iter().map(|&a| x.shape[a]).collect();
    let steps: Vec<isize> = perm.iter().map(|&a| src[a] as isize).collect();
    let data = take(&x.data, &strided_offsets(&shape, &steps, 0));
    Ok(vec![Tensor { dtype: x.dtype, shape, data }])
}

/// Axes from input 1 (opset 13+) or the `axes` attribute (earlier opsets).
fn axes_list(cx: &Ctx) -> Res<Option<Vec<i64>>> {
    if let Some(t) = cx.opt(1) {
        return Ok(Some(int_values(t, "axes")?.to_vec()));
    }
    Ok(cx.attrs().ints("axes")?.map(<[i64]>::to_vec))
}

/// Normalises axes against `rank`, sorted, refusing duplicates.
fn unique_axes(axes: &[i64], rank: usize) -> Res<Vec<usize>> {
    let mut out: Vec<usize> = axes.iter().map(|&a| norm_axis(a, rank, "axis")).collect::<Res<_>>()?;
    out.sort_unstable();
    if out.windows(2).any(|w| w[0] == w[1]) {
        bail!("axes {axes:?} repeat an axis");
    }
    Ok(out)
}

pub(super) fn unsqueeze(cx: &Ctx) -> Res<Vec<Tensor>> {
    let x = cx.input(0, "data")?;
    let Some(axes) = axes_list(cx)? else {
        bail!("axes are required");
    };
    let out_rank = x.rank() + axes.len();
    let axes = unique_axes(&axes, out_rank)?;
    let mut src = x.shape.iter();
    let shape =
        (0..out_rank).map(|d| if axes.binary_search(&d).is_ok() { 1 } else { src.next().copied().unwrap_or(1) });
    Ok(vec![reshaped(x, shape.collect())])
}

pub(super) fn squeeze(cx: &Ctx) -> Res<Vec<Tensor>> {
    let x = cx.input(0, "data")?;
    let shape = match axes_list(cx)? {
        None => x.shape.iter().copied().filter(|&d| d != 1).collect(),
        Some(axes) => {
            let axes = unique_axes(&axes, x.rank())?;
            if let Some(&a) = axes.iter().find(|&&a| x.shape[a] != 1) {
                bail!("cannot squeeze axis {a} of size {} (shape {:?})", x.shape[a], x.shape);
            }
            x.shape.iter().enumerate().filter(|(d, _)| axes.binary_search(d).is_err()).map(|(_, &n)| n).collect()
        }
    };
    Ok(vec![reshaped(x, shape)])
}

pub(super) fn concat(cx: &Ctx) -> Res<Vec<Tensor>> {
    let parts: Vec<&Tensor> = cx.present_inputs().collect();
    let Some(first) = parts.first() else {
        bail!("needs at least one input");
    };
    let Some(axis) = cx.attrs().int("axis")? else {
        bail!("attribute axis is required");
    };
    if first.rank() == 0 {
        bail!("cannot concatenate scalars");
    }
    let axis = norm_axis(axis, first.rank(), "axis")?;
    let mut shape = first.shape.clone();
    shape[axis] = 0;
    for t in &parts {
        let same_other_dims = t.rank() == first.rank()
            && t.shape.iter().zip(&first.shape).enumerate().all(|(d, (a, b))| d == axis || a == b);
        if t.dtype != first.dtype || !same_other_dims {
            bail!("cannot concatenate {} {:?} with {} {:?} on axis {axis}", t.dtype, t.shape, first.dtype, first.shape);
        }
        shape[axis] += t.shape[axis];
    }
    let n = checked_numel(&shape)?;
    let outer = product(&first.shape[..axis]);
    let inner = product(&first.shape[axis + 1..]);
    let mut out = DataBuilder::like(&first.data, n);
    for o in 0..outer {
        for t in &parts {
            let chunk = t.shape[axis] * inner;
            out.extend(&t.data, o * chunk, chunk)?;
        }
    }
    Ok(vec![Tensor { dtype: first.dtype, shape, data: out.finish() }])
}

/// Split by the `split` input (or attribute before opset 13), else into `num_outputs` parts
/// (the attribute from opset 18, chunks of ceil(dim/n) with a smaller last one), else into as many
/// equal parts as the node has outputs.
pub(super) fn split(cx: &Ctx) -> Res<Vec<Tensor>> {
    let x = cx.input(0, "input")?;
    if x.rank() == 0 {
        bail!("cannot split a scalar");
    }
    let axis = norm_axis(cx.attrs().int_or("axis", 0)?, x.rank(), "axis")?;
    let dim = x.shape[axis];
    let n = cx.num_outputs;
    let explicit = match cx.opt(1) {
        Some(t) => Some(int_values(t, "split")?.to_vec()),
        None => cx.attrs().ints("split")?.map(<[i64]>::to_vec),
    };
    let sizes: Vec<usize> = if let Some(split) = explicit {
        if split.iter().any(|&s| s < 0)
            || split.iter().map(|&s| s as i128).sum::<i128>() != dim as i128
            || split.len() != n
        {
            bail!("split {split:?} does not divide dimension {dim} into {n} outputs");
        }
        split.iter().map(|&s| s as usize).collect()
    } else if let Some(k) = cx.attrs().int("num_outputs")? {
        if k != n as i64 {
            bail!("num_outputs={k} but the node has {n} outputs");
        }
        let chunk = dim.div_ceil(n.max(1));
        (0..n).map(|i| chunk.min(dim.saturating_sub(i * chunk))).collect()
    } else {
        if n == 0 || dim % n != 0 {
            bail!("dimension {dim} does not split evenly into {n} outputs");
        }
        vec![dim / n; n]
    };
    let outer = product(&x.shape[..axis]);
    let inner = product(&x.shape[axis + 1..]);
    let mut offset = 0;
    let mut outputs = Vec::with_capacity(n);
    for &s in &sizes {
        let mut shape = x.shape.clone();
        shape[axis] = s;
        let mut out = DataBuilder::like(&x.data, outer * s * inner);
        for o in 0..outer {
            out.extend(&x.data, (o * dim + offset) * inner, s * inner)?;
        }
        offset += s;
        outputs.push(Tensor { dtype: x.dtype, shape, data: out.finish() });
    }
    Ok(outputs)
}

/// Slice with the ONNX clamping rules: negative starts/ends count from the end, then starts clamp
/// to [0, dim] ([0, dim-1] for negative steps) and ends to [0, dim] ([-1, dim-1]), so INT64_MAX
/// and INT64_MIN mean "to the end" in either direction.
pub(super) fn slice(cx: &Ctx) -> Res<Vec<Tensor>> {
    let x = cx.input(0, "data")?;
    let starts = int_values(cx.input(1, "starts")?, "starts")?;
    let ends = int_values(cx.input(2, "ends")?, "ends")?;
    let rank = x.rank();
    let axes: Vec<i64> = match cx.opt(3) {
        Some(t) => int_values(t, "axes")?.to_vec(),
        None => (0..starts.len() as i64).collect(),
    };
    let steps: Vec<i64> = match cx.opt(4) {
        Some(t) => int_values(t, "steps")?.to_vec(),
        None => vec![1; starts.len()],
    };
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        bail!(
            "starts, ends, axes and steps have lengths {}, {}, {}, {}",
            starts.len(),
            ends.len(),
            axes.len(),
            steps.len()
        );
    }
    let axes: Vec<usize> = axes.iter().map(|&a| norm_axis(a, rank, "axis")).collect::<Res<_>>()?;
    let mut seen = vec![false; rank];
    if axes.iter().any(|&a| std::mem::replace(&mut seen[a], true)) {
        bail!("axes {axes:?} repeat an axis");
    }
    let src = strides(&x.shape);
    let mut shape = x.shape.clone();
    let mut steps_out: Vec<isize> = src.iter().map(|&s| s as isize).collect();
    let mut base = 0isize;
    for (i, &axis) in axes.iter().enumerate() {
        let dim = x.shape[axis] as i64;
        let step = steps[i];
        if step == 0 {
            bail!("step for axis {axis} is 0");
        }
        let from_end = |v: i64| if v < 0 { v.saturating_add(dim) } else { v };
        let (start, end) = (from_end(starts[i]), from_end(ends[i]));
        let (start, count) = if dim == 0 {
            (0, 0)
        } else if step > 0 {
            let (s, e) = (start.clamp(0, dim), end.clamp(0, dim));
            (s, if e > s { ((e - s) as u64).div_ceil(step as u64) } else { 0 })
        } else {
            let (s, e) = (start.clamp(0, dim - 1), end.clamp(-1, dim - 1));
            (s, if s > e { ((s - e) as u64).div_ceil(step.unsigned_abs()) } else { 0 })
        };
        shape[axis] = count as usize;
        base += start as isize * src[axis] as isize;
        steps_out[axis] = src[axis] as isize * step as isize;
    }
    let data = take(&x.data, &strided_offsets(&shape, &steps_out, base));
    Ok(vec![Tensor { dtype: x.dtype, shape, data }])
}

pub(super) fn gather(cx: &Ctx) -> Res<Vec<Tensor>> {
    let (data, idx) = (cx.input(0, "data")?, cx.input(1, "indices")?);
    let indices = int_values(idx, "indices")?;
    if data.rank() == 0 {
        bail!("cannot gather from a scalar");
    }
    let axis = norm_axis(cx.attrs().int_or("axis", 0)?, data.rank(), "axis")?;
    let dim = data.shape[axis];
    let resolved: Vec<usize> = indices.iter().map(|&i| resolve_index(i, dim, "index")).collect::<Res<_>>()?;
    let shape: Vec<usize> =
        data.shape[..axis].iter().chain(&idx.shape).chain(&data.shape[axis + 1..]).copied().collect();
    let n = checked_numel(&shape)?;
    let outer = product(&data.shape[..axis]);
    let inner = product(&data.shape[axis + 1..]);
    let mut out = DataBuilder::like(&data.data, n);
    for o in 0..outer {
        for &i in &resolved {
            out.extend(&data.data, (o * dim + i) * inner, inner)?;
        }
    }
    Ok(vec![Tensor { dtype: data.dtype, shape, data: out.finish() }])
}

pub(super) fn gather_elements(cx: &Ctx) -> Res<Vec<Tensor>> {
    let (data, idx) = (cx.input(0, "data")?, cx.input(1, "indices")?);
    let indices = int_values(idx, "indices")?;
    let rank = data.rank();
    if rank == 0 || idx.rank() != rank {
        bail!("data {:?} and indices {:?} must have the same non-zero rank", data.shape, idx.shape);
    }
    let axis = norm_axis(cx.attrs().int_or("axis", 0)?, rank, "axis")?;
    if (0..rank).any(|d| d != axis && idx.shape[d] > data.shape[d]) {
        bail!("indices {:?} exceed data {:?} off the gather axis", idx.shape, data.shape);
    }
    let src = strides(&data.shape);
    let mut steps: Vec<isize> = src.iter().map(|&s| s as isize).collect();
    steps[axis] = 0;
    let bases = strided_offsets(&idx.shape, &steps, 0);
    let offsets: Vec<usize> = bases
        .iter()
        .zip(indices)
        .map(|(&b, &i)| Ok(b + resolve_index(i, data.shape[axis], "index")? * src[axis]))
        .collect::<Res<_>>()?;
    Ok(vec![Tensor { dtype: data.dtype, shape: idx.shape.clone(), data: take(&data.data, &offsets) }])
}

pub(super) fn gather_nd(cx: &Ctx) -> Res<Vec<Tensor>> {
    let (data, idx) = (cx.input(0, "data")?, cx.input(1, "indices")?);
    let indices = int_values(idx, "indices")?;
    let (r, q) = (data.rank(), idx.rank());
    let b = cx.attrs().int_or("batch_dims", 0)?;
    if b < 0 || b as usize >= r.min(q) {
        bail!("batch_dims {b} must be below the ranks of data ({r}) and indices ({q})");
    }
    let b = b as usize;
    let m = idx.shape[q - 1];
    if data.shape[..b] != idx.shape[..b] || m > r - b {
        bail!("indices {:?} do not index data {:?} with batch_dims {b}", idx.shape, data.shape);
    }
    let shape: Vec<usize> = idx.shape[..q - 1].iter().chain(&data.shape[b + m..]).copied().collect();
    let n = checked_numel(&shape)?;
    let batches = product(&data.shape[..b]);
    let tuples = product(&idx.shape[b..q - 1]);
    let slice_len = product(&data.shape[b + m..]);
    let batch_len = product(&data.shape[b..]);
    let src = strides(&data.shape);
    let mut out = DataBuilder::like(&data.data, n);
    for batch in 0..batches {
        for t in 0..tuples {
            let tuple = &indices[(batch * tuples + t) * m..][..m];
            let mut offset = batch * batch_len;
            for (k, &i) in tuple.iter().enumerate() {
                offset += resolve_index(i, data.shape[b + k], "index")? * src[b + k];
            }
            out.extend(&data.data, offset, slice_len)?;
        }
    }
    Ok(vec![Tensor { dtype: data.dtype, shape, data: out.finish() }])
}

/// ScatterND with reduction none/add/mul/max/min; with "none" and repeated indices the last
/// update in row-major order wins.
pub(super) fn scatter_nd(cx: &Ctx) -> Res<Vec<Tensor>> {
    let (data, idx, updates) = (cx.input(0, "data")?, cx.input(1, "indices")?, cx.input(2, "updates")?);
    let indices = int_values(idx, "indices")?;
    let reduction = scatter_reduction(cx)?;
    let (r, q) = (data.rank(), idx.rank());
    if r == 0 || q == 0 {
        bail!("data and indices must have rank at least 1");
    }
    let m = idx.shape[q - 1];
    let expected: Vec<usize> = idx.shape[..q - 1].iter().chain(data.shape.get(m..).unwrap_or(&[])).copied().collect();
    if m > r || updates.shape != expected || updates.dtype != data.dtype {
        bail!(
            "updates {} {:?} do not fit data {} {:?} and indices {:?}",
            updates.dtype,
            updates.shape,
            data.dtype,
            data.shape,
            idx.shape
        );
    }
    let slice_len = product(&data.shape[m..]);
    let src = strides(&data.shape);
    let mut out = data.data.clone();
    for t in 0..product(&idx.shape[..q - 1]) {
        let mut offset = 0;
        for (k, &i) in indices[t * m..][..m].iter().enumerate() {
            offset += resolve_index(i, data.shape[k], "index")? * src[k];
        }
        let at = offset..offset + slice_len;
        let from = t * slice_len..(t + 1) * slice_len;
        match (&mut out, &updates.data) {
            (Data::F32(o), Data::F32(u)) => combine(&mut o[at], &u[from], float_reduction(reduction)?),
            (Data::F64(o), Data::F64(u)) => combine(&mut o[at], &u[from], float_reduction(reduction)?),
            (Data::I64(o), Data::I64(u)) => combine(&mut o[at], &u[from], int_reduction(reduction)?),
            (Data::Str(o), Data::Str(u)) if reduction == "none" => o[at].clone_from_slice(&u[from]),
            _ => bail!("reduction {reduction} is not defined for {} tensors", data.dtype),
        }
    }
    Ok(vec![rounded_to(data, out)])
}

/// ScatterElements: `out = data` with `out[idx with idx[axis] = indices[idx]] = updates[idx]`
/// (or combined with `reduction` add/mul, max/min); with "none" and repeated indices the last
/// update in row-major order wins.
pub(super) fn scatter_elements(cx: &Ctx) -> Res<Vec<Tensor>> {
    let (data, idx, updates) = (cx.input(0, "data")?, cx.input(1, "indices")?, cx.input(2, "updates")?);
    let indices = int_values(idx, "indices")?;
    let reduction = scatter_reduction(cx)?;
    let rank = data.rank();
    if rank == 0 || idx.rank() != rank || updates.shape != idx.shape || updates.dtype != data.dtype {
        bail!(
            "data {} {:?}, indices {:?} and updates {} {:?} must have one rank, indices and updates one shape",
            data.dtype,
            data.shape,
            idx.shape,
            updates.dtype,
            updates.shape
        );
    }
    let axis = norm_axis(cx.attrs().int_or("axis", 0)?, rank, "axis")?;
    if (0..rank).any(|d| d != axis && idx.shape[d] > data.shape[d]) {
        bail!("indices {:?} exceed data {:?} off the scatter axis", idx.shape, data.shape);
    }
    let src = strides(&data.shape);
    let mut steps: Vec<isize> = src.iter().map(|&s| s as isize).collect();
    steps[axis] = 0;
    let bases = strided_offsets(&idx.shape, &steps, 0);
    let mut out = data.data.clone();
    for (u, (&b, &i)) in bases.iter().zip(indices).enumerate() {
        let at = b + resolve_index(i, data.shape[axis], "index")? * src[axis];
        match (&mut out, &updates.data) {
            (Data::F32(o), Data::F32(v)) => combine(&mut o[at..=at], &v[u..=u], float_reduction(reduction)?),
            (Data::F64(o), Data::F64(v)) => combine(&mut o[at..=at], &v[u..=u], float_reduction(reduction)?),
            (Data::I64(o), Data::I64(v)) => combine(&mut o[at..=at], &v[u..=u], int_reduction(reduction)?),
            (Data::Str(o), Data::Str(v)) if reduction == "none" => o[at] = v[u].clone(),
            _ => bail!("reduction {reduction} is not defined for {} tensors", data.dtype),
        }
    }
    Ok(vec![rounded_to(data, out)])
}

/// The `reduction` attribute of a scatter op, refused before the opset that defines its value
/// (16 for add and mul, 18 for max and min).
fn scatter_reduction<'a>(cx: &Ctx<'a>) -> Res<&'a str> {
    let reduction = cx.attrs().str("reduction")?.unwrap_or("none");
    let since = match reduction {
        "none" => 1,
        "add" | "mul" => 16,
        "max" | "min" => 18,
        other => bail!("unknown reduction {other}"),
    };
    if cx.opset() < since {
        bail!("reduction {reduction} needs opset {since}, the model imports {}", cx.opset());
    }
    Ok(reduction)
}

/// A scatter result in `data`'s dtype: sums and products of f16/bf16 values rounded back to the
/// dtype, integers wrapped.
fn rounded_to(data: &Tensor, out: Data) -> Tensor {
    match out {
        Data::F32(v) => Tensor::from_f32(data.dtype, data.shape.clone(), v),
        Data::I64(v) => Tensor::from_i64(data.dtype, data.shape.clone(), v),
        other => Tensor { dtype: data.dtype, shape: data.shape.clone(), data: other },
    }
}

fn combine<T: Copy>(out: &mut [T], updates: &[T], f: fn(T, T) -> T) {
    for (o, &u) in out.iter_mut().zip(updates) {
        *o = f(*o, u);
    }
}

fn float_reduction<T: num_like::Float>(reduction: &str) -> Res<fn(T, T) -> T> {
    Ok(match reduction {
        "none" => |_, u| u,
        "add" => |o, u| o + u,
        "mul" => |o, u| o * u,
        "max" => |o: T, u: T| if u > o || u.is_nan() { u } else { o },
        "min" => |o: T, u: T| if u < o || u.is_nan() { u } else { o },
        _ => bail!("unknown reduction {reduction}"),
    })
}

fn int_reduction(reduction: &str) -> Res<fn(i64, i64) -> i64> {
    Ok(match reduction {
        "none" => |_, u| u,
        "add" => i64::wrapping_add,
        "mul" => i64::wrapping_mul,
        "max" => std::cmp::max,
        "min" => std::cmp::min,
        _ => bail!("unknown reduction {reduction}"),
    })
}

/// The little float abstraction ScatterND's reductions need.
mod num_like {
    pub(crate) trait Float:
        Copy + PartialOrd + std::ops::Add<Output = Self> + std::ops::Mul<Output = Self>
    {
        fn is_nan(self) -> bool;
    }

    impl Float for f32 {
        fn is_nan(self) -> bool {
            f32::is_nan(self)
        }
    }

    impl Float for f64 {
        fn is_nan(self) -> bool {
            f64::is_nan(self)
        }
    }
}

/// Expand: bidirectional broadcast of the input with the given shape.
pub(super) fn expand(cx: &Ctx) -> Res<Vec<Tensor>> {
    let x = cx.input(0, "input")?;
    let target = dims_from(cx.input(1, "shape")?, "shape")?;
    let shape = broadcast_shapes(&[&x.shape, &target])?;
    let data = take(&x.data, &broadcast_index_map(&x.shape, &shape));
    Ok(vec![Tensor { dtype: x.dtype, shape, data }])
}

pub(super) fn tile(cx: &Ctx) -> Res<Vec<Tensor>> {
    let x = cx.input(0, "input")?;
    let repeats = dims_from(cx.input(1, "repeats")?, "repeats")?;
    if repeats.len() != x.rank() {
        bail!("{} repeats for an input of rank {}", repeats.len(), x.rank());
    }
    let shape: Vec<usize> = x.shape.iter().zip(&repeats).map(|(&d, &r)| d.saturating_mul(r)).collect();
    checked_numel(&shape)?;
    // Output coordinate o = t*d + k over (t, k) in [r] x [d]: walk the (repeat, dim) pairs with a
    // zero stride for the repeat.
    let src = strides(&x.shape);
    let pair_shape: Vec<usize> = repeats.iter().zip(&x.shape).flat_map(|(&r, &d)| [r, d]).collect();
    let pair_steps: Vec<isize> = src.iter().flat_map(|&s| [0, s as isize]).collect();
    let data = take(&x.data, &strided_offsets(&pair_shape, &pair_steps, 0));
    Ok(vec![Tensor { dtype: x.dtype, shape, data }])
}

/// Range(start, limit, delta): `max(ceil((limit - start) / delta), 0)` elements
/// `start + i * delta`; floats are computed in f64 and rounded once.
pub(super) fn range(cx: &Ctx) -> Res<Vec<Tensor>> {
    let (start, limit, delta) = (cx.input(0, "start")?, cx.input(1, "limit")?, cx.input(2, "delta")?);
    if start.dtype != limit.dtype || start.dtype != delta.dtype || [start, limit, delta].iter().any(|t| t.numel() != 1)
    {
        bail!("start, limit and delta must be single values of one dtype");
    }
    let dtype = start.dtype;
    if dtype.is_float() {
        let [s, l, d] = [start, limit, delta].map(|t| numeric_values(t, "range bound").map(|v| v[0]));
        let (s, l, d) = (s?, l?, d?);
        let count = ((l - s) / d).ceil().max(0.0);
        if d == 0.0 || !count.is_finite() || count > super::layout::MAX_ELEMENTS as f64 {
            bail!("range({s}, {l}, {d}) has no valid element count");
        }
        let n = count as usize;
        return Ok(vec![float_tensor(dtype, vec![n], (0..n).map(|i| s + i as f64 * d).collect())]);
    }
    if !dtype.is_int() {
        bail!("Range is not defined for {dtype}");
    }
    let [s, l, d] = [start, limit, delta].map(|t| int_scalar(t, "range bound").map(i128::from));
    let (s, l, d) = (s?, l?, d?);
    if d == 0 {
        bail!("range delta is 0");
    }
    let span = l - s;
    // Ceiling division for either sign of delta.
    let count = (span / d + i128::from(span % d != 0 && (span < 0) == (d < 0))).max(0);
    if count > super::layout::MAX_ELEMENTS as i128 {
        bail!("range({s}, {l}, {d}) has {count} elements, over the limit");
    }
    let values = (0..count).map(|i| (s + i * d) as i64).collect();
    Ok(vec![Tensor::from_i64(dtype, vec![count as usize], values)])
}

pub(super) fn constant_of_shape(cx: &Ctx) -> Res<Vec<Tensor>> {
    let shape = dims_from(cx.input(0, "input")?, "shape")?;
    let n = checked_numel(&shape)?;
    let default = Tensor::scalar_f32(0.0);
    let value = cx.attrs().tensor("value")?.unwrap_or(&default);
    check_storage(value)?;
    if value.numel() != 1 {
        bail!("value must hold one element, got shape {:?}", value.shape);
    }
    let data = match &value.data {
        Data::F32(v) => Data::F32(vec![v[0]; n]),
        Data::F64(v) => Data::F64(vec![v[0]; n]),
        Data::I64(v) => Data::I64(vec![v[0]; n]),
        Data::Str(v) => Data::Str(vec![v[0].clone(); n]),
    };
    Ok(vec![Tensor { dtype: value.dtype, shape, data }])
}

pub(super) fn constant(cx: &Ctx) -> Res<Vec<Tensor>> {
    let attrs = &cx.attrs().0;
    let known = ["value", "value_float", "value_floats", "value_int", "value_ints", "value_string", "value_strings"];
    let given: Vec<&String> = attrs.keys().filter(|k| known.contains(&k.as_str()) || *k == "sparse_value").collect();
    let [name] = given.as_slice() else {
        bail!("exactly one value attribute is required, got {given:?}");
    };
    let strings = |v: &[String]| Data::Str(v.iter().map(|s| s.as_bytes().to_vec()).collect());
    let t = match (name.as_str(), &attrs[*name]) {
        ("value", Attr::Tensor(t)) => {
            check_storage(t)?;
            t.clone()
        }
        ("value_float", Attr::Float(v)) => Tensor::scalar_f32(*v),
        ("value_floats", Attr::Floats(v)) => Tensor::from_f32(DType::F32, vec![v.len()], v.clone()),
        ("value_int", Attr::Int(v)) => Tensor::scalar_i64(*v),
        ("value_ints", Attr::Ints(v)) => i64_tensor(vec![v.len()], v.clone()),
        ("value_string", Attr::Str(s)) => {
            Tensor { dtype: DType::Str, shape: vec![], data: strings(std::slice::from_ref(s)) }
        }
        ("value_strings", Attr::Strs(v)) => Tensor { dtype: DType::Str, shape: vec![v.len()], data: strings(v) },
        ("sparse_value", _) => bail!("sparse constants are not supported"),
        (name, _) => bail!("attribute {name} has the wrong kind"),
    };
    Ok(vec![t])
}

/// Trilu: keeps elements with `j - i >= k` (upper) or `j - i <= k` (lower) in the last two dims.
pub(super) fn trilu(cx: &Ctx) -> Res<Vec<Tensor>> {
    let x = cx.input(0, "input")?;
    let k = match cx.opt(1) {
        Some(t) => int_scalar(t, "k")?,
        None => 0,
    };
    let upper = cx.attrs().int_or("upper", 1)? != 0;
    let rank = x.rank();
    if rank < 2 {
        bail!("input must have rank at least 2, got {:?}", x.shape);
    }
    let (rows, cols) = (x.shape[rank - 2], x.shape[rank - 1]);
    let keep = |e: usize| {
        let (i, j) = (((e / cols) % rows) as i64, (e % cols) as i64);
        if upper {
            j - i >= k
        } else {
            j - i <= k
        }
    };
    let data = match &x.data {
        Data::F32(v) => Data::F32(v.iter().enumerate().map(|(e, &p)| if keep(e) { p } else { 0.0 }).collect()),
        Data::F64(v) => Data::F64(v.iter().enumerate().map(|(e, &p)| if keep(e) { p } else { 0.0 }).collect()),
        Data::I64(v) => Data::I64(v.iter().enumerate().map(|(e, &p)| if keep(e) { p } else { 0 }).collect()),
        Data::Str(_) => bail!("Trilu does not take string tensors"),
    };
    Ok(vec![Tensor { dtype: x.dtype, shape: x.shape.clone(), data }])
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use crate::attr::Attr;
    use crate::dtype::DType;
    use crate::tensor::{Data, Tensor};

    fn iota(shape: &[usize]) -> Tensor {
        let n: usize = shape.iter().product();
        f32t(shape, &(0..n).map(|i| i as f32).collect::<Vec<_>>())
    }

    #[test]
    fn reshape_copies_zeros_and_infers_minus_one() {
        let x = iota(&[2, 3, 4]);
        assert_eq!(run1("Reshape", &[], &[&x, &i64t(&[2], &[0, -1])]).shape, vec![2, 12]);
        assert_eq!(run1("Reshape", &[], &[&x, &i64t(&[3], &[-1, 0, 2])]).shape, vec![4, 3, 2]);
        let empty = iota(&[0, 3]);
        let y = run1("Reshape", &[("allowzero", Attr::Int(1))], &[&empty, &i64t(&[2], &[3, 0])]);
        assert_eq!(y.shape, vec![3, 0]);
        assert!(err_msg(run("Reshape", &[], &[Some(&x), Some(&i64t(&[2], &[-1, -1]))], 1)).contains("more than one -1"));
        assert!(err_msg(run("Reshape", &[], &[Some(&x), Some(&i64t(&[2], &[5, -1]))], 1)).contains("cannot infer"));
        let e = err_msg(run("Reshape", &[("allowzero", Attr::Int(1))], &[Some(&x), Some(&i64t(&[2], &[0, 24]))], 1));
        assert!(e.contains("cannot reshape"), "{e}");
    }

    #[test]
    fn slice_clamps_and_handles_negative_steps() {
        let x = iota(&[10]);
        let slice = |starts: &[i64], ends: &[i64], steps: &[i64]| {
            let (s, e, st) = (i64t(&[starts.len()], starts), i64t(&[ends.len()], ends), i64t(&[steps.len()], steps));
            let axes = i64t(&[1], &[0]);
            f32s(&run1("Slice", &[], &[&x, &s, &e, &axes, &st]))
        };
        assert_eq!(slice(&[-3], &[i64::MAX], &[1]), vec![7.0, 8.0, 9.0]);
        assert_eq!(slice(&[i64::MAX], &[i64::MIN], &[-1]), (0..10).rev().map(|i| i as f32).collect::<Vec<_>>());
        assert_eq!(slice(&[8], &[1], &[-3]), vec![8.0, 5.0, 2.0]);
        assert_eq!(slice(&[-100], &[2], &[1]), vec![0.0, 1.0]);
        assert!(slice(&[5], &[2], &[1]).is_empty());
        // The two examples of the ONNX specification.
        let m = f32t(&[2, 4], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
        let y = run1(
            "Slice",
            &[],
            &[&m, &i64t(&[2], &[1, 0]), &i64t(&[2], &[2, 3]), &i64t(&[2], &[0, 1]), &i64t(&[2], &[1, 2])],
        );
        assert_eq!((y.shape.clone(), f32s(&y)), (vec![1, 2], vec![5.0, 7.0]));
        let y = run1("Slice", &[], &[&m, &i64t(&[2], &[0, 1]), &i64t(&[2], &[-1, 1000])]);
        assert_eq!((y.shape.clone(), f32s(&y)), (vec![1, 3], vec![2.0, 3.0, 4.0]));
        let zero_step = run(
            "Slice",
            &[],
            &[Some(&x), Some(&i64t(&[1], &[0])), Some(&i64t(&[1], &[5])), None, Some(&i64t(&[1], &[0]))],
            1,
        );
        assert!(err_msg(zero_step).contains("step"));
    }

    #[test]
    fn gather_takes_negative_indices_and_refuses_out_of_range() {
        let data = f32t(&[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let y = run1("Gather", &[], &[&data, &i64t(&[1, 2], &[0, -1])]);
        assert_eq!((y.shape.clone(), f32s(&y)), (vec![1, 2, 2], vec![1.0, 2.0, 5.0, 6.0]));
        let y = run1("Gather", &[("axis", Attr::Int(1))], &[&data, &typed(DType::I32, &[1], &[-1])]);
        assert_eq!((y.shape.clone(), f32s(&y)), (vec![3, 1], vec![2.0, 4.0, 6.0]));
        let y = run1("Gather", &[], &[&data, &i64t(&[], &[1])]);
        assert_eq!((y.shape.clone(), f32s(&y)), (vec![2], vec![3.0, 4.0]));
        assert!(err_msg(run("Gather", &[], &[Some(&data), Some(&i64t(&[1], &[3]))], 1)).contains("out of range"));
    }

    #[test]
    fn split_by_sizes_by_num_outputs_and_evenly() {
        let x = iota(&[5]);
        let parts = run("Split", &[], &[Some(&x), Some(&i64t(&[2], &[2, 3]))], 2).unwrap();
        assert_eq!((f32s(&parts[0]), f32s(&parts[1])), (vec![0.0, 1.0], vec![2.0, 3.0, 4.0]));
        let parts = run_at("Split", 18, &[("num_outputs", Attr::Int(3))], &[Some(&x)], 3).unwrap();
        assert_eq!(parts.iter().map(|p| p.shape[0]).collect::<Vec<_>>(), vec![2, 2, 1]);
        let parts = run_at("Split", 13, &[], &[Some(&iota(&[4]))], 2).unwrap();
        assert_eq!(f32s(&parts[1]), vec![2.0, 3.0]);
        assert!(err_msg(run_at("Split", 13, &[], &[Some(&x)], 2)).contains("evenly"));
        let m = iota(&[2, 3]);
        let parts =
            run_at("Split", 11, &[("axis", Attr::Int(1)), ("split", Attr::Ints(vec![1, 2]))], &[Some(&m)], 2).unwrap();
        assert_eq!((f32s(&parts[0]), f32s(&parts[1])), (vec![0.0, 3.0], vec![1.0, 2.0, 4.0, 5.0]));
    }

    #[test]
    fn squeeze_and_unsqueeze_take_negative_axes() {
        let x = iota(&[1, 3, 1]);
        assert_eq!(run1("Squeeze", &[], &[&x, &i64t(&[1], &[-1])]).shape, vec![1, 3]);
        assert_eq!(run("Squeeze", &[], &[Some(&x)], 1).unwrap()[0].shape, vec![3]);
        assert!(err_msg(run("Squeeze", &[], &[Some(&x), Some(&i64t(&[1], &[1]))], 1)).contains("cannot squeeze"));
        let v = iota(&[3]);
        assert_eq!(run1("Unsqueeze", &[], &[&v, &i64t(&[2], &[0, -1])]).shape, vec![1, 3, 1]);
        let y = run_at("Unsqueeze", 11, &[("axes", Attr::Ints(vec![1]))], &[Some(&v)], 1).unwrap();
        assert_eq!(y[0].shape, vec![3, 1]);
        assert!(err_msg(run("Unsqueeze", &[], &[Some(&v), Some(&i64t(&[2], &[0, 0]))], 1)).contains("repeat"));
    }

    #[test]
    fn concat_accepts_an_empty_past() {
        let past = f32t(&[1, 2, 0, 2], &[]);
        let new = iota(&[1, 2, 1, 2]);
        let y = run1("Concat", &[("axis", Attr::Int(2))], &[&past, &new]);
        assert_eq!((y.shape.clone(), f32s(&y)), (vec![1, 2, 1, 2], f32s(&new)));
        let y = run1("Concat", &[("axis", Attr::Int(-1))], &[&iota(&[2, 1]), &f32t(&[2, 2], &[5.0, 6.0, 7.0, 8.0])]);
        assert_eq!(f32s(&y), vec![0.0, 5.0, 6.0, 1.0, 7.0, 8.0]);
        let e = err_msg(run("Concat", &[("axis", Attr::Int(0))], &[Some(&iota(&[2, 1])), Some(&iota(&[2, 2]))], 1));
        assert!(e.contains("cannot concatenate"), "{e}");
    }

    #[test]
    fn transpose_defaults_to_reversing_axes() {
        let y = run1("Transpose", &[], &[&iota(&[2, 3])]);
        assert_eq!((y.shape.clone(), f32s(&y)), (vec![3, 2], vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]));
        let y = run1("Transpose", &[("perm", Attr::Ints(vec![1, 0, 2]))], &[&iota(&[2, 2, 2])]);
        assert_eq!(f32s(&y), vec![0.0, 1.0, 4.0, 5.0, 2.0, 3.0, 6.0, 7.0]);
        assert!(err_msg(run("Transpose", &[("perm", Attr::Ints(vec![0, 0]))], &[Some(&iota(&[2, 2]))], 1))
            .contains("permutation"));
    }

    #[test]
    fn expand_broadcasts_in_both_directions_and_tile_repeats() {
        let y = run1("Expand", &[], &[&f32t(&[3, 1], &[1.0, 2.0, 3.0]), &i64t(&[3], &[2, 1, 4])]);
        assert_eq!(y.shape, vec![2, 3, 4]);
        assert_eq!(&f32s(&y)[..8], &[1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0]);
        // The shape may be smaller than the input's: the input's dims win.
        assert_eq!(run1("Expand", &[], &[&iota(&[2, 3]), &i64t(&[1], &[3])]).shape, vec![2, 3]);
        let x = f32t(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(f32s(&run1("Tile", &[], &[&x, &i64t(&[2], &[1, 2])])), vec![1.0, 2.0, 1.0, 2.0, 3.0, 4.0, 3.0, 4.0]);
        assert_eq!(f32s(&run1("Tile", &[], &[&x, &i64t(&[2], &[2, 1])])), vec![1.0, 2.0, 3.0, 4.0, 1.0, 2.0, 3.0, 4.0]);
        let huge = run("Expand", &[], &[Some(&x), Some(&i64t(&[4], &[1 << 20, 1 << 12, 1, 1]))], 1);
        assert!(err_msg(huge).contains("exceeds the limit"));
    }

    #[test]
    fn range_counts_with_ceiling_division() {
        let r =
            |a: i64, b: i64, c: i64| ints(&run1("Range", &[], &[&i64t(&[], &[a]), &i64t(&[], &[b]), &i64t(&[], &[c])]));
        assert_eq!(r(3, 9, 3), vec![3, 6]);
        assert_eq!(r(10, 4, -2), vec![10, 8, 6]);
        assert_eq!(r(0, 7, 3), vec![0, 3, 6]);
        assert!(r(5, 1, 1).is_empty());
        let y = run1("Range", &[], &[&f32t(&[], &[0.0]), &f32t(&[], &[1.0]), &f32t(&[], &[0.25])]);
        assert_eq!(f32s(&y), vec![0.0, 0.25, 0.5, 0.75]);
        let i32_range = run1(
            "Range",
            &[],
            &[&typed(DType::I32, &[], &[0]), &typed(DType::I32, &[], &[2]), &typed(DType::I32, &[], &[1])],
        );
        assert_eq!((i32_range.dtype, ints(&i32_range)), (DType::I32, vec![0, 1]));
        assert!(err_msg(run(
            "Range",
            &[],
            &[Some(&i64t(&[], &[0])), Some(&i64t(&[], &[1])), Some(&i64t(&[], &[0]))],
            1
        ))
        .contains("delta"));
    }

    #[test]
    fn constant_of_shape_and_constant() {
        let y = run1("ConstantOfShape", &[], &[&i64t(&[2], &[2, 3])]);
        assert_eq!((y.dtype, y.shape.clone(), f32s(&y)), (DType::F32, vec![2, 3], vec![0.0; 6]));
        let seven = Attr::Tensor(i64t(&[1], &[7]));
        let y = run1("ConstantOfShape", &[("value", seven)], &[&i64t(&[0], &[])]);
        assert_eq!((y.dtype, y.shape.clone(), ints(&y)), (DType::I64, vec![], vec![7]));
        let y = run("Constant", &[("value_ints", Attr::Ints(vec![1, 2]))], &[], 1).unwrap();
        assert_eq!((y[0].shape.clone(), ints(&y[0])), (vec![2], vec![1, 2]));
        let y = run("Constant", &[("value_float", Attr::Float(1.5))], &[], 1).unwrap();
        assert_eq!((y[0].shape.clone(), f32s(&y[0])), (vec![], vec![1.5]));
        let y = run("Constant", &[("value_string", Attr::Str("hi".into()))], &[], 1).unwrap();
        assert_eq!(y[0].data, Data::Str(vec![b"hi".to_vec()]));
        let two = run("Constant", &[("value_int", Attr::Int(1)), ("value_float", Attr::Float(1.0))], &[], 1);
        assert!(err_msg(two).contains("exactly one"));
    }

    #[test]
    fn trilu_keeps_the_requested_triangle() {
        let x = f32t(&[3, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]);
        let tri = |upper: i64, k: Option<i64>| {
            let kt = k.map(|k| i64t(&[], &[k]));
            f32s(&run("Trilu", &[("upper", Attr::Int(upper))], &[Some(&x), kt.as_ref()], 1).unwrap()[0])
        };
        assert_eq!(tri(1, None), vec![1.0, 2.0, 3.0, 0.0, 5.0, 6.0, 0.0, 0.0, 9.0]);
        assert_eq!(tri(1, Some(1)), vec![0.0, 2.0, 3.0, 0.0, 0.0, 6.0, 0.0, 0.0, 0.0]);
        assert_eq!(tri(0, None), vec![1.0, 0.0, 0.0, 4.0, 5.0, 0.0, 7.0, 8.0, 9.0]);
        assert_eq!(tri(0, Some(-1)), vec![0.0, 0.0, 0.0, 4.0, 0.0, 0.0, 7.0, 8.0, 0.0]);
    }

    #[test]
    fn shape_slices_with_start_and_end() {
        let x = iota(&[2, 3, 4, 5]);
        assert_eq!(ints(&run1("Shape", &[("start", Attr::Int(1)), ("end", Attr::Int(-1))], &[&x])), vec![3, 4]);
        assert_eq!(
            ints(&run1("Shape", &[("start", Attr::Int(-10)), ("end", Attr::Int(100))], &[&x])),
            vec![2, 3, 4, 5]
        );
        assert_eq!(ints(&run1("Size", &[], &[&x])), vec![120]);
        assert_eq!(run1("Flatten", &[("axis", Attr::Int(-1))], &[&x]).shape, vec![24, 5]);
        assert_eq!(run1("Flatten", &[("axis", Attr::Int(0))], &[&x]).shape, vec![1, 120]);
    }

    #[test]
    fn gather_elements_and_gather_nd_follow_the_spec_examples() {
        let d = f32t(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
        let y = run1("GatherElements", &[("axis", Attr::Int(1))], &[&d, &i64t(&[2, 2], &[0, 0, 1, 0])]);
        assert_eq!(f32s(&y), vec![1.0, 1.0, 4.0, 3.0]);
        let d3 = iota(&[3, 3]);
        let y = run1("GatherElements", &[], &[&d3, &i64t(&[2, 3], &[1, 2, 0, 2, 0, -3])]);
        assert_eq!(f32s(&y), vec![3.0, 7.0, 2.0, 6.0, 1.0, 2.0]);
        let d = iota(&[2, 2]);
        assert_eq!(f32s(&run1("GatherND", &[], &[&d, &i64t(&[2, 2], &[0, 0, 1, 1])])), vec![0.0, 3.0]);
        let y = run1("GatherND", &[], &[&d, &i64t(&[2, 1], &[1, 0])]);
        assert_eq!((y.shape.clone(), f32s(&y)), (vec![2, 2], vec![2.0, 3.0, 0.0, 1.0]));
        let y = run1("GatherND", &[("batch_dims", Attr::Int(1))], &[&iota(&[2, 2, 2]), &i64t(&[2, 1], &[1, 0])]);
        assert_eq!((y.shape.clone(), f32s(&y)), (vec![2, 2], vec![2.0, 3.0, 4.0, 5.0]));
    }

    #[test]
    fn scatter_nd_writes_slices_and_reduces() {
        let data = f32t(&[8], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
        let y = run1("ScatterND", &[], &[&data, &i64t(&[4, 1], &[4, 3, 1, 7]), &f32t(&[4], &[9.0, 10.0, 11.0, 12.0])]);
        assert_eq!(f32s(&y), vec![1.0, 11.0, 3.0, 10.0, 9.0, 6.0, 7.0, 12.0]);
        let y = run1(
            "ScatterND",
            &[("reduction", Attr::Str("add".into()))],
            &[&f32t(&[2], &[1.0, 2.0]), &i64t(&[2, 1], &[0, 0]), &f32t(&[2], &[5.0, 6.0])],
        );
        assert_eq!(f32s(&y), vec![12.0, 2.0]);
        let rows = run1("ScatterND", &[], &[&iota(&[2, 2]), &i64t(&[1, 1], &[-1]), &f32t(&[1, 2], &[9.0, 9.0])]);
        assert_eq!(f32s(&rows), vec![0.0, 1.0, 9.0, 9.0]);
    }

    #[test]
    fn scatter_elements_writes_along_the_axis_and_reduces_from_the_opsets_that_allow_it() {
        let data = f32t(&[1, 5], &[1.0, 2.0, 3.0, 4.0, 5.0]);
        let (updates, axis) = (f32t(&[1, 2], &[1.5, 2.5]), ("axis", Attr::Int(1)));
        let scatter = |reduction: &str, opset: i64, idx: &[i64]| {
            let a = [axis.clone(), ("reduction", Attr::Str(reduction.into()))];
            let indices = i64t(&[1, 2], idx);
            run_at("ScatterElements", opset, &a, &[Some(&data), Some(&indices), Some(&updates)], 1)
        };
        assert_eq!(f32s(&scatter("none", 18, &[1, -2]).unwrap()[0]), vec![1.0, 1.5, 3.0, 2.5, 5.0]);
        // Both updates land on element 1: the last wins, or they add, or the larger stays.
        assert_eq!(f32s(&scatter("none", 18, &[1, 1]).unwrap()[0])[1], 2.5);
        assert_eq!(f32s(&scatter("add", 16, &[1, 1]).unwrap()[0])[1], 6.0);
        assert_eq!(f32s(&scatter("min", 18, &[1, 1]).unwrap()[0])[1], 1.5);
        assert!(err_msg(scatter("max", 16, &[1, 1])).contains("opset 18"));
        assert!(err_msg(scatter("add", 13, &[1, 1])).contains("opset 16"));
        assert!(err_msg(scatter("none", 18, &[5, 0])).contains("index"));
    }
}

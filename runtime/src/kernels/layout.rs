//! Data movement without arithmetic: ONNX Slice, Transpose and Concat of f32 tensors of at most
//! [`MAX_TRANSPOSE_RANK`] axes, as index arithmetic over row-major shapes. Runs of the last axis
//! are copied whole whenever it is taken in order.

use super::{shape_err, KernelError};

/// The most axes a Transpose (or a Slice or Concat) may have.
pub const MAX_TRANSPOSE_RANK: usize = 8;

/// ONNX Slice of `x` (of `shape`) into `out`.
pub fn slice(
    x: &[f32],
    shape: &[usize],
    starts: &[i64],
    ends: &[i64],
    axes: Option<&[i64]>,
    steps: Option<&[i64]>,
    out: &mut [f32],
) -> Result<(), KernelError> {
    let rank = shape.len();
    if starts.len() != ends.len()
        || axes.is_some_and(|a| a.len() != starts.len())
        || steps.is_some_and(|s| s.len() != starts.len())
    {
        return Err(shape_err("slice", "starts, ends, axes and steps differ in length"));
    }
    let mut begin = [0i64; MAX_TRANSPOSE_RANK];
    let mut step = [1i64; MAX_TRANSPOSE_RANK];
    let mut count = [0usize; MAX_TRANSPOSE_RANK];
    count[..rank].copy_from_slice(shape);
    for i in 0..starts.len() {
        let a = axes.map_or(i as i64, |a| a[i]);
        let axis = if a < 0 { a + rank as i64 } else { a };
        if axis < 0 || axis >= rank as i64 {
            return Err(shape_err("slice", format!("axis {a} is outside rank {rank}")));
        }
        let axis = axis as usize;
        let s = steps.map_or(1, |s| s[i]);
        if s == 0 {
            return Err(shape_err("slice", "a step is 0"));
        }
        (begin[axis], count[axis]) = slice_axis(shape[axis] as i64, starts[i], ends[i], s);
        step[axis] = s;
    }
    let total: usize = count[..rank].iter().product();
    if total != out.len() {
        return Err(shape_err("slice", format!("the slice holds {total} values; the program says {}", out.len())));
    }
    if total == 0 {
        return Ok(());
    }
    copy_strided(x, shape, &begin[..rank], &step[..rank], &count[..rank], out);
    Ok(())
}

/// The first index and the number of elements a Slice of one axis of `dim` takes from `start` to
/// `end` (exclusive) by `step` (not 0), with ONNX's clamping of out-of-range bounds.
fn slice_axis(dim: i64, start: i64, end: i64, step: i64) -> (i64, usize) {
    let norm = |v: i64| if v < 0 { v + dim } else { v };
    let (b, e) = if step > 0 {
        (norm(start).clamp(0, dim), norm(end).clamp(0, dim))
    } else {
        (norm(start).clamp(-1, dim - 1), norm(end).clamp(-1, dim - 1))
    };
    let (span, by) = if step > 0 { ((e - b).max(0), step) } else { ((b - e).max(0), -step) };
    (b, ((span + by - 1) / by) as usize)
}

/// Copies the elements of `x` (of `shape`) at `begin + i·step` along each axis, `count` of them,
/// into `out` in order; runs of the last axis are copied whole when it is taken with step 1.
fn copy_strided(x: &[f32], shape: &[usize], begin: &[i64], step: &[i64], count: &[usize], out: &mut [f32]) {
    let rank = shape.len();
    let mut strides = [0i64; MAX_TRANSPOSE_RANK];
    let mut stride = 1i64;
    for i in (0..rank).rev() {
        strides[i] = stride;
        stride *= shape[i] as i64;
    }
    let (outer, run) = if rank > 0 && step[rank - 1] == 1 { (rank - 1, count[rank - 1]) } else { (rank, 1) };
    let base: i64 = (0..rank).map(|i| begin[i] * strides[i]).sum();
    let mut index = [0usize; MAX_TRANSPOSE_RANK];
    let mut src = base;
    for chunk in out.chunks_exact_mut(run) {
        let s = src as usize;
        chunk.copy_from_slice(&x[s..s + run]);
        let mut axis = outer;
        while axis > 0 {
            axis -= 1;
            index[axis] += 1;
            src += step[axis] * strides[axis];
            if index[axis] < count[axis] {
                break;
            }
            src -= step[axis] * strides[axis] * count[axis] as i64;
            index[axis] = 0;
        }
    }
}

/// Copies `x` of `shape` into `out` with its axes permuted (`out` axis i is `x` axis perm[i]).
/// Runs of the last axis are copied whole when it stays last.
pub fn transpose(x: &[f32], shape: &[usize], perm: &[usize], out: &mut [f32]) {
    let rank = shape.len();
    debug_assert!(rank <= MAX_TRANSPOSE_RANK && perm.len() == rank);
    if rank == 0 || x.is_empty() {
        out.copy_from_slice(x);
        return;
    }
    let mut in_strides = [0usize; MAX_TRANSPOSE_RANK];
    let mut stride = 1;
    for i in (0..rank).rev() {
        in_strides[i] = stride;
        stride *= shape[i];
    }
    let mut out_shape = [0usize; MAX_TRANSPOSE_RANK];
    let mut strides = [0usize; MAX_TRANSPOSE_RANK];
    for i in 0..rank {
        out_shape[i] = shape[perm[i]];
        strides[i] = in_strides[perm[i]];
    }
    // With the last axis in place, whole rows move; otherwise single elements do.
    let (outer, run) = if perm[rank - 1] == rank - 1 { (rank - 1, shape[rank - 1]) } else { (rank, 1) };
    let mut index = [0usize; MAX_TRANSPOSE_RANK];
    let mut src = 0usize;
    for chunk in out.chunks_exact_mut(run) {
        chunk.copy_from_slice(&x[src..src + run]);
        // Odometer over the outer axes of the output.
        let mut axis = outer;
        while axis > 0 {
            axis -= 1;
            index[axis] += 1;
            src += strides[axis];
            if index[axis] < out_shape[axis] {
                break;
            }
            src -= strides[axis] * out_shape[axis];
            index[axis] = 0;
        }
    }
}

/// ONNX Concat of `count` inputs (`input(i)`: the values and shape of input i) along `axis`
/// (negative counts from the end) into `out` of `out_shape`. Every input must have the output's
/// shape but along `axis`, and together they must fill the output exactly.
pub fn concat<'a>(
    count: usize,
    input: impl Fn(usize) -> (&'a [f32], &'a [usize]),
    axis: i64,
    out_shape: &[usize],
    out: &mut [f32],
) -> Result<(), KernelError> {
    let rank = out_shape.len();
    let axis = if axis < 0 { (axis + rank as i64) as usize } else { axis as usize };
    let outer: usize = out_shape[..axis].iter().product();
    let n: usize = out_shape.iter().product();
    let mut at = 0;
    for o in 0..outer {
        for i in 0..count {
            let (data, shape) = input(i);
            if shape.len() != rank || (0..rank).any(|d| d != axis && shape[d] != out_shape[d]) {
                return Err(shape_err("concat", format!("input {shape:?} does not concatenate into {out_shape:?}")));
            }
            let chunk: usize = shape[axis..].iter().product();
            if at + chunk > n {
                return Err(shape_err("concat", format!("inputs overflow the output {out_shape:?}")));
            }
            out[at..at + chunk].copy_from_slice(&data[o * chunk..(o + 1) * chunk]);
            at += chunk;
        }
    }
    if at != n {
        return Err(shape_err("concat", format!("inputs fill {at} of {n} values of {out_shape:?}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose_moves_rows_and_elements() {
        // [2, 3, 2] with perm [1, 0, 2]: rows of 2 move.
        let x: Vec<f32> = (0..12).map(|v| v as f32).collect();
        let mut y = vec![0.0; 12];
        transpose(&x, &[2, 3, 2], &[1, 0, 2], &mut y);
        assert_eq!(y, [0., 1., 6., 7., 2., 3., 8., 9., 4., 5., 10., 11.]);
        // [2, 3] with perm [1, 0]: elements move.
        let mut t = vec![0.0; 6];
        transpose(&x[..6], &[2, 3], &[1, 0], &mut t);
        assert_eq!(t, [0., 3., 1., 4., 2., 5.]);
    }

    #[test]
    fn slice_takes_ranges_steps_and_negative_bounds() {
        let x: Vec<f32> = (0..24).map(|v| v as f32).collect();
        // [2, 3, 4]: axis 1 from 1 to the end.
        let mut y = vec![0.0; 16];
        slice(&x, &[2, 3, 4], &[1], &[i64::MAX], Some(&[1]), None, &mut y).unwrap();
        assert_eq!(y, [4., 5., 6., 7., 8., 9., 10., 11., 16., 17., 18., 19., 20., 21., 22., 23.]);
        // Last axis backwards by 2 from -1, first row only.
        let mut y = vec![0.0; 6];
        slice(&x, &[2, 3, 4], &[0, -1], &[1, -5], Some(&[0, -1]), Some(&[1, -2]), &mut y).unwrap();
        assert_eq!(y, [3., 1., 7., 5., 11., 9.]);
        // A size the program does not expect is an error.
        assert!(slice(&x, &[2, 3, 4], &[0], &[1], None, None, &mut [0.0; 5]).is_err());
    }

    #[test]
    fn concat_interleaves_the_inputs_chunks_along_the_axis() {
        // [2, 1] and [2, 2] along axis 1 (and -1): rows of 1 then 2 values.
        let inputs: [(&[f32], &[usize]); 2] = [(&[0.0, 1.0], &[2, 1]), (&[10.0, 11.0, 12.0, 13.0], &[2, 2])];
        for axis in [1, -1] {
            let mut y = vec![0.0; 6];
            concat(2, |i| inputs[i], axis, &[2, 3], &mut y).unwrap();
            assert_eq!(y, [0.0, 10.0, 11.0, 1.0, 12.0, 13.0]);
        }
        let mut y = vec![0.0; 6];
        let err = concat(2, |_| inputs[0], 1, &[2, 3], &mut y).unwrap_err();
        assert!(err.to_string().contains("fill 4 of 6"), "{err}");
    }
}

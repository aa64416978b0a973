//! Index arithmetic shared by the ops: element-count limits, strides, numpy broadcasting, strided
//! gathers, and a storage-generic builder for outputs assembled from slices of inputs.

use super::{Fail, Res};
use crate::tensor::{numel, Data};

/// Largest number of elements any result may have; bigger results are refused, not allocated.
pub(crate) const MAX_ELEMENTS: usize = 1 << 31;

/// Element count of a result shape, refusing overflow and anything beyond [`MAX_ELEMENTS`].
pub(crate) fn checked_numel(shape: &[usize]) -> Res<usize> {
    match numel(shape) {
        Some(n) if n <= MAX_ELEMENTS => Ok(n),
        _ => bail!("result of shape {shape:?} exceeds the limit of {MAX_ELEMENTS} elements"),
    }
}

/// Row-major strides, in elements.
pub(crate) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut out = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        out[d] = out[d + 1] * shape[d + 1];
    }
    out
}

/// Multidirectional (numpy) broadcast of several shapes; the result is size-checked.
pub(crate) fn broadcast_shapes(shapes: &[&[usize]]) -> Res<Vec<usize>> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![1usize; rank];
    for shape in shapes {
        let offset = rank - shape.len();
        for (d, &n) in shape.iter().enumerate() {
            let o = &mut out[offset + d];
            if *o == 1 {
                *o = n;
            } else if n != 1 && n != *o {
                bail!("shapes {shapes:?} cannot be broadcast together");
            }
        }
    }
    checked_numel(&out)?;
    Ok(out)
}

/// Whether `src` broadcasts to exactly `dst` (unidirectional broadcasting).
pub(crate) fn broadcasts_to(src: &[usize], dst: &[usize]) -> bool {
    src.len() <= dst.len() && src.iter().rev().zip(dst.iter().rev()).all(|(&s, &d)| s == d || s == 1)
}

/// For every element of `dst` (row-major), the index of the element of a tensor of shape `src`
/// that broadcasting reads. `src` must broadcast to `dst`.
pub(crate) fn broadcast_index_map(src: &[usize], dst: &[usize]) -> Vec<usize> {
    debug_assert!(broadcasts_to(src, dst));
    let src_strides = strides(src);
    let offset = dst.len() - src.len();
    let strides: Vec<isize> = (0..dst.len())
        .map(|d| if d < offset || src[d - offset] == 1 { 0 } else { src_strides[d - offset] as isize })
        .collect();
    strided_offsets(dst, &strides, 0)
}

/// Where each element of a broadcast result reads from one operand; the identity when the operand
/// already has the result's shape (no index vector is built then).
pub(crate) struct BroadcastMap(Option<Vec<usize>>);

impl BroadcastMap {
    /// `src` must broadcast to `dst`.
    pub(crate) fn new(src: &[usize], dst: &[usize]) -> BroadcastMap {
        BroadcastMap((src != dst).then(|| broadcast_index_map(src, dst)))
    }

    /// The operand index read by result element `i`.
    #[inline]
    pub(crate) fn at(&self, i: usize) -> usize {
        match &self.0 {
            None => i,
            Some(map) => map[i],
        }
    }
}

/// Offsets `base + Σ index[d] * strides[d]` for every index of `shape`, in row-major order. The
/// innermost dimension runs in a tight loop; outer dimensions advance like an odometer.
pub(crate) fn strided_offsets(shape: &[usize], strides: &[isize], base: isize) -> Vec<usize> {
    let n = numel(shape).unwrap_or(0);
    let mut out = Vec::with_capacity(n);
    if n == 0 {
        return out;
    }
    let Some(last) = shape.len().checked_sub(1) else {
        out.push(base as usize);
        return out;
    };
    let mut index = vec![0usize; shape.len()];
    let mut offset = base;
    loop {
        let step = strides[last];
        for k in 0..shape[last] {
            out.push((offset + k as isize * step) as usize);
        }
        let mut d = last;
        loop {
            if d == 0 {
                return out;
            }
            d -= 1;
            index[d] += 1;
            offset += strides[d];
            if index[d] < shape[d] {
                break;
            }
            offset -= strides[d] * shape[d] as isize;
            index[d] = 0;
        }
    }
}

/// The elements of `data` at `indices`, in order, with the same storage.
pub(crate) fn take(data: &Data, indices: &[usize]) -> Data {
    match data {
        Data::F32(v) => Data::F32(indices.iter().map(|&i| v[i]).collect()),
        Data::F64(v) => Data::F64(indices.iter().map(|&i| v[i]).collect()),
        Data::I64(v) => Data::I64(indices.iter().map(|&i| v[i]).collect()),
        Data::Str(v) => Data::Str(indices.iter().map(|&i| v[i].clone()).collect()),
    }
}

/// Builds a [`Data`] of one storage kind from contiguous runs of other `Data` values.
pub(crate) enum DataBuilder {
    F32(Vec<f32>),
    F64(Vec<f64>),
    I64(Vec<i64>),
    Str(Vec<Vec<u8>>),
}

impl DataBuilder {
    /// An empty builder with the storage kind of `like`.
    pub(crate) fn like(like: &Data, capacity: usize) -> DataBuilder {
        match like {
            Data::F32(_) => DataBuilder::F32(Vec::with_capacity(capacity)),
            Data::F64(_) => DataBuilder::F64(Vec::with_capacity(capacity)),
            Data::I64(_) => DataBuilder::I64(Vec::with_capacity(capacity)),
            Data::Str(_) => DataBuilder::Str(Vec::with_capacity(capacity)),
        }
    }

    /// Appends `src[start..start + len]`; `src` must have the builder's storage kind.
    pub(crate) fn extend(&mut self, src: &Data, start: usize, len: usize) -> Res<()> {
        let range = start..start + len;
        match (self, src) {
            (DataBuilder::F32(out), Data::F32(v)) => out.extend_from_slice(&v[range]),
            (DataBuilder::F64(out), Data::F64(v)) => out.extend_from_slice(&v[range]),
            (DataBuilder::I64(out), Data::I64(v)) => out.extend_from_slice(&v[range]),
            (DataBuilder::Str(out), Data::Str(v)) => out.extend_from_slice(&v[range]),
            _ => return Err(Fail("inputs have different element types".into())),
        }
        Ok(())
    }

    pub(crate) fn finish(self) -> Data {
        match self {
            DataBuilder::F32(v) => Data::F32(v),
            DataBuilder::F64(v) => Data::F64(v),
            DataBuilder::I64(v) => Data::I64(v),
            DataBuilder::Str(v) => Data::Str(v),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_shapes_follow_numpy_rules() {
        assert_eq!(broadcast_shapes(&[&[2, 1, 3], &[4, 1]]).unwrap(), vec![2, 4, 3]);
        assert_eq!(broadcast_shapes(&[&[], &[5]]).unwrap(), vec![5]);
        assert_eq!(broadcast_shapes(&[&[0, 3], &[1, 3]]).unwrap(), vec![0, 3]);
        let err = broadcast_shapes(&[&[2, 3], &[4, 3]]).unwrap_err();
        assert!(err.0.contains("cannot be broadcast"), "{}", err.0);
    }

    #[test]
    fn broadcast_index_map_repeats_size_one_dims() {
        // [2,1] broadcast to [2,3]: each row repeats its single element.
        assert_eq!(broadcast_index_map(&[2, 1], &[2, 3]), vec![0, 0, 0, 1, 1, 1]);
        // [3] broadcast to [2,3]: the row repeats.
        assert_eq!(broadcast_index_map(&[3], &[2, 3]), vec![0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn strided_offsets_walks_negative_strides() {
        // A reversed view of a 2x3 matrix's rows: base at row 1, row stride -3.
        assert_eq!(strided_offsets(&[2, 3], &[-3, 1], 3), vec![3, 4, 5, 0, 1, 2]);
        assert_eq!(strided_offsets(&[], &[], 7), vec![7]);
        assert!(strided_offsets(&[2, 0], &[1, 1], 0).is_empty());
    }

    #[test]
    fn checked_numel_refuses_huge_results() {
        assert_eq!(checked_numel(&[1 << 16, 1 << 15]).unwrap(), 1 << 31);
        assert!(checked_numel(&[1 << 16, 1 << 16]).is_err());
        assert!(checked_numel(&[usize::MAX, 2]).is_err());
    }
}

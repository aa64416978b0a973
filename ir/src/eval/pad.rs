//! Pad, with its operands as each opset defines them: `paddings` and `value` attributes (opset 1),
//! `pads` and `value` attributes (2), `pads` and `constant_value` inputs (11) and an `axes`
//! input (18). Modes `constant`, `reflect` and `edge`, and `wrap` from opset 19. Negative pads
//! remove elements; every mode reads the original data, so a side can be cropped while the other
//! is padded.

use super::layout::checked_numel;
use super::{int_values, norm_axis, Ctx, Res};
use crate::tensor::{Data, Tensor};

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Constant,
    /// Mirrors without repeating the edge element (numpy's `reflect`): `[1, 2, 3]` padded by 2
    /// on the left is `[3, 2, 1, 2, 3]`; wider pads keep mirroring.
    Reflect,
    /// Repeats the edge element.
    Edge,
    /// Continues from the other end, as if the axis were periodic.
    Wrap,
}

fn mode(cx: &Ctx) -> Res<Mode> {
    Ok(match cx.attrs().str("mode")?.unwrap_or("constant") {
        "constant" => Mode::Constant,
        "reflect" => Mode::Reflect,
        "edge" => Mode::Edge,
        "wrap" if cx.opset() >= 19 => Mode::Wrap,
        "wrap" => bail!("mode `wrap` needs opset 19, the model imports {}", cx.opset()),
        other => bail!("unknown mode `{other}`"),
    })
}

pub(super) fn pad(cx: &Ctx) -> Res<Vec<Tensor>> {
    let x = cx.input(0, "data")?;
    let mode = mode(cx)?;
    let widths = pad_widths(cx, x.rank())?;
    let mut shape = Vec::with_capacity(x.rank());
    for (d, (&n, &(before, after))) in x.shape.iter().zip(&widths).enumerate() {
        let padded = n as i64 + before + after;
        if padded < 0 {
            bail!("pads ({before}, {after}) remove more than the {n} elements of axis {d}");
        }
        if mode != Mode::Constant && n == 0 && padded > 0 {
            bail!("axis {d} is empty: there is nothing to repeat in this mode");
        }
        shape.push(padded as usize);
    }
    checked_numel(&shape)?;
    let fill = fill_value(cx, x)?;
    let offsets = source_offsets(&x.shape, &shape, &widths, mode);
    let data = match (&x.data, &fill) {
        (Data::F32(v), Data::F32(f)) => Data::F32(offsets.iter().map(|o| o.map_or(f[0], |i| v[i])).collect()),
        (Data::F64(v), Data::F64(f)) => Data::F64(offsets.iter().map(|o| o.map_or(f[0], |i| v[i])).collect()),
        (Data::I64(v), Data::I64(f)) => Data::I64(offsets.iter().map(|o| o.map_or(f[0], |i| v[i])).collect()),
        (Data::Str(v), Data::Str(f)) => {
            Data::Str(offsets.iter().map(|o| o.map_or_else(|| f[0].clone(), |i| v[i].clone())).collect())
        }
        _ => bail!("the constant value does not have the data's type {}", x.dtype),
    };
    Ok(vec![Tensor { dtype: x.dtype, shape, data }])
}

/// `(before, after)` for every axis of a rank-`rank` input.
fn pad_widths(cx: &Ctx, rank: usize) -> Res<Vec<(i64, i64)>> {
    let pads: Vec<i64> = match cx.opset() {
        ..=1 => required_ints(cx, "paddings")?,
        2..=10 => required_ints(cx, "pads")?,
        _ => int_values(cx.input(1, "pads")?, "pads")?.to_vec(),
    };
    let axes: Vec<usize> = match cx.opt(3).filter(|_| cx.opset() >= 18) {
        Some(a) => int_values(a, "axes")?.iter().map(|&a| norm_axis(a, rank, "axis")).collect::<Res<_>>()?,
        None => (0..rank).collect(),
    };
    if pads.len() != 2 * axes.len() {
        bail!("{} pads for {} axes; pads holds a begin and an end for each", pads.len(), axes.len());
    }
    let mut widths = vec![(0, 0); rank];
    let mut seen = vec![false; rank];
    for (i, &a) in axes.iter().enumerate() {
        if std::mem::replace(&mut seen[a], true) {
            bail!("axis {a} is given twice");
        }
        widths[a] = (pads[i], pads[axes.len() + i]);
    }
    Ok(widths)
}

fn required_ints(cx: &Ctx, name: &str) -> Res<Vec<i64>> {
    match cx.attrs().ints(name)? {
        Some(v) => Ok(v.to_vec()),
        None => bail!("attribute `{name}` is required at opset {}", cx.opset()),
    }
}

/// The value constant padding writes, as one element of the data's storage: the `value`
/// attribute before opset 11, the optional `constant_value` input from 11, else zero (false, "").
fn fill_value(cx: &Ctx, x: &Tensor) -> Res<Data> {
    let given = if cx.opset() < 11 {
        let value = cx.attrs().float_or("value", 0.0)?;
        super::require_float(x, "data")?;
        Some(Tensor::from_f32(x.dtype, vec![], vec![value]))
    } else {
        cx.opt(2).cloned()
    };
    match given {
        Some(t) if t.dtype != x.dtype || t.numel() != 1 => {
            bail!("constant_value must be one {} value, got {} of shape {:?}", x.dtype, t.dtype, t.shape)
        }
        Some(t) => Ok(t.data),
        None => Ok(match &x.data {
            Data::F32(_) => Data::F32(vec![0.0]),
            Data::F64(_) => Data::F64(vec![0.0]),
            Data::I64(_) => Data::I64(vec![0]),
            Data::Str(_) => Data::Str(vec![vec![]]),
        }),
    }
}

/// For every output element in row-major order, the offset of the input element it copies, or
/// `None` where constant padding writes the fill value.
fn source_offsets(input: &[usize], output: &[usize], widths: &[(i64, i64)], mode: Mode) -> Vec<Option<usize>> {
    let strides = super::layout::strides(input);
    let mut offsets = vec![Some(0usize)];
    for d in 0..input.len() {
        let along: Vec<Option<usize>> = (0..output[d])
            .map(|o| source_index(o as i64 - widths[d].0, input[d] as i64, mode).map(|i| i * strides[d]))
            .collect();
        offsets = offsets.iter().flat_map(|&base| along.iter().map(move |&a| Some(base? + a?))).collect();
    }
    offsets
}

/// The input index that position `i` (relative to the input's first element) reads on an axis
/// of `n > 0` elements, or `None` for constant padding.
fn source_index(i: i64, n: i64, mode: Mode) -> Option<usize> {
    if (0..n).contains(&i) {
        return Some(i as usize);
    }
    let j = match mode {
        Mode::Constant => return None,
        Mode::Edge => i.clamp(0, n - 1),
        Mode::Wrap => i.rem_euclid(n),
        Mode::Reflect if n == 1 => 0,
        Mode::Reflect => {
            let period = 2 * (n - 1);
            let m = i.rem_euclid(period);
            if m < n {
                m
            } else {
                period - m
            }
        }
    };
    Some(j as usize)
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use crate::attr::Attr;

    fn pad_at(opset: i64, a: &[(&str, Attr)], inputs: &[Option<&crate::Tensor>]) -> Vec<f32> {
        f32s(&run_at("Pad", opset, a, inputs, 1).unwrap()[0])
    }

    #[test]
    fn reflect_mirrors_without_the_edge_and_keeps_mirroring_past_the_axis() {
        let x = f32t(&[3], &[1.0, 2.0, 3.0]);
        let reflect = [("mode", Attr::Str("reflect".into()))];
        // Two before, one after: 3 2 | 1 2 3 | 2.
        let pads = i64t(&[2], &[2, 1]);
        assert_eq!(pad_at(23, &reflect, &[Some(&x), Some(&pads)]), vec![3.0, 2.0, 1.0, 2.0, 3.0, 2.0]);
        // Five before: the mirror walks 2 3 2 1 2 back from the first element (period 4).
        let pads = i64t(&[2], &[5, 0]);
        assert_eq!(pad_at(23, &reflect, &[Some(&x), Some(&pads)]), vec![2.0, 1.0, 2.0, 3.0, 2.0, 1.0, 2.0, 3.0]);
    }

    #[test]
    fn edge_wrap_and_constant_modes_with_axes_and_negative_pads() {
        let x = f32t(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
        let edge = [("mode", Attr::Str("edge".into()))];
        let pads = i64t(&[2], &[1, 2]);
        let axes = i64t(&[1], &[-1]);
        // Columns only: each row becomes first, row, last, last.
        let y = pad_at(18, &edge, &[Some(&x), Some(&pads), None, Some(&axes)]);
        assert_eq!(y, vec![1.0, 1.0, 2.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0, 4.0]);
        let wrap = [("mode", Attr::Str("wrap".into()))];
        let y = pad_at(19, &wrap, &[Some(&x), Some(&pads), None, Some(&axes)]);
        assert_eq!(y, vec![2.0, 1.0, 2.0, 1.0, 2.0, 4.0, 3.0, 4.0, 3.0, 4.0]);
        assert!(err_msg(run_at("Pad", 18, &wrap, &[Some(&x), Some(&pads)], 1)).contains("opset 19"));
        // Crop the first row, add a row of 9s after: [3 4; 9 9].
        let (pads, nine) = (i64t(&[4], &[-1, 0, 1, 0]), f32t(&[], &[9.0]));
        assert_eq!(pad_at(23, &[], &[Some(&x), Some(&pads), Some(&nine)]), vec![3.0, 4.0, 9.0, 9.0]);
    }

    #[test]
    fn pads_and_value_are_attributes_before_opset_11() {
        let x = f32t(&[2], &[1.0, 2.0]);
        let a = [("pads", Attr::Ints(vec![1, 0])), ("value", Attr::Float(7.0))];
        assert_eq!(pad_at(2, &a, &[Some(&x)]), vec![7.0, 1.0, 2.0]);
        let a = [("paddings", Attr::Ints(vec![0, 2]))];
        assert_eq!(pad_at(1, &a, &[Some(&x)]), vec![1.0, 2.0, 0.0, 0.0]);
        assert!(err_msg(run_at("Pad", 2, &[], &[Some(&x)], 1)).contains("`pads` is required"));
    }
}

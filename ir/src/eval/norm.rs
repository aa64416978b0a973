//! Normalisations: LayerNormalization, RMS normalisation in its three spellings
//! (SimplifiedLayerNormalization in either domain, RMSNormalization) and onnxruntime's
//! SkipSimplifiedLayerNormalization. Means and mean squares accumulate in f64; each output
//! element is computed in f64 from the inputs and rounded once.

use super::layout::{broadcasts_to, BroadcastMap};
use super::{dtype_from_code, float_tensor, norm_axis, require_float, Ctx, Res};
use crate::dtype::DType;
use crate::tensor::{Data, Tensor};

/// The dtype of saved statistics (`stash_type`, f32 by default).
fn stash_dtype(cx: &Ctx) -> Res<DType> {
    let d = dtype_from_code(cx.attrs().int_or("stash_type", 1)?, "stash_type")?;
    if !d.is_float() {
        bail!("stash_type must name a float type, got {d}");
    }
    Ok(d)
}

/// A per-element parameter (scale or bias) broadcast onto the input.
fn broadcast_param(p: &Tensor, x_shape: &[usize], what: &str) -> Res<(Vec<f64>, BroadcastMap)> {
    require_float(p, what)?;
    if !broadcasts_to(&p.shape, x_shape) {
        bail!("{what} of shape {:?} does not broadcast to the input {x_shape:?}", p.shape);
    }
    Ok((p.to_f64_vec(), BroadcastMap::new(&p.shape, x_shape)))
}

/// The shape of per-row statistics: the input's, with the normalised dimensions set to 1.
fn stats_shape(shape: &[usize], axis: usize) -> Vec<usize> {
    shape.iter().enumerate().map(|(d, &n)| if d < axis { n } else { 1 }).collect()
}

/// LayerNormalization: `(x - mean) / sqrt(var + eps) * scale + bias` over the dimensions from
/// `axis` on. Outputs Y (the input's dtype) and the saved Mean and InvStdDev (`stash_type`).
pub(super) fn layer_norm(cx: &Ctx) -> Res<Vec<Tensor>> {
    let x = cx.input(0, "X")?;
    require_float(x, "X")?;
    let axis = norm_axis(cx.attrs().int_or("axis", -1)?, x.rank(), "axis")?;
    let eps = cx.attrs().float_or("epsilon", 1e-5)? as f64;
    let stash = stash_dtype(cx)?;
    let (scale, scale_map) = broadcast_param(cx.input(1, "Scale")?, &x.shape, "Scale")?;
    let bias = cx.opt(2).map(|b| broadcast_param(b, &x.shape, "B")).transpose()?;
    let cols: usize = x.shape[axis..].iter().product();
    if cols == 0 {
        bail!("normalised dimensions {:?} are empty", &x.shape[axis..]);
    }
    let v = x.to_f64_vec();
    let mut y = vec![0.0; v.len()];
    let (mut means, mut inv_stds) = (vec![], vec![]);
    for (r, row) in v.chunks(cols).enumerate() {
        let mean = row.iter().sum::<f64>() / cols as f64;
        let var = row.iter().map(|p| (p - mean) * (p - mean)).sum::<f64>() / cols as f64;
        let inv_std = 1.0 / (var + eps).sqrt();
        for (c, &p) in row.iter().enumerate() {
            let i = r * cols + c;
            let shift = bias.as_ref().map_or(0.0, |(b, map)| b[map.at(i)]);
            y[i] = (p - mean) * inv_std * scale[scale_map.at(i)] + shift;
        }
        means.push(mean);
        inv_stds.push(inv_std);
    }
    let stats = stats_shape(&x.shape, axis);
    Ok(vec![
        float_tensor(x.dtype, x.shape.clone(), y),
        float_tensor(stash, stats.clone(), means),
        float_tensor(stash, stats, inv_stds),
    ])
}

/// LpNormalization: `x / ‖x‖_p` along `axis` (default -1) with `p` 1 or 2 (default 2); a zero
/// norm gives zeros, as onnxruntime computes it.
pub(super) fn lp_norm(cx: &Ctx) -> Res<Vec<Tensor>> {
    let x = cx.input(0, "input")?;
    require_float(x, "input")?;
    let axis = norm_axis(cx.attrs().int_or("axis", -1)?, x.rank().max(1), "axis")?;
    let p = cx.attrs().int_or("p", 2)?;
    if p != 1 && p != 2 {
        bail!("p must be 1 or 2, got {p}");
    }
    if x.rank() == 0 {
        bail!("input must be at least 1-D");
    }
    let len = x.shape[axis];
    let inner: usize = x.shape[axis + 1..].iter().product();
    let v = x.to_f64_vec();
    let mut y = vec![0.0; v.len()];
    for outer in 0..v.len() / (len * inner).max(1) {
        for i in 0..inner {
            let at = |j: usize| (outer * len + j) * inner + i;
            let norm: f64 = if p == 1 {
                (0..len).map(|j| v[at(j)].abs()).sum()
            } else {
                (0..len).map(|j| v[at(j)] * v[at(j)]).sum::<f64>().sqrt()
            };
            for j in 0..len {
                y[at(j)] = if norm == 0.0 { 0.0 } else { v[at(j)] / norm };
            }
        }
    }
    Ok(vec![float_tensor(x.dtype, x.shape.clone(), y)])
}

/// RMS normalisation, `x / sqrt(mean(x²) + eps) * scale` over the dimensions from `axis` on,
/// as SimplifiedLayerNormalization (either domain) and RMSNormalization define it. Y takes the
/// scale's dtype; the second output (SimplifiedLayerNormalization only) is the saved
/// `1 / sqrt(mean(x²) + eps)` in `stash_type`.
pub(super) fn rms_norm(cx: &Ctx) -> Res<Vec<Tensor>> {
    let x = cx.input(0, "X")?;
    require_float(x, "X")?;
    let scale_t = cx.input(1, "scale")?;
    let axis = norm_axis(cx.attrs().int_or("axis", -1)?, x.rank(), "axis")?;
    let eps = cx.attrs().float_or("epsilon", 1e-5)? as f64;
    let stash = stash_dtype(cx)?;
    let (scale, scale_map) = broadcast_param(scale_t, &x.shape, "scale")?;
    let cols: usize = x.shape[axis..].iter().product();
    if cols == 0 {
        bail!("normalised dimensions {:?} are empty", &x.shape[axis..]);
    }
    let v = x.to_f64_vec();
    let mut y = vec![0.0; v.len()];
    let mut inv_stds = vec![];
    for (r, row) in v.chunks(cols).enumerate() {
        let inv_std = 1.0 / (row.iter().map(|p| p * p).sum::<f64>() / cols as f64 + eps).sqrt();
        for (c, &p) in row.iter().enumerate() {
            let i = r * cols + c;
            y[i] = p * inv_std * scale[scale_map.at(i)];
        }
        inv_stds.push(inv_std);
    }
    Ok(vec![
        float_tensor(scale_t.dtype, x.shape.clone(), y),
        float_tensor(stash, stats_shape(&x.shape, axis), inv_stds),
    ])
}

/// onnxruntime's SkipSimplifiedLayerNormalization: `s = input + skip (+ bias)`, then RMS
/// normalisation of `s` over the last dimension times `gamma`. Outputs: the normalised values,
/// a `mean` placeholder (zeros, as onnxruntime leaves it), `inv_std_var`, and `s` itself; the
/// statistics have the input's shape with the last dimension 1 and are f32. As in onnxruntime,
/// `s` is summed in f32 and the normalisation reads it before rounding to the input dtype.
pub(super) fn skip_simplified_layer_norm(cx: &Ctx) -> Res<Vec<Tensor>> {
    let (x, skip, gamma) = (cx.input(0, "input")?, cx.input(1, "skip")?, cx.input(2, "gamma")?);
    let bias = cx.opt(3);
    let eps = cx.attrs().float_or("epsilon", 1e-12)? as f64;
    require_float(x, "input")?;
    if !matches!(x.rank(), 2 | 3) {
        bail!("input must be 2-D or 3-D, got {:?}", x.shape);
    }
    let hidden = x.shape[x.rank() - 1];
    if hidden == 0 {
        bail!("hidden size is 0");
    }
    if skip.dtype != x.dtype || !broadcasts_to(&skip.shape, &x.shape) {
        bail!("skip {} {:?} does not match input {} {:?}", skip.dtype, skip.shape, x.dtype, x.shape);
    }
    for (t, what) in [(Some(gamma), "gamma"), (bias, "bias")] {
        if let Some(t) = t {
            if t.dtype != x.dtype || t.shape != [hidden] {
                bail!("{what} must be {} [{hidden}], got {} {:?}", x.dtype, t.dtype, t.shape);
            }
        }
    }
    let (Data::F32(xv), Data::F32(sv)) = (&x.data, &skip.data) else {
        bail!("input must be a 32-bit-or-narrower float tensor, got {}", x.dtype);
    };
    let skip_map = BroadcastMap::new(&skip.shape, &x.shape);
    let bias_v = bias.map(Tensor::to_f32_vec);
    let sums: Vec<f32> = xv
        .iter()
        .enumerate()
        .map(|(i, &p)| {
            let s = p + sv[skip_map.at(i)];
            bias_v.as_ref().map_or(s, |b| s + b[i % hidden])
        })
        .collect();
    let g = gamma.to_f64_vec();
    let mut y = vec![0.0; sums.len()];
    let mut inv_stds = vec![];
    for (r, row) in sums.chunks(hidden).enumerate() {
        let mean_square = row.iter().map(|&p| p as f64 * p as f64).sum::<f64>() / hidden as f64;
        let inv_std = 1.0 / (mean_square + eps).sqrt();
        for (c, &p) in row.iter().enumerate() {
            y[r * hidden + c] = p as f64 * inv_std * g[c];
        }
        inv_stds.push(inv_std);
    }
    let mut stats_shape = x.shape.clone();
    stats_shape[x.rank() - 1] = 1;
    let rows = inv_stds.len();
    Ok(vec![
        float_tensor(x.dtype, x.shape.clone(), y),
        Tensor::from_f32(DType::F32, stats_shape.clone(), vec![0.0; rows]),
        float_tensor(DType::F32, stats_shape, inv_stds),
        Tensor::from_f32(x.dtype, x.shape.clone(), sums),
    ])
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use crate::attr::Attr;
    use crate::dtype::DType;
    use crate::tensor::Tensor;

    #[test]
    fn layer_norm_outputs_mean_and_inverse_std() {
        let x = f32t(&[1, 4], &[1.0, 2.0, 3.0, 4.0]);
        let (scale, bias) = (f32t(&[4], &[1.0, 1.0, 1.0, 2.0]), f32t(&[4], &[0.0, 0.0, 0.0, 1.0]));
        let y = run("LayerNormalization", &[("epsilon", Attr::Float(0.0))], &[Some(&x), Some(&scale), Some(&bias)], 3)
            .unwrap();
        // mean 2.5, variance 1.25, 1/sqrt(1.25) = 0.894427191.
        assert_close(&f32s(&y[0]), &[-1.341_640_8, -0.447_213_6, 0.447_213_6, 3.683_281_6], 1e-6);
        assert_eq!((y[1].shape.clone(), f32s(&y[1])), (vec![1, 1], vec![2.5]));
        assert_close(&f32s(&y[2]), &[0.894_427_2], 1e-7);
        let y = run(
            "LayerNormalization",
            &[("axis", Attr::Int(0)), ("epsilon", Attr::Float(0.0))],
            &[Some(&f32t(&[2, 1], &[0.0, 2.0])), Some(&f32t(&[1], &[1.0]))],
            1,
        )
        .unwrap();
        assert_eq!(f32s(&y[0]), vec![-1.0, 1.0]);
    }

    #[test]
    fn rms_norms_divide_by_the_root_mean_square() {
        let x = f32t(&[1, 2], &[3.0, 4.0]);
        let scale = f32t(&[2], &[1.0, 2.0]);
        // mean square 12.5, root 3.5355339.
        let y = run("SimplifiedLayerNormalization", &[("epsilon", Attr::Float(0.0))], &[Some(&x), Some(&scale)], 2)
            .unwrap();
        assert_close(&f32s(&y[0]), &[0.848_528_1, 2.262_741_7], 1e-6);
        assert_eq!(y[1].shape, vec![1, 1]);
        assert_close(&f32s(&y[1]), &[0.282_842_7], 1e-7);
        let ms = run_ms("SimplifiedLayerNormalization", &[("epsilon", Attr::Float(0.0))], &[Some(&x), Some(&scale)], 1)
            .unwrap();
        assert_eq!(f32s(&ms[0]), f32s(&y[0]));
        let half_scale = Tensor::from_f32(DType::F16, vec![2], vec![1.0, 2.0]);
        let y = run("RMSNormalization", &[("epsilon", Attr::Float(0.0))], &[Some(&x), Some(&half_scale)], 1).unwrap();
        // Y takes the scale's type: 0.8485281 and 2.2627417 rounded to f16.
        assert_eq!((y[0].dtype, f32s(&y[0])), (DType::F16, vec![0.848_632_8, 2.263_671_9]));
        let e = err_msg(run("RMSNormalization", &[], &[Some(&x), Some(&f32t(&[3], &[1.0; 3]))], 1));
        assert!(e.contains("does not broadcast"), "{e}");
    }

    #[test]
    fn skip_simplified_layer_norm_returns_the_sum_as_fourth_output() {
        let x = f32t(&[1, 2, 4], &[1.0, 2.0, 3.0, 4.0, 0.5, -1.0, 2.0, 0.25]);
        let skip = f32t(&[1, 2, 4], &[0.5, 0.5, -1.0, 2.0, 1.0, 1.0, 1.0, 1.0]);
        let gamma = f32t(&[4], &[1.0, 0.5, 2.0, -1.0]);
        let bias = f32t(&[4], &[0.1, 0.2, 0.3, 0.4]);
        let eps = [("epsilon", Attr::Float(1e-5))];
        let y =
            run_ms("SkipSimplifiedLayerNormalization", &eps, &[Some(&x), Some(&skip), Some(&gamma), Some(&bias)], 4)
                .unwrap();
        // onnxruntime 1.32's outputs for this case.
        let expected =
            [0.427_236_56, 0.360_480_84, 1.228_305_1, -1.708_946_2, 0.794_738_9, 0.049_671_18, 3.278_298, -0.819_574_5];
        assert_close(&f32s(&y[0]), &expected, 2e-6);
        assert_eq!((y[1].shape.clone(), f32s(&y[1])), (vec![1, 2, 1], vec![0.0, 0.0]));
        assert_close(&f32s(&y[2]), &[0.267_022_85, 0.496_711_8], 1e-7);
        assert_eq!(y[3].shape, vec![1, 2, 4]);
        assert_close(&f32s(&y[3]), &[1.6, 2.7, 2.3, 6.4, 1.6, 0.2, 3.3, 1.65], 1e-6);
        // A [S, hidden] skip broadcasts over the batch, as onnxruntime accepts.
        let skip2 = f32t(&[2, 4], &f32s(&skip));
        let y2 =
            run_ms("SkipSimplifiedLayerNormalization", &eps, &[Some(&x), Some(&skip2), Some(&gamma), Some(&bias)], 1)
                .unwrap();
        assert_eq!(f32s(&y2[0]), f32s(&y[0]));
        let e = err_msg(run_ms(
            "SkipSimplifiedLayerNormalization",
            &eps,
            &[Some(&x), Some(&skip), Some(&f32t(&[3], &[1.0; 3]))],
            1,
        ));
        assert!(e.contains("gamma"), "{e}");
    }
}

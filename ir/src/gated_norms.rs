//! The norms hybrid decoders keep around their recurrent layers — the L2 norm of the delta rule's
//! q and k (ai.onnx `LpNormalization` with p = 2) and the delta rule's output norm
//! (com.microsoft `GatedRMSNorm`) — step by step, plain and row-scaled, with every elementary
//! operation rounded by a given function. The reference evaluator passes the identity (the
//! row-scaled ops `L2NormRowScaled` and `GatedRmsNormRowScaled` of [`crate::fused`]); the fp16
//! simulation ([`crate::fp16sim`]) passes fp16's rounding, for the plain ops and the row-scaled
//! ones.
//!
//! In fp16 (normal range 2⁻¹⁴ to 65504, denormals flushed) the plain forms break on rows of
//! ordinary size: Σx² overflows once |x| ≳ 256 (the L2 norm becomes ∞ and the row 0), and a row
//! of |x| < 2⁻⁷ has every square flushed, so the L2 norm divides by zero and GatedRMSNorm by
//! √(0 + ε) with ε = 10⁻⁶ itself flushed. Divided by its [`row_scale`] c first, a row has
//! 1 ≤ max|u| < 2: Σu² ∈ [1, 4D), and GatedRMSNorm's ε becomes (√ε/c)², as in RmsNormRowScaled.

use crate::eval::{float_tensor, EvalError};
use crate::fused::{rms_norm_steps, row_scale, ROOT_FLOOR};
use crate::op::OpRef;
use crate::tensor::Tensor;

fn err(op: &OpRef, msg: impl Into<String>) -> EvalError {
    EvalError { node: op.node.to_string(), op: op.op.to_string(), msg: msg.into() }
}

/// The floor of the plain L2 norm's root: f32's smallest normal, 2⁻¹²⁶, as the intel-npu
/// target writes `x / max(‖x‖, tiny)`.
pub const PLAIN_L2_FLOOR: f64 = f32::MIN_POSITIVE as f64;

/// One row of the L2 norm with row scale `c` and root floor `floor` — `(1, PLAIN_L2_FLOOR)` for
/// the plain form, `(row_scale(x), ROOT_FLOOR)` for the row-scaled one —, every operation rounded
/// by `round`, in this order:
///
/// ```text
/// u_j = round(x_j / c)
/// s = 0; for each j: s = round(s + round(u_j · u_j))   (left to right)
/// r = round(max(round(√s), floor))
/// y_j = round(u_j / r)
/// ```
///
/// A row of zeros gives zeros in f32, as onnxruntime's LpNormalization does. In fp16 the plain
/// floor flushes to zero, and a row whose squares all flush divides by zero, as the device
/// does; the row-scaled floor 2⁻¹⁴ is an fp16 normal, and only a row of zeros (s = 0; any other
/// has s ≥ 1) reaches it.
pub fn l2_norm_steps(row: &[f64], (c, floor): (f64, f64), round: impl Fn(f64) -> f64) -> Vec<f64> {
    let u: Vec<f64> = row.iter().map(|&x| round(x / c)).collect();
    let mut s = 0.0;
    for &v in &u {
        s = round(s + round(v * v));
    }
    let r = round(round(s.sqrt()).max(floor));
    u.iter().map(|&v| round(v / r)).collect()
}

/// The L2 norm of every row of x's last axis, plain or row-scaled (see [`l2_norm_steps`]).
pub fn l2_norm_rows(op: &OpRef, x: &Tensor, row_scaled: bool, round: &dyn Fn(f64) -> f64) -> Result<Tensor, EvalError> {
    let d = match x.shape.last() {
        Some(&d) if d > 0 && x.dtype.is_float() => d,
        _ => return Err(err(op, format!("x must be a float tensor [.., D > 0], got {} {:?}", x.dtype, x.shape))),
    };
    let xv = x.to_f64_vec();
    let mut y = Vec::with_capacity(xv.len());
    for row in xv.chunks(d) {
        let scale = if row_scaled { (row_scale(row), ROOT_FLOOR) } else { (1.0, PLAIN_L2_FLOOR) };
        y.extend(l2_norm_steps(row, scale, round));
    }
    Ok(float_tensor(x.dtype, x.shape.clone(), y))
}

/// Whether an `LpNormalization` node is the L2 norm over the last axis of a rank-`rank` input,
/// the form the row-scaled op replaces.
pub fn is_last_axis_l2(attrs: &crate::Attrs, rank: usize) -> bool {
    let axis = attrs.int_or("axis", -1).unwrap_or(0);
    attrs.int_or("p", 2).unwrap_or(0) == 2 && rank >= 1 && (axis == -1 || axis == rank as i64 - 1)
}

/// GatedRMSNorm, plain or row-scaled: each group of C = len(γ) values of x's last axis is
/// RMS-normalised by [`rms_norm_steps`] (with its own [`row_scale`] when row-scaled), times γ,
/// then times act(gate) with act = silu (`silu`/`swish`, the default) or σ (`sigmoid`), every
/// operation rounded by `round`: σ = round(1 / round(1 + round(e^−g))), silu = round(g · σ),
/// y = round(n · act).
pub fn gated_rms_norm_rows(
    op: &OpRef,
    [x, gamma, gate]: [&Tensor; 3],
    row_scaled: bool,
    round: &dyn Fn(f64) -> f64,
) -> Result<Tensor, EvalError> {
    let eps = op.attrs.float_or("epsilon", 1e-5).map_err(|e| err(op, e.to_string()))? as f64;
    let silu = match op.attrs.str("activation").map_err(|e| err(op, e.to_string()))?.unwrap_or("silu") {
        "silu" | "swish" => true,
        "sigmoid" => false,
        a => return Err(err(op, format!("activation {a:?} is not one of silu, swish, sigmoid"))),
    };
    let c = match gamma.shape[..] {
        [c] if c > 0 => c,
        _ => return Err(err(op, format!("γ must be 1-D and non-empty, got shape {:?}", gamma.shape))),
    };
    if !x.dtype.is_float() || x.shape.last().is_none_or(|&w| w % c != 0) || gate.shape != x.shape {
        return Err(err(op, format!("x {:?} in groups of {c}, gate {:?}: shapes do not fit", x.shape, gate.shape)));
    }
    let (xv, gv, sv) = (x.to_f64_vec(), gate.to_f64_vec(), gamma.to_f64_vec());
    let mut y = Vec::with_capacity(xv.len());
    for (group, gates) in xv.chunks(c).zip(gv.chunks(c)) {
        let scale = if row_scaled { (row_scale(group), ROOT_FLOOR) } else { (1.0, 0.0) };
        let normed = rms_norm_steps(group, |j| sv[j], eps, scale, round);
        for (n, &g) in normed.iter().zip(gates) {
            let sigma = round(1.0 / round(1.0 + round((-g).exp())));
            let act = if silu { round(g * sigma) } else { sigma };
            y.push(round(n * act));
        }
    }
    Ok(float_tensor(x.dtype, x.shape.clone(), y))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attr::Attrs;
    use crate::dtype::DType;
    use crate::eval::eval_op;
    use crate::op::Domain;

    fn op<'a>(domain: Domain, name: &'a str, attrs: &'a Attrs) -> OpRef<'a> {
        OpRef { node: "n", domain, op: name, opset: 23, attrs }
    }

    fn close(a: &Tensor, b: &Tensor, tol: f64) {
        for (x, y) in a.to_f64_vec().iter().zip(b.to_f64_vec()) {
            assert!((x - y).abs() <= tol * y.abs().max(1.0), "{x} vs {y}");
        }
    }

    #[test]
    fn row_scaled_l2_norm_equals_lp_normalization_in_f32() {
        let x = Tensor::from_f32(
            DType::F32,
            vec![3, 4],
            vec![3e3, -4e3, 0.0, 1.0, 1e-4, 2e-4, -3e-4, 0.5, 0.0, 0.0, 0.0, 0.0],
        );
        let a = Attrs::default();
        let want = eval_op(&op(Domain::Onnx, "LpNormalization", &a), &[Some(&x)], 1).unwrap().remove(0);
        let got = l2_norm_rows(&op(Domain::Npuc, "L2NormRowScaled", &a), &x, true, &|v| v).unwrap();
        close(&got, &want, 1e-7);
        let plain = l2_norm_rows(&op(Domain::Onnx, "LpNormalization", &a), &x, false, &|v| v).unwrap();
        close(&plain, &want, 1e-7);
    }

    #[test]
    fn row_scaled_gated_rms_norm_equals_gated_rms_norm_in_f32() {
        let x = Tensor::from_f32(DType::F32, vec![1, 4], vec![1e-4, -2e-4, 3e3, 0.5]);
        let gate = Tensor::from_f32(DType::F32, vec![1, 4], vec![0.5, -1.0, 2.0, 0.0]);
        let gamma = Tensor::from_f32(DType::F32, vec![2], vec![1.5, -0.5]);
        let mut a = Attrs::default();
        a.set("epsilon", crate::Attr::Float(1e-6));
        let want = eval_op(&op(Domain::Microsoft, "GatedRMSNorm", &a), &[Some(&x), Some(&gamma), Some(&gate)], 1)
            .unwrap()
            .remove(0);
        let o = op(Domain::Npuc, "GatedRmsNormRowScaled", &a);
        close(&gated_rms_norm_rows(&o, [&x, &gamma, &gate], true, &|v| v).unwrap(), &want, 1e-6);
        close(&gated_rms_norm_rows(&o, [&x, &gamma, &gate], false, &|v| v).unwrap(), &want, 1e-6);
    }
}

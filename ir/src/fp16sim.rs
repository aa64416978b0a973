//! What an NPU computing in fp16 computes: a simulation of a program's numerics, to show where
//! fp16 overflows or underflows and that the `fp16-rescale` rules prevent it.
//!
//! The model of the device (Intel's NPU computes in fp16; OpenVINO IR segments for it keep
//! activations and weights in f16):
//! - Storage: every float tensor a node reads or writes is held in fp16 — rounded to nearest, ties
//!   to even, ±∞ beyond ±65504, and results below the smallest normal (2⁻¹⁴ ≈ 6.1·10⁻⁵) flushed to
//!   zero, as NPUs flush denormals.
//! - Elementwise ops and everything not listed below: computed exactly (the reference evaluator)
//!   from fp16 inputs and rounded once — for one elementwise operation that is fp16 arithmetic.
//!   Reductions (ReduceMean, Softmax, float MatMul) are thus taken to accumulate wider, as the
//!   MAC arrays and reduction units of NPUs do; they overflow only if their result does.
//! - The norms (`RmsNorm`, `SkipRmsNorm` and the row-scaled forms) step by step in fp16, in the
//!   order [`crate::fused::rms_norm_steps`] gives: every square, every partial sum of squares, the
//!   mean, ε, the root and each quotient is an fp16 value. This is where a residual of 4·10⁴
//!   overflows (its square is 1.6·10⁹) and a row of RMS 10⁻³ vanishes (its squares flush).
//! - `WGemm` (integer codes with per-block scales): within a block the products (code − z)·a and
//!   their running sum are fp16, the block's sum is then multiplied by its scale and accumulated
//!   over blocks in fp16 — an integer-weight dot product with fp16 activations, where a block of
//!   32 codes of magnitude up to 2^(bits−1) times activations of a few hundred passes 65504.
//! - The norms around hybrid decoders' recurrent layers — `LpNormalization` (p = 2, last axis:
//!   the delta rule's q/k norm), `GatedRMSNorm` and their row-scaled forms `L2NormRowScaled`,
//!   `GatedRmsNormRowScaled` — step by step in fp16 as [`crate::gated_norms`] orders them: a q
//!   row of magnitude 10³ overflows its Σx², a delta-rule output of 10⁻³ flushes its squares
//!   and ε = 10⁻⁶.
//! - `Attention` runs on the host in f32 (the KV cache is the host's): its fp16 inputs and its
//!   outputs rounded to fp16. So do the recurrent layers and mixtures of experts (`DeltaNet`,
//!   `CausalConv`, `Moe` and the ops they fold), which the intel-npu target computes as host
//!   steps between segments: the delta rule's decay products and its chunked triangular solve
//!   are f32 on the host, never fp16. `QGemm` is exact integer arithmetic; its float output is
//!   rounded.
//!
//! The simulation is the reference evaluator with this rounding, node by node
//! ([`crate::run::run_graph_with`]): slow, exact, and independent of any kernel.

use crate::eval::{eval_op, float_tensor, EvalError};
use crate::fused::{rms_norm_rows, row_scale, NBitsWeights};
use crate::gated_norms::{gated_rms_norm_rows, is_last_axis_l2, l2_norm_rows};
use crate::graph::Graph;
use crate::op::{Domain, OpRef};
use crate::run::{run_graph_with, RunError};
use crate::tensor::Tensor;
use std::collections::HashMap;

/// fp16's largest finite value.
pub const FP16_MAX: f64 = 65504.0;
/// fp16's smallest normal value, 2⁻¹⁴; anything smaller is flushed to zero.
pub const FP16_MIN_NORMAL: f64 = 6.103515625e-5;

/// `x` rounded to fp16: nearest, ties to even; ±∞ beyond the range; below the smallest normal,
/// zero with x's sign. NaN stays NaN.
pub fn round_fp16(x: f64) -> f64 {
    let r = half::f16::from_f64(x).to_f64();
    if r.abs() < FP16_MIN_NORMAL {
        0.0f64.copysign(x)
    } else {
        r
    }
}

/// A float tensor with every value rounded to fp16 (dtype unchanged); other tensors as they are.
pub fn to_fp16(t: &Tensor) -> Tensor {
    if !t.dtype.is_float() {
        return t.clone();
    }
    float_tensor(t.dtype, t.shape.clone(), t.to_f64_vec().into_iter().map(round_fp16).collect())
}

/// Runs `graph` as the fp16 device of the module doc would.
pub fn run_graph_fp16(graph: &Graph, inputs: &HashMap<String, Tensor>) -> Result<HashMap<String, Tensor>, RunError> {
    run_graph_with(graph, inputs, &mut eval_fp16)
}

/// One node in fp16: its float inputs stored in fp16, the op computed as the module doc says, its
/// float outputs stored in fp16.
pub fn eval_fp16(op: &OpRef, inputs: &[Option<&Tensor>], num_outputs: usize) -> Result<Vec<Tensor>, EvalError> {
    let stored: Vec<Option<Tensor>> = inputs.iter().map(|t| t.map(to_fp16)).collect();
    let args: Vec<Option<&Tensor>> = stored.iter().map(Option::as_ref).collect();
    let out = match (op.domain, op.op) {
        (Domain::Npuc, "RmsNorm" | "RmsNormRowScaled") => vec![norm(op, &args, None)?],
        (Domain::Npuc, "SkipRmsNorm" | "SkipRmsNormRowScaled") => skip_norm(op, &args, num_outputs)?,
        (Domain::Npuc, "WGemm" | "WGemmRowScaled") => vec![wgemm(op, &args)?],
        (Domain::Onnx, "LpNormalization") if is_last_axis_l2(op.attrs, input(op, &args, 0)?.rank()) => {
            vec![l2_norm_rows(op, input(op, &args, 0)?, false, &round_fp16)?]
        }
        (Domain::Npuc, "L2NormRowScaled") => vec![l2_norm_rows(op, input(op, &args, 0)?, true, &round_fp16)?],
        (Domain::Microsoft, "GatedRMSNorm") | (Domain::Npuc, "GatedRmsNormRowScaled") => {
            let xs = [input(op, &args, 0)?, input(op, &args, 1)?, input(op, &args, 2)?];
            vec![gated_rms_norm_rows(op, xs, op.domain == Domain::Npuc, &round_fp16)?]
        }
        _ => eval_op(op, &args, num_outputs)?,
    };
    Ok(out.iter().map(to_fp16).collect())
}

fn err(op: &OpRef, msg: impl Into<String>) -> EvalError {
    EvalError { node: op.node.to_string(), op: op.op.to_string(), msg: msg.into() }
}

fn input<'a>(op: &OpRef, args: &[Option<&'a Tensor>], i: usize) -> Result<&'a Tensor, EvalError> {
    args.get(i).copied().flatten().ok_or_else(|| err(op, format!("input {i} is missing")))
}

/// The norm of `x` (or of `sum` when given: SkipRmsNorm's residual sum) step by step in fp16.
fn norm(op: &OpRef, args: &[Option<&Tensor>], sum: Option<&Tensor>) -> Result<Tensor, EvalError> {
    let eps = op.attrs.float_or("epsilon", 1e-5).map_err(|e| err(op, e.to_string()))? as f64;
    let (x, gamma) = match sum {
        Some(s) => (s, input(op, args, 2)?),
        None => (input(op, args, 0)?, input(op, args, 1)?),
    };
    rms_norm_rows(op, x, gamma, eps, op.op.ends_with("RowScaled"), &round_fp16)
}

/// SkipRmsNorm: s = x + skip (+ bias), each addition an fp16 result; y = the norm of s.
fn skip_norm(op: &OpRef, args: &[Option<&Tensor>], num_outputs: usize) -> Result<Vec<Tensor>, EvalError> {
    let add = |a: &Tensor, b: &Tensor| -> Result<Tensor, EvalError> {
        let r = OpRef { node: op.node, domain: Domain::Onnx, op: "Add", opset: 23, attrs: &Default::default() };
        Ok(to_fp16(&eval_op(&r, &[Some(a), Some(b)], 1)?.swap_remove(0)))
    };
    let mut s = add(input(op, args, 0)?, input(op, args, 1)?)?;
    if let Some(bias) = args.get(3).copied().flatten() {
        s = add(&s, bias)?;
    }
    let y = norm(op, args, Some(&s))?;
    let mut out = vec![y, s];
    out.truncate(num_outputs.max(1));
    Ok(out)
}

/// `WGemm` / `WGemmRowScaled` (MatMulNBits layout: codes uint8 [N, blocks, block·bits/8] packed
/// along K low bits first; scales [N·blocks]; zero points packed uint8 or float, by default
/// 2^(bits−1)) with fp16 products and sums per block. The row-scaled form divides each row of a
/// by its [`row_scale`] first and multiplies the result back.
fn wgemm(op: &OpRef, args: &[Option<&Tensor>]) -> Result<Tensor, EvalError> {
    let (a, w, scales) = (input(op, args, 0)?, input(op, args, 1)?, input(op, args, 2)?);
    let (zp, bias) = (args.get(3).copied().flatten(), args.get(4).copied().flatten());
    let nb = NBitsWeights::new(op.attrs, w, scales, zp).map_err(|e| err(op, e.to_string()))?;
    let (k, n) = (nb.k, nb.n);
    if a.shape.last() != Some(&k) || !a.dtype.is_float() {
        return Err(err(op, format!("a must be float [.., K={k}], got {} {:?}", a.dtype, a.shape)));
    }
    let bias = bias.map(Tensor::to_f64_vec);
    let row_scaled = op.op.ends_with("RowScaled");
    let av = a.to_f64_vec();
    let mut y = Vec::with_capacity(av.len() / k * n);
    for row in av.chunks(k) {
        let c = if row_scaled { row_scale(row) } else { 1.0 };
        let u: Vec<f64> = row.iter().map(|&x| round_fp16(x / c)).collect();
        for col in 0..n {
            let mut acc = 0.0;
            for b in 0..nb.blocks {
                let z = nb.zero(col, b);
                let mut part = 0.0;
                let start = b * nb.block;
                for (kk, &uk) in u.iter().enumerate().take(k.min(start + nb.block)).skip(start) {
                    part = round_fp16(part + round_fp16((nb.code(col, kk) - z) * uk));
                }
                acc = round_fp16(acc + round_fp16(part * nb.scale(col, b)));
            }
            let mut v = if row_scaled { round_fp16(acc * c) } else { acc };
            if let Some(bias) = &bias {
                v = round_fp16(v + bias[col]);
            }
            y.push(v);
        }
    }
    let mut shape = a.shape.clone();
    *shape.last_mut().unwrap() = n;
    Ok(float_tensor(a.dtype, shape, y))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attr::{Attr, Attrs};
    use crate::dtype::DType;

    #[test]
    fn rounding_follows_fp16_range_ties_and_flush() {
        assert_eq!(round_fp16(65504.0), 65504.0);
        assert_eq!(round_fp16(65519.0), 65504.0);
        assert_eq!(round_fp16(65520.0), f64::INFINITY);
        assert_eq!(round_fp16(-1e9), f64::NEG_INFINITY);
        // 1 + 2⁻¹¹ is halfway between 1 and 1 + 2⁻¹⁰: ties to the even 1.
        assert_eq!(round_fp16(1.0 + 2f64.powi(-11)), 1.0);
        assert_eq!(round_fp16(1.0 + 3.0 * 2f64.powi(-11)), 1.0 + 2.0 * 2f64.powi(-10));
        assert_eq!(round_fp16(FP16_MIN_NORMAL), FP16_MIN_NORMAL);
        assert_eq!(round_fp16(1e-5), 0.0);
        assert!(round_fp16(-1e-5).is_sign_negative());
        assert!(round_fp16(f64::NAN).is_nan());
    }

    fn op<'a>(name: &'a str, attrs: &'a Attrs) -> OpRef<'a> {
        OpRef { node: "n", domain: Domain::Npuc, op: name, opset: 1, attrs }
    }

    fn eps() -> Attrs {
        let mut a = Attrs::default();
        a.set("epsilon", Attr::Float(1e-5));
        a
    }

    #[test]
    fn rmsnorm_of_a_large_row_overflows_and_the_row_scaled_form_does_not() {
        let x = Tensor::from_f32(DType::F32, vec![1, 4], vec![4.0e4, -3.0e4, 2.0e4, 1.0e4]);
        let g = Tensor::from_f32(DType::F32, vec![4], vec![1.0; 4]);
        let a = eps();
        let plain = eval_fp16(&op("RmsNorm", &a), &[Some(&x), Some(&g)], 1).unwrap().remove(0).to_f64_vec();
        assert!(plain.iter().all(|v| *v == 0.0), "x/∞ is zero: {plain:?}");
        let scaled = eval_fp16(&op("RmsNormRowScaled", &a), &[Some(&x), Some(&g)], 1).unwrap().remove(0).to_f64_vec();
        let rms = ((16.0e8 + 9.0e8 + 4.0e8 + 1.0e8) / 4.0f64).sqrt();
        for (v, x) in scaled.iter().zip([4.0e4, -3.0e4, 2.0e4, 1.0e4]) {
            assert!((v - x / rms).abs() < 2e-3, "{v} vs {}", x / rms);
        }
    }

    #[test]
    fn rmsnorm_of_a_tiny_row_divides_by_zero_and_the_row_scaled_form_does_not() {
        let row = [1.0e-3, -2.0e-3, 1.5e-3, -0.5e-3];
        let x = Tensor::from_f32(DType::F32, vec![1, 4], row.iter().map(|&v| v as f32).collect());
        let g = Tensor::from_f32(DType::F32, vec![4], vec![1.0; 4]);
        let a = eps();
        let plain = eval_fp16(&op("RmsNorm", &a), &[Some(&x), Some(&g)], 1).unwrap().remove(0).to_f64_vec();
        assert!(plain.iter().all(|v| v.is_infinite()), "every square and ε flush to zero: {plain:?}");
        let scaled = eval_fp16(&op("RmsNormRowScaled", &a), &[Some(&x), Some(&g)], 1).unwrap().remove(0).to_f64_vec();
        let rms = (row.iter().map(|v| v * v).sum::<f64>() / 4.0 + 1e-5).sqrt();
        for (v, x) in scaled.iter().zip(row) {
            assert!((v - x / rms).abs() < 2e-3 * (x / rms).abs().max(1.0), "{v} vs {}", x / rms);
        }
    }

    #[test]
    fn wgemm_block_sums_overflow_unless_rows_are_scaled() {
        // K = 32, N = 1, 4-bit codes all 15 (code − 8 = 7), scale 2⁻⁸, a = 400 everywhere:
        // the block sum 32·7·400 = 89600 passes 65504; the result 89600·2⁻⁸ = 350 does not.
        let mut attrs = Attrs::default();
        for (k, v) in [("K", 32), ("N", 1), ("bits", 4), ("block_size", 32)] {
            attrs.set(k, Attr::Int(v));
        }
        let a = Tensor::from_f32(DType::F32, vec![1, 32], vec![400.0; 32]);
        let w = Tensor::from_i64(DType::U8, vec![1, 1, 16], vec![0xff; 16]);
        let s = Tensor::from_f32(DType::F32, vec![1], vec![1.0 / 256.0]);
        let plain = eval_fp16(&op("WGemm", &attrs), &[Some(&a), Some(&w), Some(&s)], 1).unwrap().remove(0);
        assert_eq!(plain.to_f64_vec(), [f64::INFINITY]);
        let scaled = eval_fp16(&op("WGemmRowScaled", &attrs), &[Some(&a), Some(&w), Some(&s)], 1).unwrap().remove(0);
        // a/c = 1.5625; the 32 running sums reach 350, where an fp16 ulp is 0.25: at most 32
        // roundings of half an ulp away from the exact 350.
        let v = scaled.to_f64_vec()[0];
        assert!((v - 350.0).abs() <= 32.0 * 0.125, "{v}");
    }
}

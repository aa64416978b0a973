//! onnxruntime's gated combinations around hybrid and mixture-of-experts layers: GatedRMSNorm
//! (the Gated DeltaNet output norm) and GatedAdd (Qwen3.5-MoE's shared expert added to the routed
//! ones). Each output element is computed in f64 from the inputs and rounded once, except where
//! the op rounds an intermediate to the tensor type (GatedAdd's product).

use super::{float_tensor, require_float, round_f64, Ctx, Res};
use crate::dtype::DType;
use crate::tensor::Tensor;

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// GatedRMSNorm: `Y = X / √(mean(X²) + ε) · scale · act(gate)`, the mean over each contiguous
/// group of C = len(scale) elements of the last axis (a per-head norm on packed heads), with
/// `act` SiLU (`silu`, alias `swish`, the default) or `sigmoid`; ε defaults to 1e-5.
pub(super) fn gated_rms_norm(cx: &Ctx) -> Res<Vec<Tensor>> {
    let (x, scale, gate) = (cx.input(0, "X")?, cx.input(1, "scale")?, cx.input(2, "gate")?);
    for (t, what) in [(x, "X"), (scale, "scale"), (gate, "gate")] {
        require_float(t, what)?;
    }
    let silu = match cx.attrs().str("activation")?.unwrap_or("silu") {
        "silu" | "swish" => true,
        "sigmoid" => false,
        a => bail!("activation {a:?} is not one of silu, swish, sigmoid"),
    };
    let eps = cx.attrs().float_or("epsilon", 1e-5)? as f64;
    let c = match scale.shape[..] {
        [c] if c > 0 => c,
        _ => bail!("scale must be 1-D and non-empty, got shape {:?}", scale.shape),
    };
    if x.shape.last().is_none_or(|&w| w % c != 0) {
        bail!("X's last axis must be a multiple of the {c} scale values, got shape {:?}", x.shape);
    }
    if gate.shape != x.shape {
        bail!("gate must have X's shape {:?}, got {:?}", x.shape, gate.shape);
    }
    let (xv, sv, gv) = (x.to_f64_vec(), scale.to_f64_vec(), gate.to_f64_vec());
    let mut y = Vec::with_capacity(xv.len());
    for (group, gates) in xv.chunks(c).zip(gv.chunks(c)) {
        let inv_rms = 1.0 / (group.iter().map(|v| v * v).sum::<f64>() / c as f64 + eps).sqrt();
        for ((v, g), s) in group.iter().zip(gates).zip(&sv) {
            let act = if silu { g * sigmoid(*g) } else { sigmoid(*g) };
            y.push(v * inv_rms * s * act);
        }
    }
    Ok(vec![float_tensor(x.dtype, x.shape.clone(), y)])
}

/// GatedAdd in its plain mode: `X + round_T(Y · gate)` with gate `[..., 1]` (X's leading
/// dimensions, no broadcasting over them) scaling each row. The projected mode (a `gate_weight`
/// input) is onnxruntime's CUDA bfloat16 kernel alone and is refused.
pub(super) fn gated_add(cx: &Ctx) -> Res<Vec<Tensor>> {
    let (x, y, gate) = (cx.input(0, "X")?, cx.input(1, "Y")?, cx.input(2, "gate")?);
    if cx.opt(3).is_some() {
        bail!("gate_weight (the projected mode) is not supported: onnxruntime implements it on CUDA for bfloat16 only");
    }
    for (t, what) in [(x, "X"), (y, "Y"), (gate, "gate")] {
        require_float(t, what)?;
    }
    if y.shape != x.shape || x.rank() == 0 {
        bail!("Y must have X's shape {:?} (at least 1-D), got {:?}", x.shape, y.shape);
    }
    let lead = &x.shape[..x.rank() - 1];
    if gate.rank() != x.rank() || gate.shape[..lead.len()] != *lead || gate.shape[lead.len()] != 1 {
        bail!("gate must be {:?} (X's leading dimensions, then 1), got {:?}", [lead, &[1]].concat(), gate.shape);
    }
    let row = x.shape[x.rank() - 1].max(1);
    let (xv, yv, gv) = (x.to_f64_vec(), y.to_f64_vec(), gate.to_f64_vec());
    // The product is rounded to the tensor type first, as a separate Mul would.
    let product = |p: f64| if x.dtype == DType::F64 { p } else { round_f64(x.dtype, p) as f64 };
    let out = xv.iter().zip(&yv).enumerate().map(|(i, (a, b))| a + product(b * gv[i / row])).collect();
    Ok(vec![float_tensor(x.dtype, x.shape.clone(), out)])
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use crate::attr::Attr;

    #[test]
    fn gated_rms_norm_normalises_each_group_of_the_scale_s_length() {
        let (x, scale, gate) =
            (f32t(&[1, 4], &[3.0, 4.0, 1.0, 1.0]), f32t(&[2], &[1.0, 2.0]), f32t(&[1, 4], &[0.0; 4]));
        let out = run_ms(
            "GatedRMSNorm",
            &[("activation", Attr::Str("sigmoid".into())), ("epsilon", Attr::Float(0.0))],
            &[Some(&x), Some(&scale), Some(&gate)],
            1,
        )
        .unwrap();
        // Groups [3, 4] (rms √12.5) and [1, 1] (rms 1), each gated by sigmoid(0) = 1/2.
        let r = 12.5f32.sqrt();
        assert_close(&f32s(&out[0]), &[1.5 / r, 4.0 / r, 0.5, 1.0], 1e-6);
    }

    #[test]
    fn malformed_gated_ops_are_errors_naming_the_problem() {
        let (x, scale3) = (f32t(&[1, 4], &[1.0; 4]), f32t(&[3], &[1.0; 3]));
        let scale2 = f32t(&[2], &[1.0; 2]);
        let norm = |a: &[(&str, Attr)], inputs: &[Option<&_>]| err_msg(run_ms("GatedRMSNorm", a, inputs, 1));
        assert!(norm(&[], &[Some(&x), Some(&scale3), Some(&x)]).contains("multiple of the 3 scale values"));
        assert!(norm(&[], &[Some(&x), Some(&scale2), Some(&scale2)]).contains("gate must have X's shape"));
        assert!(norm(&[("activation", Attr::Str("tanh".into()))], &[Some(&x), Some(&scale2), Some(&x)])
            .contains("activation \"tanh\""));
        let (y, row_gate, bad_gate) = (f32t(&[1, 4], &[1.0; 4]), f32t(&[1, 1], &[0.5]), f32t(&[1, 2], &[0.5; 2]));
        let add = |inputs: &[Option<&_>]| err_msg(run_ms("GatedAdd", &[], inputs, 1));
        assert!(add(&[Some(&x), Some(&y), Some(&bad_gate)]).contains("gate must be [1, 1]"));
        assert!(add(&[Some(&x), Some(&y), Some(&row_gate), Some(&row_gate)]).contains("gate_weight"));
        let out = run_ms("GatedAdd", &[], &[Some(&x), Some(&y), Some(&row_gate)], 1).unwrap();
        assert_eq!(f32s(&out[0]), vec![1.5; 4]);
    }
}

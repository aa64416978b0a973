//! The recurrent layers of hybrid decoders: LinearAttention (output and recurrent state),
//! CausalConvWithState (output and carry state) and LinearAttentionGate (decay and beta, each of
//! its first input's shape). GatedRMSNorm, GatedAdd, MoE, QMoE and LpNormalization keep their
//! first input's shape and are dispatched to `like_first_input`.

use super::node::{opt, req, In, NodeCtx};
use super::value::{Ctx, Info};
use crate::error::ErrorKind;
use ir::{Dim, Domain};

fn positive(n: &NodeCtx, name: &str) -> Result<i64, ErrorKind> {
    match n.attr_int(name, 0)? {
        v if v > 0 => Ok(v),
        v => Err(n.bad(format!("{name} must be positive, got {v}"))),
    }
}

/// LinearAttention: output `[B, T, max(q_num_heads, kv_num_heads) · d_v]` in the query's dtype,
/// present state `[B, kv_num_heads, d_k, d_v]` (`d_k` divides the query width, `d_v` the value
/// width) in the past state's dtype, which it must agree with.
pub(super) fn linear_attention(n: &NodeCtx, ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    let (q, v) = (req(n, inputs, 0)?, req(n, inputs, 2)?);
    if q.shape.len() != 3 || v.shape.len() != 3 {
        return Err(n.shape_err("query and value must be [batch, tokens, heads * head_size]"));
    }
    let (hq, hkv) = (positive(n, "q_num_heads")?, positive(n, "kv_num_heads")?);
    let dk =
        q.shape[2].div_exact(&Dim::known(hq)).ok_or_else(|| n.shape_err("query width is not q_num_heads heads"))?;
    let dv =
        v.shape[2].div_exact(&Dim::known(hkv)).ok_or_else(|| n.shape_err("value width is not kv_num_heads heads"))?;
    let width = dv.mul(&Dim::known(hq.max(hkv))).ok_or_else(|| n.shape_err("overflow"))?;
    let mut outs = vec![Info::new(q.dtype, vec![q.shape[0].clone(), q.shape[1].clone(), width])];
    let state = vec![q.shape[0].clone(), Dim::known(hkv), dk, dv];
    let past = opt(inputs, 3);
    if let Some(p) = past.filter(|p| p.shape.len() == 4) {
        for (got, want) in p.shape.iter().zip(&state) {
            let got = ctx.normalize(got);
            if got.is_known() && want.is_known() && got != *want {
                return Err(n.shape_err(format!(
                    "past_state is {} where {want} is expected",
                    ir::dim::shape_to_string(&p.shape)
                )));
            }
            ctx.unify(&got, want);
        }
    }
    if n.num_outputs > 1 {
        outs.push(Info::new(past.map_or(q.dtype, |p| p.dtype), state));
    }
    Ok(outs)
}

/// CausalConvWithState: the output keeps the input's shape; the present state is the past
/// state's shape, or the input's with the sequence axis (2, or 1 when channels-last) holding
/// `(k − 1) · dilation` positions.
pub(super) fn causal_conv(n: &NodeCtx, _ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    let (x, w) = (req(n, inputs, 0)?, req(n, inputs, 1)?);
    let contrib = n.domain == Domain::Microsoft;
    let channels_last = contrib && n.attr_int("channels_last", 0)? != 0;
    if x.shape.len() < 3 || w.shape.len() != 3 {
        return Err(n.shape_err("input must be [batch, channels, length] and weight [channels, 1, k]"));
    }
    let mut outs = vec![Info::new(x.dtype, x.shape.clone())];
    if n.num_outputs > 1 {
        let state = match opt(inputs, 3) {
            Some(p) => p.shape.clone(),
            None => {
                let taps = w.shape[2].as_known().ok_or_else(|| n.shape_err("the kernel size must be known"))?;
                let dilation = if contrib { n.attr_int("dilation", 1)? } else { 1 };
                let mut s = x.shape.clone();
                s[if channels_last { 1 } else { 2 }] = Dim::known((taps - 1).max(0) * dilation.max(1));
                s
            }
        };
        outs.push(Info::new(opt(inputs, 3).map_or(x.dtype, |p| p.dtype), state));
    }
    Ok(outs)
}

/// LinearAttentionGate: decay and beta both have `a`'s dtype and shape.
pub(super) fn linear_attention_gate(n: &NodeCtx, _ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    let a = req(n, inputs, 0)?;
    Ok(vec![Info::new(a.dtype, a.shape.clone()); n.num_outputs.clamp(1, 2)])
}

#[cfg(test)]
mod tests {
    use crate::infer::testing::*;
    use ir::DType::*;

    /// The builder's Qwen3.5 layer: 2 query/key heads, 4 value heads (inverse grouping), f32 state.
    #[test]
    fn linear_attention_has_one_output_head_per_value_head_when_those_are_more() {
        let (q, k, v) = (
            value(F32, &["batch", "seq", "32"]),
            value(F32, &["batch", "seq", "32"]),
            value(F32, &["batch", "seq", "64"]),
        );
        let past = value(F32, &["batch", "4", "16", "16"]);
        let la = TestNode::contrib("la", "LinearAttention").int("q_num_heads", 2).int("kv_num_heads", 4).outputs(2);
        assert_eq!(la.types(&[&q, &k, &v, &past]), ["f32[batch,seq,64]", "f32[batch,4,16,16]"]);
        let wrong = value(F32, &["batch", "4", "8", "16"]);
        let err = la.refusal(&[&q, &k, &v, &wrong]);
        assert!(err.contains("past_state is [batch,4,8,16] where 16 is expected"), "{err}");
    }

    #[test]
    fn causal_conv_state_holds_k_minus_1_positions_times_the_dilation() {
        let (x, w) = (value(F16, &["batch", "6", "seq"]), value(F16, &["6", "1", "4"]));
        let conv = TestNode::contrib("conv", "CausalConvWithState").int("dilation", 2).outputs(2);
        assert_eq!(conv.types(&[&x, &w]), ["f16[batch,6,seq]", "f16[batch,6,6]"]);
        let last = value(F32, &["batch", "seq", "6"]);
        let conv = TestNode::contrib("conv", "CausalConvWithState").int("channels_last", 1).outputs(2);
        assert_eq!(conv.types(&[&last, &w]), ["f32[batch,seq,6]", "f32[batch,3,6]"]);
    }
}

//! The ops of hybrid decoders' recurrent layers and their gates: CausalConvWithState and
//! LinearAttention, and the fused CausalConv and DeltaNet the compiler folds them into (their
//! states bound to the sequence by `bind::recurrent_states`; each onto the same op as its
//! source spelling),
//! LinearAttentionGate (as a decay op and a sigmoid), GatedRMSNorm, LpNormalization, Sigmoid,
//! GatedAdd and MRotaryEmbedding. Forms the executor does not run are refused by name.

use super::{input, output, Builder};
use crate::exec::error::{node_fail, ExecError};
use crate::exec::plan::{LinearHeads, Loc, Op};
use crate::exec::program::NodeInfo;

/// An optional f32 input.
fn optional(b: &Builder<'_, '_>, node: &NodeInfo, slot: usize) -> Result<Option<usize>, ExecError> {
    node.input(slot).map(|_| b.f32_input(node, slot)).transpose()
}

/// The state slot input 3 is bound to.
fn state_slot(b: &Builder<'_, '_>, node: &NodeInfo) -> Result<usize, ExecError> {
    match b.locs[input(node, 3)?] {
        Loc::State(slot) => Ok(slot),
        other => Err(node_fail(node)(format!("past state is at {other:?}, not a sequence's state slot"))),
    }
}

/// Attributes that must keep their default for the executor to run the node.
fn require_defaults(node: &NodeInfo, defaults: &[(&str, i64)]) -> Result<(), ExecError> {
    for &(name, default) in defaults {
        if let Some(v) = node.attr_i64(name).filter(|&v| v != default) {
            return Err(node_fail(node)(format!("{name} = {v} is not supported (only {default})")));
        }
    }
    Ok(())
}

/// The last dimension of `v`, which must be fixed.
fn width(b: &Builder<'_, '_>, node: &NodeInfo, v: usize) -> Result<usize, ExecError> {
    b.dims(v)
        .last()
        .copied()
        .flatten()
        .ok_or_else(|| node_fail(node)(format!("`{}` needs a fixed last dimension", b.values[v].name)))
}

pub(super) fn causal_conv(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    let fail = node_fail(node);
    require_defaults(
        node,
        &[("ndim", 1), ("state_window", 0), ("dilation", 1), ("channels_last", 0), ("input_channel_offset", 0)],
    )?;
    let silu = match node.attr_str("activation").unwrap_or("none") {
        "none" => false,
        "silu" | "swish" => true,
        a => return Err(fail(format!("activation {a:?} is not one of none, silu, swish"))),
    };
    let (x, w, bias) = (b.f32_input(node, 0)?, b.f32_input(node, 1)?, optional(b, node, 2)?);
    let state = state_slot(b, node)?;
    let (xd, wd) = (b.dims(x), b.dims(w));
    let (channels, taps) = match (xd.get(1).copied().flatten(), &wd[..]) {
        (Some(c), &[Some(wc), Some(1), Some(k)]) if c == wc && k > 0 && xd.len() == 3 => (c, k),
        _ => return Err(fail(format!("input {xd:?} and weight {wd:?} are not [batch, C, tokens] and [C, 1, k]"))),
    };
    if b.cx.states[state].len != channels * (taps - 1) {
        return Err(fail(format!("the state is not [batch, {channels}, {}]", taps - 1)));
    }
    let out = output(node, 0)?;
    b.fresh(out);
    b.push(n, Op::CausalConv { x, w, bias, state, channels, taps, silu, out });
    Ok(())
}

pub(super) fn linear_attention(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    let fail = node_fail(node);
    require_defaults(node, &[("state_window", 0)])?;
    let (q, k, v) = (b.f32_input(node, 0)?, b.f32_input(node, 1)?, b.f32_input(node, 2)?);
    let (decay, beta) = (optional(b, node, 4)?, optional(b, node, 5)?);
    let rule = node.attr_str("update_rule").unwrap_or("gated_delta");
    let (gated, delta) = match rule {
        "linear" => (false, false),
        "gated" => (true, false),
        "delta" => (false, true),
        "gated_delta" => (true, true),
        r => return Err(fail(format!("update_rule {r:?} is not one of linear, gated, delta, gated_delta"))),
    };
    if (gated && decay.is_none()) || (delta && beta.is_none()) {
        return Err(fail(format!("update_rule {rule} needs its decay and beta inputs")));
    }
    let attr = |name: &str| node.attr_i64(name).filter(|&h| h > 0).map(|h| h as usize);
    let (Some(q_heads), Some(kv_heads)) = (attr("q_num_heads"), attr("kv_num_heads")) else {
        return Err(fail("q_num_heads and kv_num_heads must be positive".to_string()));
    };
    let heads = linear_heads(b, node, (q_heads, kv_heads), (q, k, v), decay.filter(|_| gated), beta.filter(|_| delta))?;
    let scale = match node.attr_f32("scale").unwrap_or(0.0) {
        0.0 => 1.0 / (heads.dk as f32).sqrt(),
        s => s,
    };
    let (decay, beta) = (decay.filter(|_| gated), beta.filter(|_| delta));
    push_linear_attention(b, n, node, LinearAttentionInputs { q, k, v, decay, beta, qk_l2norm_eps: None }, heads, scale)
}

/// The operands of a LinearAttention op.
struct LinearAttentionInputs {
    q: usize,
    k: usize,
    v: usize,
    decay: Option<usize>,
    beta: Option<usize>,
    /// DeltaNet's per-head L2 norm of q and k, with its ε.
    qk_l2norm_eps: Option<f32>,
}

/// Pushes the LinearAttention op of `node` once its heads and scale are known, its state checked
/// against the slot input 3 is bound to.
fn push_linear_attention(
    b: &mut Builder<'_, '_>,
    n: usize,
    node: &NodeInfo,
    x: LinearAttentionInputs,
    heads: LinearHeads,
    scale: f32,
) -> Result<(), ExecError> {
    let state = state_slot(b, node)?;
    if b.cx.states[state].len != heads.kv_heads * heads.dk * heads.dv {
        let (h, dk, dv) = (heads.kv_heads, heads.dk, heads.dv);
        return Err(node_fail(node)(format!("the state is not [batch, {h}, {dk}, {dv}]")));
    }
    let out = output(node, 0)?;
    b.fresh(out);
    let LinearAttentionInputs { q, k, v, decay, beta, qk_l2norm_eps } = x;
    b.push(n, Op::LinearAttention { q, k, v, decay, beta, qk_l2norm_eps, state, heads, scale, out });
    Ok(())
}

/// DeltaNet: the gated delta rule, LinearAttention's op with decay and beta and an explicit scale
/// (and with `qk_l2norm_eps`, q and k normalised per head first).
pub(super) fn delta_net(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    let fail = node_fail(node);
    let (q, k, v) = (b.f32_input(node, 0)?, b.f32_input(node, 1)?, b.f32_input(node, 2)?);
    let (decay, beta) = (b.f32_input(node, 4)?, b.f32_input(node, 5)?);
    let attr = |name: &str| node.attr_i64(name).filter(|&h| h > 0).map(|h| h as usize);
    let (Some(q_heads), Some(kv_heads)) = (attr("q_heads"), attr("kv_heads")) else {
        return Err(fail("q_heads and kv_heads must be positive".to_string()));
    };
    let scale = match node.attr_f32("scale") {
        Some(s) if s != 0.0 && s.is_finite() => s,
        s => return Err(fail(format!("scale must be given, finite and non-zero, got {s:?}"))),
    };
    let heads = linear_heads(b, node, (q_heads, kv_heads), (q, k, v), Some(decay), Some(beta))?;
    let qk_l2norm_eps = node.attr_f32("qk_l2norm_eps");
    if qk_l2norm_eps.is_some_and(|e| !e.is_finite() || e < 0.0) {
        return Err(fail(format!("qk_l2norm_eps must be finite and ≥ 0, got {qk_l2norm_eps:?}")));
    }
    let x = LinearAttentionInputs { q, k, v, decay: Some(decay), beta: Some(beta), qk_l2norm_eps };
    push_linear_attention(b, n, node, x, heads, scale)
}

/// The heads of a LinearAttention or DeltaNet node from its head counts and its operands'
/// widths, checked as the evaluator checks them.
fn linear_heads(
    b: &Builder<'_, '_>,
    node: &NodeInfo,
    (q_heads, kv_heads): (usize, usize),
    (q, k, v): (usize, usize, usize),
    decay: Option<usize>,
    beta: Option<usize>,
) -> Result<LinearHeads, ExecError> {
    let fail = node_fail(node);
    let (qw, kw, vw) = (width(b, node, q)?, width(b, node, k)?, width(b, node, v)?);
    let (dk, dv) = (qw / q_heads, vw / kv_heads);
    let k_heads = kw.checked_div(dk).unwrap_or(0);
    let grouped = if q_heads >= kv_heads {
        q_heads % kv_heads == 0 && k_heads == kv_heads
    } else {
        kv_heads % q_heads == 0 && k_heads > 0 && kv_heads % k_heads == 0
    };
    if dk == 0 || dv == 0 || qw != q_heads * dk || vw != kv_heads * dv || kw != k_heads * dk || !grouped {
        return Err(fail(format!("widths q {qw}, k {kw}, v {vw} do not fit {q_heads} query and {kv_heads} KV heads")));
    }
    let decay_per_key = match decay.map(|d| width(b, node, d)).transpose()? {
        Some(w) if w == kv_heads * dk && w != kv_heads => true,
        Some(w) if w == kv_heads => false,
        None => false,
        Some(w) => return Err(fail(format!("decay width {w} is neither {kv_heads} nor {}", kv_heads * dk))),
    };
    let beta_shared = match beta.map(|d| width(b, node, d)).transpose()? {
        Some(w) if w == kv_heads => false,
        Some(1) => true,
        None => false,
        Some(w) => return Err(fail(format!("beta width {w} is neither {kv_heads} nor 1"))),
    };
    Ok(LinearHeads { q_heads, k_heads, kv_heads, dk, dv, decay_per_key, beta_shared })
}

/// LinearAttentionGate: the decay (output 0) and, when asked for, beta = sigmoid(b) (output 1).
pub(super) fn linear_attention_gate(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    let (a, bias, scale) = (b.f32_input(node, 0)?, b.f32_input(node, 1)?, b.f32_input(node, 2)?);
    let heads = width(b, node, a)?;
    if b.dims(bias) != [Some(heads)] || b.dims(scale) != [Some(heads)] {
        return Err(node_fail(node)(format!("dt_bias and decay_scale must be [{heads}]")));
    }
    let out = output(node, 0)?;
    b.fresh(out);
    b.push(n, Op::DecayGate { a, bias, scale, out });
    if let Some(&beta) = node.outputs.get(1) {
        let x = b.f32_input(node, 3)?;
        b.fresh(beta);
        b.push(n, Op::Sigmoid { x, out: beta });
    }
    Ok(())
}

pub(super) fn sigmoid(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    let x = b.f32_input(node, 0)?;
    let out = output(node, 0)?;
    b.fresh(out);
    b.push(n, Op::Sigmoid { x, out });
    Ok(())
}

pub(super) fn gated_rms_norm(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    let (x, gamma, gate) = (b.f32_input(node, 0)?, b.f32_input(node, 1)?, b.f32_input(node, 2)?);
    let silu = match node.attr_str("activation").unwrap_or("silu") {
        "silu" | "swish" => true,
        "sigmoid" => false,
        a => return Err(node_fail(node)(format!("activation {a:?} is not one of silu, swish, sigmoid"))),
    };
    let out = output(node, 0)?;
    b.fresh(out);
    let eps = node.attr_f32("epsilon").unwrap_or(1e-5);
    b.push(n, Op::GatedRmsNorm { x, gamma, gate, eps, silu, out });
    Ok(())
}

/// LpNormalization with p = 2 along the last axis.
pub(super) fn lp_normalization(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    let x = b.f32_input(node, 0)?;
    let rank = b.dims(x).len() as i64;
    let (axis, p) = (node.attr_i64("axis").unwrap_or(-1), node.attr_i64("p").unwrap_or(2));
    if p != 2 || (axis != -1 && axis != rank - 1) {
        return Err(node_fail(node)(format!("p = {p}, axis = {axis}: the executor runs p = 2 along the last axis")));
    }
    let width = width(b, node, x)?;
    let out = output(node, 0)?;
    b.fresh(out);
    b.push(n, Op::L2Norm { x, width, out });
    Ok(())
}

pub(super) fn gated_add(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    if node.input(3).is_some() {
        return Err(node_fail(node)("gate_weight (the projected mode) is not supported".to_string()));
    }
    let (x, y, gate) = (b.f32_input(node, 0)?, b.f32_input(node, 1)?, b.f32_input(node, 2)?);
    if width(b, node, gate)? != 1 {
        return Err(node_fail(node)("the gate must be one value per row".to_string()));
    }
    let out = output(node, 0)?;
    b.fresh(out);
    b.push(n, Op::GatedAdd { x, y, gate, out });
    Ok(())
}

/// MRotaryEmbedding of `[batch, tokens, heads·head]` reading `position_ids` (the step's).
pub(super) fn m_rotary_embedding(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    let fail = node_fail(node);
    require_defaults(node, &[("interleaved", 0), ("is_packed_batching", 0)])?;
    let x = b.f32_input(node, 0)?;
    if b.locs[input(node, 1)?] != Loc::Positions {
        return Err(fail("position_ids must be the step's positions (a text-only step)".to_string()));
    }
    let (cos, sin) = (b.f32_input(node, 2)?, b.f32_input(node, 3)?);
    let half = match (&b.dims(cos)[..], b.dims(sin) == b.dims(cos)) {
        (&[Some(_), Some(h)], true) if h > 0 => h,
        _ => return Err(fail("cos and sin caches must be one [positions, rot/2] shape".to_string())),
    };
    let heads = node.attr_i64("num_heads").filter(|&h| h > 0).map(|h| h as usize);
    let rot = node.attr_i64("rotary_embedding_dim").unwrap_or(0).max(0) as usize;
    let sections: i64 = node.attr_ints("mrope_section").map_or(0, |s| s.iter().sum());
    let (w, heads) = (width(b, node, x)?, heads.unwrap_or(0));
    let head = w.checked_div(heads).unwrap_or(0);
    if heads == 0 || head * heads != w || 2 * half > head || (rot != 0 && rot != 2 * half) || sections != half as i64 {
        return Err(fail(format!("width {w}, {heads} heads, rotary dim {rot} and caches of {half} disagree")));
    }
    let out = output(node, 0)?;
    b.fresh(out);
    b.push(n, Op::MRope { x, cos, sin, heads, head, half, out });
    Ok(())
}

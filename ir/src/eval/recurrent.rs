//! The recurrent layers of hybrid decoders: LinearAttention (com.microsoft, and ai.onnx from
//! opset 27) with its gate projections (com.microsoft LinearAttentionGate), and the stateful
//! causal depthwise convolution CausalConvWithState (both domains) that Gated DeltaNet (Qwen3.5)
//! and LFM2's short convolutions run on.
//!
//! Both ops are defined as a sequential recurrence over the tokens; the evaluator runs exactly
//! that, token by token in f64, whatever `chunk_size` says (a tuning hint for chunk-parallel
//! kernels that does not change the result). States are read and written in f64 and rounded once
//! to their dtype. The per-position state windows (`state_window`) and the CUDA-only extensions
//! are refused by name: onnxruntime's CPU provider refuses them too.

use super::layout::checked_numel;
use super::{float_tensor, require_float, Ctx, Res};
use crate::op::Domain;
use crate::tensor::Tensor;

/// Which terms of the gated delta rule a LinearAttention node keeps.
#[derive(Clone, Copy, PartialEq)]
enum UpdateRule {
    Linear,
    Gated,
    Delta,
    GatedDelta,
}

impl UpdateRule {
    fn parse(s: &str) -> Res<UpdateRule> {
        Ok(match s {
            "linear" => UpdateRule::Linear,
            "gated" => UpdateRule::Gated,
            "delta" => UpdateRule::Delta,
            "gated_delta" => UpdateRule::GatedDelta,
            _ => bail!("update_rule {s:?} is not one of linear, gated, delta, gated_delta"),
        })
    }

    fn gated(self) -> bool {
        matches!(self, UpdateRule::Gated | UpdateRule::GatedDelta)
    }

    fn delta(self) -> bool {
        matches!(self, UpdateRule::Delta | UpdateRule::GatedDelta)
    }
}

/// A LinearAttention node's sizes: batch, tokens, query/key/value/output heads, key and value
/// head sizes, and whether decay is per key dimension and beta shared by the heads.
struct Geometry {
    batch: usize,
    tokens: usize,
    q_heads: usize,
    k_heads: usize,
    kv_heads: usize,
    out_heads: usize,
    dk: usize,
    dv: usize,
    decay_per_key: bool,
    beta_shared: bool,
}

impl Geometry {
    /// The query head an output head reads, and the key and state (value) heads it uses.
    fn heads_of_output(&self, o: usize) -> (usize, usize) {
        if self.q_heads >= self.kv_heads {
            (o, o / (self.q_heads / self.kv_heads))
        } else {
            (o / (self.kv_heads / self.q_heads), o)
        }
    }

    fn key_head_of(&self, h: usize) -> usize {
        h / (self.kv_heads / self.k_heads)
    }
}

fn positive_attr(cx: &Ctx, name: &str) -> Res<usize> {
    match cx.attrs().int(name)? {
        Some(v) if v > 0 => Ok(v as usize),
        Some(v) => bail!("{name} must be positive, got {v}"),
        None => bail!("attribute {name} is required"),
    }
}

/// Reads and checks the geometry: packed `[B, T, heads·size]` query, key and value; grouped
/// query heads (the query heads a multiple of the KV heads) or, in com.microsoft's op, inverse
/// grouping (the KV heads a multiple of the query heads; keys then have the query's heads or the
/// KV heads, and there is one output head per KV head).
fn geometry(cx: &Ctx, q: &Tensor, k: &Tensor, v: &Tensor) -> Res<Geometry> {
    let (q_heads, kv_heads) = (positive_attr(cx, "q_num_heads")?, positive_attr(cx, "kv_num_heads")?);
    for (t, what) in [(q, "query"), (k, "key"), (v, "value")] {
        require_float(t, what)?;
        if t.rank() != 3 {
            bail!("{what} must be 3-D [batch, tokens, heads * head_size], got shape {:?}", t.shape);
        }
    }
    if k.shape[..2] != q.shape[..2] || v.shape[..2] != q.shape[..2] {
        bail!("query {:?}, key {:?} and value {:?} disagree on batch and tokens", q.shape, k.shape, v.shape);
    }
    let inverse = q_heads < kv_heads;
    if (!inverse && q_heads % kv_heads != 0) || (inverse && (cx.op.domain == Domain::Onnx || kv_heads % q_heads != 0)) {
        bail!("q_num_heads {q_heads} must be a multiple of kv_num_heads {kv_heads}");
    }
    let split = |width: usize, heads: usize, what: &str| -> Res<usize> {
        if width == 0 || !width.is_multiple_of(heads) {
            bail!("{what} width {width} is not a positive multiple of {heads} heads");
        }
        Ok(width / heads)
    };
    let dk = split(q.shape[2], q_heads, "query")?;
    let dv = split(v.shape[2], kv_heads, "value")?;
    if !k.shape[2].is_multiple_of(dk) {
        bail!("key width {} is not a multiple of the query's head size {dk}", k.shape[2]);
    }
    let k_heads = k.shape[2] / dk;
    let keys_ok = if inverse { k_heads >= q_heads && kv_heads.is_multiple_of(k_heads) } else { k_heads == kv_heads };
    if !keys_ok {
        bail!("key width {} is {k_heads} heads of the query's head size {dk}, not {kv_heads} KV heads", k.shape[2]);
    }
    let (batch, tokens) = (q.shape[0], q.shape[1]);
    let out_heads = q_heads.max(kv_heads);
    Ok(Geometry {
        batch,
        tokens,
        q_heads,
        k_heads,
        kv_heads,
        out_heads,
        dk,
        dv,
        decay_per_key: false,
        beta_shared: false,
    })
}

/// Checks decay (`[B, T, H_kv]` per head or `[B, T, H_kv·d_k]` per key dimension) and beta
/// (`[B, T, H_kv]` or `[B, T, 1]`), each required when the rule uses it.
fn check_gates(g: &mut Geometry, rule: UpdateRule, decay: Option<&Tensor>, beta: Option<&Tensor>) -> Res<()> {
    let bt = [g.batch, g.tokens];
    if rule.gated() {
        let Some(d) = decay else { bail!("decay (input 4) is required by the gated update rules") };
        require_float(d, "decay")?;
        let per_head = d.shape == [bt[0], bt[1], g.kv_heads];
        g.decay_per_key = d.shape == [bt[0], bt[1], g.kv_heads * g.dk];
        if !per_head && !g.decay_per_key {
            bail!("decay must be [B, T, {}] or [B, T, {}], got {:?}", g.kv_heads, g.kv_heads * g.dk, d.shape);
        }
    }
    if rule.delta() {
        let Some(b) = beta else { bail!("beta (input 5) is required by the delta update rules") };
        require_float(b, "beta")?;
        g.beta_shared = b.shape == [bt[0], bt[1], 1];
        if !g.beta_shared && b.shape != [bt[0], bt[1], g.kv_heads] {
            bail!("beta must be [B, T, {}] or [B, T, 1], got {:?}", g.kv_heads, b.shape);
        }
    }
    Ok(())
}

/// LinearAttention: per KV head h a `d_k × d_v` state S, and for each token t in order
///
/// ```text
/// S ← exp(g_t) ⊙ S                              (gated rules; g per head or per key row)
/// S ← S + k_t ⊗ β_t (v_t − Sᵀ k_t)              (delta rules; the others add k_t ⊗ v_t)
/// o_t = scale · Sᵀ q_t                           (scale 0 means 1/√d_k)
/// ```
///
/// Output `[B, T, max(H_q, H_kv)·d_v]` in the query's dtype, present state `[B, H_kv, d_k, d_v]`
/// in the past state's dtype (the query's when there is none).
pub(super) fn linear_attention(cx: &Ctx) -> Res<Vec<Tensor>> {
    let (q, k, v) = (cx.input(0, "query")?, cx.input(1, "key")?, cx.input(2, "value")?);
    let (past, decay, beta) = (cx.opt(3), cx.opt(4), cx.opt(5));
    let rule = UpdateRule::parse(cx.attrs().str("update_rule")?.unwrap_or("gated_delta"))?;
    if cx.attrs().int_or("state_window", 0)? != 0 {
        bail!("state_window > 0 (per-token state windows) is not supported; onnxruntime runs it on CUDA only");
    }
    let mut g = geometry(cx, q, k, v)?;
    check_gates(&mut g, rule, decay, beta)?;
    let state_shape = vec![g.batch, g.kv_heads, g.dk, g.dv];
    let out_shape = vec![g.batch, g.tokens, g.out_heads * g.dv];
    checked_numel(&state_shape)?;
    checked_numel(&out_shape)?;
    let mut state = match past {
        Some(p) => {
            require_float(p, "past_state")?;
            if p.shape != state_shape {
                bail!("past_state must be {state_shape:?} [B, H_kv, d_k, d_v], got {:?}", p.shape);
            }
            p.to_f64_vec()
        }
        None => vec![0.0; state_shape.iter().product()],
    };
    let scale = match cx.attrs().float_or("scale", 0.0)? {
        0.0 => 1.0 / (g.dk as f64).sqrt(),
        s => s as f64,
    };
    let inputs = Recurrence {
        q: q.to_f64_vec(),
        k: k.to_f64_vec(),
        v: v.to_f64_vec(),
        decay: decay.filter(|_| rule.gated()).map(Tensor::to_f64_vec),
        beta: beta.filter(|_| rule.delta()).map(Tensor::to_f64_vec),
    };
    let out = recur(&g, scale, &inputs, &mut state);
    let state_dtype = past.map_or(q.dtype, |p| p.dtype);
    Ok(vec![float_tensor(q.dtype, out_shape, out), float_tensor(state_dtype, state_shape, state)])
}

/// A LinearAttention node's inputs, widened.
struct Recurrence {
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
    decay: Option<Vec<f64>>,
    beta: Option<Vec<f64>>,
}

/// Runs the recurrence over every token, updating `state` in place; returns the outputs.
fn recur(g: &Geometry, scale: f64, x: &Recurrence, state: &mut [f64]) -> Vec<f64> {
    let (dk, dv) = (g.dk, g.dv);
    let mut out = vec![0.0; g.batch * g.tokens * g.out_heads * dv];
    let mut retrieved = vec![0.0; dv];
    for b in 0..g.batch {
        for t in 0..g.tokens {
            let row = b * g.tokens + t;
            for h in 0..g.kv_heads {
                let s = &mut state[(b * g.kv_heads + h) * dk * dv..][..dk * dv];
                let key = &x.k[(row * g.k_heads + g.key_head_of(h)) * dk..][..dk];
                if let Some(decay) = &x.decay {
                    for i in 0..dk {
                        let gi = if g.decay_per_key {
                            decay[(row * g.kv_heads + h) * dk + i]
                        } else {
                            decay[row * g.kv_heads + h]
                        };
                        s[i * dv..(i + 1) * dv].iter_mut().for_each(|e| *e *= gi.exp());
                    }
                }
                let value = &x.v[(row * g.kv_heads + h) * dv..][..dv];
                let rate = x.beta.as_ref().map(|b| if g.beta_shared { b[row] } else { b[row * g.kv_heads + h] });
                for (j, r) in retrieved.iter_mut().enumerate() {
                    *r = match rate {
                        Some(beta) => beta * (value[j] - (0..dk).map(|i| s[i * dv + j] * key[i]).sum::<f64>()),
                        None => value[j],
                    };
                }
                for i in 0..dk {
                    for j in 0..dv {
                        s[i * dv + j] += key[i] * retrieved[j];
                    }
                }
            }
            for o in 0..g.out_heads {
                let (qh, h) = g.heads_of_output(o);
                let s = &state[(b * g.kv_heads + h) * dk * dv..][..dk * dv];
                let query = &x.q[(row * g.q_heads + qh) * dk..][..dk];
                for j in 0..dv {
                    out[(row * g.out_heads + o) * dv + j] =
                        scale * (0..dk).map(|i| s[i * dv + j] * query[i]).sum::<f64>();
                }
            }
        }
    }
    out
}

/// `ln(1 + eˣ)` without overflow.
fn softplus(x: f64) -> f64 {
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// LinearAttentionGate: `decay = decay_scale[h] · softplus(a + dt_bias[h])` over the last axis
/// (H), and `beta = sigmoid(b)` when b is given; both in a's dtype, computed in f64.
pub(super) fn linear_attention_gate(cx: &Ctx) -> Res<Vec<Tensor>> {
    let (a, dt_bias, decay_scale) = (cx.input(0, "a")?, cx.input(1, "dt_bias")?, cx.input(2, "decay_scale")?);
    require_float(a, "a")?;
    let heads = match a.shape.last() {
        Some(&h) if h > 0 => h,
        _ => bail!("a must end in a positive head axis, got shape {:?}", a.shape),
    };
    for (p, what) in [(dt_bias, "dt_bias"), (decay_scale, "decay_scale")] {
        require_float(p, what)?;
        if p.shape != [heads] {
            bail!("{what} must be [{heads}] (one value per head), got {:?}", p.shape);
        }
    }
    let (bias, scale) = (dt_bias.to_f64_vec(), decay_scale.to_f64_vec());
    let decay: Vec<f64> =
        a.to_f64_vec().iter().enumerate().map(|(i, &x)| scale[i % heads] * softplus(x + bias[i % heads])).collect();
    let mut outs = vec![float_tensor(a.dtype, a.shape.clone(), decay)];
    if cx.num_outputs > 1 {
        let Some(b) = cx.opt(3) else { bail!("output beta needs input b (3)") };
        require_float(b, "b")?;
        if b.shape != a.shape {
            bail!("b must have a's shape {:?}, got {:?}", a.shape, b.shape);
        }
        outs.push(float_tensor(a.dtype, b.shape.clone(), b.to_f64_vec().into_iter().map(sigmoid).collect()));
    }
    Ok(outs)
}

/// A CausalConvWithState node's layout: batch, channels, tokens, kernel taps, dilation, and
/// whether activations and states are channels-last (`[B, L, channels…]`).
struct ConvGeometry {
    batch: usize,
    channels: usize,
    tokens: usize,
    taps: usize,
    dilation: usize,
    channels_last: bool,
}

impl ConvGeometry {
    fn state_len(&self) -> usize {
        (self.taps - 1) * self.dilation
    }

    /// The flat index of (batch, channel, position) in a tensor of `len` positions.
    fn at(&self, b: usize, c: usize, pos: usize, len: usize) -> usize {
        if self.channels_last {
            (b * len + pos) * self.channels + c
        } else {
            (b * self.channels + c) * len + pos
        }
    }

    /// The shape of a tensor of `len` positions laid out like `input`.
    fn shape(&self, input: &Tensor, len: usize) -> Vec<usize> {
        let mut s = input.shape.clone();
        s[if self.channels_last { 1 } else { 2 }] = len;
        s
    }
}

/// The attributes onnxruntime's CUDA kernel alone implements, refused unless at their defaults.
fn refuse_cuda_only_conv_attrs(cx: &Ctx) -> Res<()> {
    for (name, default) in [
        ("ndim", 1),
        ("state_window", 0),
        ("state_update_capacity", 0),
        ("state_length", 0),
        ("input_channel_offset", 0),
        ("input_channels", 0),
        ("state_channels_last", -1),
    ] {
        let v = cx.attrs().int_or(name, default)?;
        if v != default {
            bail!("{name} = {v} is not supported (only {name} = {default}: the others are CUDA-only or multi-dimensional)");
        }
    }
    Ok(())
}

fn conv_geometry(cx: &Ctx, x: &Tensor, w: &Tensor) -> Res<ConvGeometry> {
    let contrib = cx.op.domain == Domain::Microsoft;
    let channels_last = contrib && cx.attrs().int_or("channels_last", 0)? != 0;
    let dilation = if contrib { cx.attrs().int_or("dilation", 1)? } else { 1 };
    if !(1..=1 << 20).contains(&dilation) {
        bail!("dilation must be at least 1, got {dilation}");
    }
    require_float(x, "input")?;
    require_float(w, "weight")?;
    if x.rank() != 3 && !(channels_last && x.rank() > 3) {
        bail!(
            "input must be 3-D [batch, channels, length] (channels-last: [batch, length, channels...]), got {:?}",
            x.shape
        );
    }
    let (batch, tokens) = (x.shape[0], if channels_last { x.shape[1] } else { x.shape[2] });
    let channels = if channels_last { x.shape[2..].iter().product() } else { x.shape[1] };
    if w.rank() != 3 || w.shape[0] != channels || w.shape[1] != 1 || w.shape[2] == 0 {
        bail!("weight must be [{channels}, 1, k] with k >= 1, got {:?}", w.shape);
    }
    Ok(ConvGeometry { batch, channels, tokens, taps: w.shape[2], dilation: dilation as usize, channels_last })
}

/// CausalConvWithState: a depthwise causal convolution over the sequence the past state (zeros
/// when absent) and the input make together; output position t reads positions
/// `t − (k−1−j)·dilation` for tap j, adds the bias and applies the activation (`none`, `silu` or
/// its alias `swish`). The present state is the last `(k−1)·dilation` positions of that sequence.
pub(super) fn causal_conv_with_state(cx: &Ctx) -> Res<Vec<Tensor>> {
    let (x, w) = (cx.input(0, "input")?, cx.input(1, "weight")?);
    if cx.op.domain == Domain::Microsoft {
        refuse_cuda_only_conv_attrs(cx)?;
    }
    let silu = match cx.attrs().str("activation")?.unwrap_or("none") {
        "none" => false,
        "silu" | "swish" => true,
        a => bail!("activation {a:?} is not one of none, silu, swish"),
    };
    let g = conv_geometry(cx, x, w)?;
    let state_shape = g.shape(x, g.state_len());
    checked_numel(&state_shape)?;
    let bias = match cx.opt(2) {
        Some(b) if b.shape != [g.channels] || !b.dtype.is_float() => {
            bail!("bias must be a float [{}], got {} {:?}", g.channels, b.dtype, b.shape)
        }
        Some(b) => b.to_f64_vec(),
        None => vec![0.0; g.channels],
    };
    let past = match cx.opt(3) {
        Some(p) if p.shape != state_shape || !p.dtype.is_float() => {
            bail!("past_state must be a float {state_shape:?}, got {} {:?}", p.dtype, p.shape)
        }
        Some(p) => p.to_f64_vec(),
        None => vec![0.0; state_shape.iter().product()],
    };
    let (xv, wv) = (x.to_f64_vec(), w.to_f64_vec());
    let (s, k) = (g.state_len(), g.taps);
    let mut out = vec![0.0; xv.len()];
    let mut present = vec![0.0; past.len()];
    for b in 0..g.batch {
        for c in 0..g.channels {
            // Position p of the sequence past ++ input.
            let seq = |p: usize| if p < s { past[g.at(b, c, p, s)] } else { xv[g.at(b, c, p - s, g.tokens)] };
            for t in 0..g.tokens {
                let acc: f64 =
                    (0..k).map(|j| wv[c * k + j] * seq(s + t - (k - 1 - j) * g.dilation)).sum::<f64>() + bias[c];
                out[g.at(b, c, t, g.tokens)] = if silu { acc * sigmoid(acc) } else { acc };
            }
            for p in 0..s {
                present[g.at(b, c, p, s)] = seq(g.tokens + p);
            }
        }
    }
    let state_dtype = cx.opt(3).map_or(x.dtype, |p| p.dtype);
    Ok(vec![float_tensor(x.dtype, x.shape.clone(), out), float_tensor(state_dtype, state_shape, present)])
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use crate::attr::Attr;
    use crate::tensor::Tensor;

    fn heads(q: i64, kv: i64) -> Vec<(&'static str, Attr)> {
        vec![("q_num_heads", Attr::Int(q)), ("kv_num_heads", Attr::Int(kv))]
    }

    /// One token, one head, the linear rule: S = k ⊗ v on a zero state and o = scale · Sᵀ q.
    #[test]
    fn linear_rule_adds_the_outer_product_and_reads_it_with_the_query() {
        let (q, k, v) = (f32t(&[1, 1, 2], &[1.0, 2.0]), f32t(&[1, 1, 2], &[3.0, 4.0]), f32t(&[1, 1, 1], &[0.5]));
        let mut a = heads(1, 1);
        a.extend([("update_rule", Attr::Str("linear".into())), ("scale", Attr::Float(2.0))]);
        let out = run_ms("LinearAttention", &a, &[Some(&q), Some(&k), Some(&v)], 2).unwrap();
        // S = [[1.5], [2.0]]; o = 2 · (1·1.5 + 2·2.0) = 11.
        assert_eq!((f32s(&out[0]), f32s(&out[1])), (vec![11.0], vec![1.5, 2.0]));
    }

    /// A 2-token input to a 4-tap convolution: the present state keeps the past's last value.
    #[test]
    fn causal_conv_state_spans_past_and_input_when_the_input_is_short() {
        let x = f32t(&[1, 1, 2], &[10.0, 20.0]);
        let (w, past) = (f32t(&[1, 1, 4], &[1.0, 0.0, 0.0, 1.0]), f32t(&[1, 1, 3], &[1.0, 2.0, 3.0]));
        let out = run_ms("CausalConvWithState", &[], &[Some(&x), Some(&w), None, Some(&past)], 2).unwrap();
        // Sequence 1 2 3 10 20: outputs 1 + 10 and 2 + 20; state 3 10 20.
        assert_eq!((f32s(&out[0]), f32s(&out[1])), (vec![11.0, 22.0], vec![3.0, 10.0, 20.0]));
    }

    fn linear_attention_error(domain_onnx: bool, a: &[(&str, Attr)], inputs: &[Option<&Tensor>]) -> String {
        if domain_onnx {
            err_msg(run_at("LinearAttention", 27, a, inputs, 2))
        } else {
            err_msg(run_ms("LinearAttention", a, inputs, 2))
        }
    }

    /// Whether the node is ai.onnx's, its attributes, its inputs, and the error expected.
    type Case<'t> = (bool, Vec<(&'static str, Attr)>, Vec<Option<&'t Tensor>>, &'static str);

    #[test]
    fn malformed_linear_attention_is_an_error_naming_the_problem() {
        let (q, k, v) = (f32t(&[1, 2, 8], &[0.5; 16]), f32t(&[1, 2, 4], &[0.5; 8]), f32t(&[1, 2, 6], &[0.5; 12]));
        let (decay, beta) = (f32t(&[1, 2, 1], &[-0.1; 2]), f32t(&[1, 2, 1], &[0.5; 2]));
        let all = [Some(&q), Some(&k), Some(&v), None, Some(&decay), Some(&beta)];
        let cases: Vec<Case> = vec![
            (false, vec![("kv_num_heads", Attr::Int(1))], all.to_vec(), "attribute q_num_heads is required"),
            (false, heads(3, 2), all.to_vec(), "must be a multiple of kv_num_heads 2"),
            (true, heads(1, 2), all.to_vec(), "q_num_heads 1 must be a multiple of kv_num_heads 2"),
            (
                false,
                heads(2, 1),
                vec![Some(&v), Some(&k), Some(&q)],
                "key width 4 is not a multiple of the query's head size 3",
            ),
            (false, heads(2, 1), vec![Some(&q), Some(&k), Some(&v)], "decay (input 4) is required"),
            (
                false,
                heads(2, 1),
                vec![Some(&q), Some(&k), Some(&v), None, Some(&q)],
                "decay must be [B, T, 1] or [B, T, 4]",
            ),
            (
                false,
                heads(2, 1),
                vec![Some(&q), Some(&k), Some(&v), Some(&q), Some(&decay), Some(&beta)],
                "past_state must be [1, 1, 4, 6]",
            ),
            (
                false,
                heads(2, 1),
                vec![Some(&k), Some(&k), Some(&v)],
                "key width 4 is 2 heads of the query's head size 2, not 1 KV heads",
            ),
        ];
        for (onnx, a, inputs, want) in cases {
            let got = linear_attention_error(onnx, &a, &inputs);
            assert!(got.contains(want), "{want:?} not in {got:?}");
        }
        let mut bad_rule = heads(2, 1);
        bad_rule.push(("update_rule", Attr::Str("mamba".into())));
        assert!(linear_attention_error(false, &bad_rule, &all).contains("update_rule \"mamba\""));
        let mut window = heads(2, 1);
        window.push(("state_window", Attr::Int(2)));
        assert!(linear_attention_error(false, &window, &all).contains("state_window > 0"));
        // 65536 query heads of size 1 on one value head would be 2^32 outputs.
        let (wide_q, wide_v) =
            (f32t(&[1, 1, 1 << 16], &vec![0.0; 1 << 16]), f32t(&[1, 1, 1 << 16], &vec![0.0; 1 << 16]));
        let wide_k = f32t(&[1, 1, 1], &[0.0]);
        let mut linear = heads(1 << 16, 1);
        linear.push(("update_rule", Attr::Str("linear".into())));
        let huge = linear_attention_error(false, &linear, &[Some(&wide_q), Some(&wide_k), Some(&wide_v)]);
        assert!(huge.contains("elements"), "{huge}");
        let rank2 = f32t(&[2, 8], &[0.5; 16]);
        assert!(linear_attention_error(false, &heads(2, 1), &[Some(&rank2), Some(&k), Some(&v)])
            .contains("query must be 3-D"));
    }

    #[test]
    fn malformed_convolutions_and_gates_are_errors_naming_the_problem() {
        let (x, w) = (f32t(&[1, 2, 3], &[1.0; 6]), f32t(&[2, 1, 3], &[1.0; 6]));
        let conv =
            |a: &[(&str, Attr)], inputs: &[Option<&Tensor>]| err_msg(run_ms("CausalConvWithState", a, inputs, 2));
        let wide = f32t(&[2, 2, 3], &[1.0; 12]);
        assert!(conv(&[], &[Some(&x), Some(&wide)]).contains("weight must be [2, 1, k]"));
        assert!(conv(&[("dilation", Attr::Int(0))], &[Some(&x), Some(&w)]).contains("dilation must be at least 1"));
        assert!(conv(&[("dilation", Attr::Int(1 << 40))], &[Some(&x), Some(&w)]).contains("dilation"));
        assert!(conv(&[("ndim", Attr::Int(2))], &[Some(&x), Some(&w)]).contains("ndim = 2 is not supported"));
        assert!(
            conv(&[("activation", Attr::Str("relu".into()))], &[Some(&x), Some(&w)]).contains("activation \"relu\"")
        );
        assert!(conv(&[], &[Some(&x), Some(&w), None, Some(&x)]).contains("past_state must be a float [1, 2, 2]"));
        let gate = |inputs: &[Option<&Tensor>], outputs| err_msg(run_ms("LinearAttentionGate", &[], inputs, outputs));
        let (a, h3) = (f32t(&[1, 2], &[0.1, 0.2]), f32t(&[3], &[0.0; 3]));
        let h2 = f32t(&[2], &[0.0; 2]);
        assert!(gate(&[Some(&a), Some(&h3), Some(&h2)], 1).contains("dt_bias must be [2]"));
        assert!(gate(&[Some(&a), Some(&h2), Some(&h2)], 2).contains("output beta needs input b"));
    }
}

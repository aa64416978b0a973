//! Fused transformer ops: RotaryEmbedding (ai.onnx opset 23 and com.microsoft), Attention
//! (opset 23) and onnxruntime's GroupQueryAttention. Everything is computed in f64 from the
//! inputs and rounded once to the output dtype.

use super::layout::{broadcast_index_map, broadcasts_to, checked_numel};
use super::linalg::dot;
use super::reduce::softmax_row;
use super::{float_tensor, int_values, require_float, Ctx, Res};
use crate::attr::Attrs;
use crate::dtype::DType;
use crate::tensor::Tensor;

/// Rotates the first `2 * cos.len()` entries of one head vector by the angles whose cosines and
/// sines are given: pairs are `(x[i], x[i + half])`, or `(x[2i], x[2i+1])` when interleaved;
/// `(x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)`. The rest passes through.
fn rotate(x: &mut [f64], cos: &[f64], sin: &[f64], interleaved: bool) {
    let half = cos.len();
    for i in 0..half {
        let (a, b) = if interleaved { (2 * i, 2 * i + 1) } else { (i, i + half) };
        let (x1, x2) = (x[a], x[b]);
        x[a] = x1 * cos[i] - x2 * sin[i];
        x[b] = x2 * cos[i] + x1 * sin[i];
    }
}

/// How the heads of a rotary or attention operand are laid out.
#[derive(Clone, Copy)]
pub(super) struct Heads {
    pub(super) batch: usize,
    pub(super) seq: usize,
    heads: usize,
    pub(super) head: usize,
    /// `[B, N, S, H]` when true, `[B, S, N*H]` otherwise.
    bnsh: bool,
}

impl Heads {
    /// Offset of head vector (b, n, s).
    fn offset(&self, b: usize, n: usize, s: usize) -> usize {
        if self.bnsh {
            ((b * self.heads + n) * self.seq + s) * self.head
        } else {
            ((b * self.seq + s) * self.heads + n) * self.head
        }
    }

    /// The operand as `[B, N, S, H]` f64 values.
    fn gather_bnsh(&self, values: &[f64]) -> Vec<f64> {
        let mut out = Vec::with_capacity(values.len());
        for b in 0..self.batch {
            for n in 0..self.heads {
                for s in 0..self.seq {
                    out.extend_from_slice(&values[self.offset(b, n, s)..][..self.head]);
                }
            }
        }
        out
    }
}

/// Applies rotary embedding to every head vector of `x`; `row(b, s)` picks the row of the
/// `[rows, rot/2]` cos/sin tables for that token.
pub(super) fn apply_rotary(
    x: &Tensor,
    layout: Heads,
    (cos, sin): (&Tensor, &Tensor),
    interleaved: bool,
    row: impl Fn(usize, usize) -> Res<usize>,
) -> Res<Tensor> {
    let half = cos.shape.last().copied().unwrap_or(0);
    if cos.shape != sin.shape || 2 * half > layout.head || half == 0 {
        bail!(
            "cos {:?} and sin {:?} must match and rotate at most the head size {}",
            cos.shape,
            sin.shape,
            layout.head
        );
    }
    let rows = cos.numel() / half;
    let (cv, sv) = (cos.to_f64_vec(), sin.to_f64_vec());
    let mut v = x.to_f64_vec();
    for b in 0..layout.batch {
        for s in 0..layout.seq {
            let r = row(b, s)?;
            if r >= rows {
                bail!("position {r} is beyond the {rows} rows of the cos/sin cache");
            }
            let (c, si) = (&cv[r * half..][..half], &sv[r * half..][..half]);
            for n in 0..layout.heads {
                let o = layout.offset(b, n, s);
                rotate(&mut v[o..o + layout.head], c, si, interleaved);
            }
        }
    }
    Ok(float_tensor(x.dtype, x.shape.clone(), v))
}

/// The head layout of a rotary input: `[B, N, S, H]`, or `[B, S, hidden]` split into
/// `num_heads` heads.
pub(super) fn rotary_layout(x: &Tensor, num_heads: usize) -> Res<Heads> {
    match x.shape[..] {
        [batch, heads, seq, head] => Ok(Heads { batch, seq, heads, head, bnsh: true }),
        [batch, seq, hidden] => {
            if num_heads == 0 || hidden % num_heads != 0 {
                bail!("hidden size {hidden} does not split into num_heads={num_heads} heads");
            }
            Ok(Heads { batch, seq, heads: num_heads, head: hidden / num_heads, bnsh: false })
        }
        _ => bail!("input must be 3-D or 4-D, got {:?}", x.shape),
    }
}

/// Position ids `[B, S]` as table rows.
fn position_rows<'t>(ids: &'t Tensor, layout: Heads) -> Res<impl Fn(usize, usize) -> Res<usize> + 't> {
    let v = int_values(ids, "position_ids")?;
    if ids.shape != [layout.batch, layout.seq] {
        bail!("position_ids must have shape [{}, {}], got {:?}", layout.batch, layout.seq, ids.shape);
    }
    let seq = layout.seq;
    Ok(move |b: usize, s: usize| {
        let p = v[b * seq + s];
        if p < 0 {
            bail!("negative position id {p}");
        }
        Ok(p as usize)
    })
}

/// ai.onnx RotaryEmbedding (opset 23). X is `[B, N, S, H]` or `[B, S, hidden]` (with
/// `num_heads`); with position_ids the caches are `[max_pos, rot/2]` tables indexed by them,
/// without they are `[B, S, rot/2]`. `rotary_embedding_dim` (0 = the head size) rotates a prefix.
pub(super) fn rotary_embedding_onnx(cx: &Ctx) -> Res<Vec<Tensor>> {
    let (x, cos, sin, ids) = (cx.input(0, "X")?, cx.input(1, "cos_cache")?, cx.input(2, "sin_cache")?, cx.opt(3));
    require_float(x, "X")?;
    let interleaved = cx.attrs().int_or("interleaved", 0)? != 0;
    let layout = rotary_layout(x, cx.attrs().int_or("num_heads", 0)?.max(0) as usize)?;
    let rot = match cx.attrs().int_or("rotary_embedding_dim", 0)? {
        0 => layout.head,
        r if r > 0 => r as usize,
        r => bail!("rotary_embedding_dim {r} is negative"),
    };
    if rot % 2 != 0 || rot > layout.head || cos.shape.last() != Some(&(rot / 2)) {
        bail!(
            "rotary dim {rot} needs even width within head {} and caches ending in {}, got {:?}",
            layout.head,
            rot / 2,
            cos.shape
        );
    }
    let out = match ids {
        Some(ids) => apply_rotary(x, layout, (cos, sin), interleaved, position_rows(ids, layout)?)?,
        None => {
            if cos.shape != [layout.batch, layout.seq, rot / 2] {
                bail!(
                    "without position_ids the caches must be [{}, {}, {}], got {:?}",
                    layout.batch,
                    layout.seq,
                    rot / 2,
                    cos.shape
                );
            }
            apply_rotary(x, layout, (cos, sin), interleaved, |b, s| Ok(b * layout.seq + s))?
        }
    };
    Ok(vec![out])
}

/// com.microsoft RotaryEmbedding: input `[B, S, hidden]` or `[B, N, S, H]`, position_ids
/// `[B, S]` or a single start offset, caches `[max_pos, rot/2]`. Without `num_heads` the head
/// size is taken as the rotary width. The `scale` attribute is not applied: onnxruntime's
/// kernels ignore it too.
pub(super) fn rotary_embedding_contrib(cx: &Ctx) -> Res<Vec<Tensor>> {
    let (x, ids, cos, sin) =
        (cx.input(0, "input")?, cx.input(1, "position_ids")?, cx.input(2, "cos_cache")?, cx.input(3, "sin_cache")?);
    require_float(x, "input")?;
    if cx.attrs().int_or("is_packed_batching", 0)? != 0 {
        bail!("packed batching is not supported");
    }
    let interleaved = cx.attrs().int_or("interleaved", 0)? != 0;
    let rot_attr = cx.attrs().int_or("rotary_embedding_dim", 0)?.max(0) as usize;
    let mut num_heads = cx.attrs().int_or("num_heads", 0)?.max(0) as usize;
    let half = cos.shape.last().copied().unwrap_or(0);
    if x.rank() == 3 && num_heads == 0 {
        if rot_attr != 0 || half == 0 {
            bail!("num_heads is required with rotary_embedding_dim or an empty cache");
        }
        num_heads = x.shape[2] / (2 * half);
    }
    let layout = rotary_layout(x, num_heads)?;
    let rot = if rot_attr == 0 { layout.head } else { rot_attr };
    if rot > layout.head || half * 2 != rot {
        bail!("rotary dim {rot} does not match caches {:?} and head size {}", cos.shape, layout.head);
    }
    let out = if ids.numel() == 1 {
        let start = int_values(ids, "position_ids")?[0];
        if start < 0 {
            bail!("negative position offset {start}");
        }
        apply_rotary(x, layout, (cos, sin), interleaved, |_, s| Ok(start as usize + s))?
    } else {
        apply_rotary(x, layout, (cos, sin), interleaved, position_rows(ids, layout)?)?
    };
    Ok(vec![out])
}

/// Scores of one query row: raw `scale · q·k`, after softcap, with the additive bias, and the
/// softmax probabilities.
struct RowScores {
    raw: Vec<f64>,
    capped: Vec<f64>,
    logits: Vec<f64>,
    probs: Vec<f64>,
}

/// Scores query `q` against the `keys.len() / q.len()` key rows. `bias(j)` is added after the
/// softcap (`-inf` masks key j); `sink` joins the softmax denominator only.
fn score_row(
    q: &[f64],
    keys: &[f64],
    scale: f64,
    softcap: f64,
    bias: impl Fn(usize) -> f64,
    sink: Option<f64>,
) -> RowScores {
    let head = q.len();
    let raw: Vec<f64> = keys.chunks(head.max(1)).map(|k| scale * dot(q, k)).collect();
    let capped: Vec<f64> =
        if softcap > 0.0 { raw.iter().map(|&s| softcap * (s / softcap).tanh()).collect() } else { raw.clone() };
    let logits: Vec<f64> = capped.iter().enumerate().map(|(j, &s)| s + bias(j)).collect();
    let mut probs = logits.clone();
    softmax_row(&mut probs, sink);
    RowScores { raw, capped, logits, probs }
}

/// `out = Σ_j probs[j] · values[j]` for value rows of length `out.len()`.
fn weighted_sum(probs: &[f64], values: &[f64], out: &mut [f64]) {
    out.iter_mut().for_each(|o| *o = 0.0);
    for (&p, v) in probs.iter().zip(values.chunks(out.len().max(1))) {
        if p != 0.0 {
            for (o, &x) in out.iter_mut().zip(v) {
                *o += p * x;
            }
        }
    }
}

/// Appends `new` (`[B, N, S_new, H]`) after `past` (`[B, N, S_past, H]`) along the sequence.
fn concat_seq(
    past: Option<&[f64]>,
    past_len: usize,
    new: &[f64],
    new_len: usize,
    (batch, heads, head): (usize, usize, usize),
) -> Vec<f64> {
    let mut out = Vec::with_capacity(batch * heads * (past_len + new_len) * head);
    for bn in 0..batch * heads {
        if let Some(p) = past {
            out.extend_from_slice(&p[bn * past_len * head..][..past_len * head]);
        }
        out.extend_from_slice(&new[bn * new_len * head..][..new_len * head]);
    }
    out
}

/// ai.onnx Attention (opsets 23 and 24). Q/K/V are 4-D `[B, N, S, H]` or 3-D `[B, S, N*H]` (with
/// `q_num_heads`/`kv_num_heads`); query head h reads kv head `h / (q_heads / kv_heads)`. The
/// cache is `concat(past, new)`. The bias is the causal mask (key j visible to query i iff
/// `j <= i + past_len`, bottom-right aligned; see [`key_limits`] for `nonpad_kv_seqlen`) plus
/// the mask (bool: false masks; float: added; shorter than the total length it is padded with
/// masked entries), added after the softcap.
/// A row with every key masked outputs zeros. `qk_matmul_output_mode` 0..3 returns the scaled
/// QK, the softcapped QK, the biased QK or the probabilities.
pub(super) fn attention(cx: &Ctx) -> Res<Vec<Tensor>> {
    let (q, k, v) = (cx.input(0, "Q")?, cx.input(1, "K")?, cx.input(2, "V")?);
    let (mask, past_k, past_v) = (cx.opt(3), cx.opt(4), cx.opt(5));
    for (t, what) in [(q, "Q"), (k, "K"), (v, "V")] {
        require_float(t, what)?;
    }
    let attrs = cx.attrs();
    let causal = attrs.int_or("is_causal", 0)? != 0;
    let softcap = attrs.float_or("softcap", 0.0)? as f64;
    let mode = attrs.int_or("qk_matmul_output_mode", 0)?;
    if !(0..=3).contains(&mode) {
        bail!("qk_matmul_output_mode {mode} is not 0..3");
    }
    if q.rank() != k.rank() || q.rank() != v.rank() || !matches!(q.rank(), 3 | 4) {
        bail!("Q, K, V must all be 3-D or all 4-D, got {:?}, {:?}, {:?}", q.shape, k.shape, v.shape);
    }
    let three_d = q.rank() == 3;
    let (ql, kl, vl) = attention_layouts(attrs, q, k, v)?;
    let (batch, q_heads, kv_heads, head, v_head) = (ql.batch, ql.heads, kl.heads, ql.head, vl.head);
    if kl.batch != batch || vl.batch != batch || vl.heads != kv_heads || kl.head != head || kl.seq != vl.seq {
        bail!("Q {:?}, K {:?} and V {:?} do not agree", q.shape, k.shape, v.shape);
    }
    if kv_heads == 0 || q_heads % kv_heads != 0 {
        bail!("{q_heads} query heads do not group over {kv_heads} kv heads");
    }
    let (sq, skv) = (ql.seq, kl.seq);
    let past_len = past_length(past_k, past_v, [batch, kv_heads, head, v_head])?;
    let total = past_len + skv;
    checked_numel(&[batch, q_heads, sq, total])?;
    let qb = ql.gather_bnsh(&q.to_f64_vec());
    let dims_k = (batch, kv_heads, head);
    let dims_v = (batch, kv_heads, v_head);
    let keys =
        concat_seq(past_k.map(Tensor::to_f64_vec).as_deref(), past_len, &kl.gather_bnsh(&k.to_f64_vec()), skv, dims_k);
    let values =
        concat_seq(past_v.map(Tensor::to_f64_vec).as_deref(), past_len, &vl.gather_bnsh(&v.to_f64_vec()), skv, dims_v);

    let full = [batch, q_heads, sq, total];
    let mask_bias = mask.map(|m| padded_mask_bias(m, full)).transpose()?;
    let (offsets, valid) = key_limits(cx, batch, sq, total, past_len)?;
    let scale = match attrs.float("scale")? {
        Some(s) => s as f64,
        None => 1.0 / (head as f64).sqrt(),
    };
    let group = q_heads / kv_heads;
    let mut y = vec![0.0; batch * q_heads * sq * v_head];
    let mut qk = vec![0.0; batch * q_heads * sq * total];
    for b in 0..batch {
        for h in 0..q_heads {
            let kvh = h / group;
            let kv_rows = (b * kv_heads + kvh) * total;
            for i in 0..sq {
                let row = ((b * q_heads + h) * sq + i) * total;
                let bias = |j: usize| {
                    let hidden = (causal && j as i64 > i as i64 + offsets[b]) || j >= valid[b];
                    let limit_bias = if hidden { f64::NEG_INFINITY } else { 0.0 };
                    limit_bias + mask_bias.as_ref().map_or(0.0, |m| m[row + j])
                };
                let qv = &qb[((b * q_heads + h) * sq + i) * head..][..head];
                let scores = score_row(qv, &keys[kv_rows * head..][..total * head], scale, softcap, bias, None);
                let out_at =
                    if three_d { ((b * sq + i) * q_heads + h) * v_head } else { ((b * q_heads + h) * sq + i) * v_head };
                weighted_sum(
                    &scores.probs,
                    &values[kv_rows * v_head..][..total * v_head],
                    &mut y[out_at..out_at + v_head],
                );
                qk[row..row + total].copy_from_slice(scores.recorded(mode));
            }
        }
    }
    let y_shape = if three_d { vec![batch, sq, q_heads * v_head] } else { vec![batch, q_heads, sq, v_head] };
    Ok(vec![
        float_tensor(q.dtype, y_shape, y),
        float_tensor(k.dtype, vec![batch, kv_heads, total, head], keys),
        float_tensor(v.dtype, vec![batch, kv_heads, total, v_head], values),
        float_tensor(q.dtype, full.to_vec(), qk),
    ])
}

impl RowScores {
    /// The scores `qk_matmul_output_mode` returns: 0 scaled, 1 softcapped, 2 biased, 3 the
    /// probabilities.
    fn recorded(&self, mode: i64) -> &[f64] {
        match mode {
            0 => &self.raw,
            1 => &self.capped,
            2 => &self.logits,
            _ => &self.probs,
        }
    }
}

/// The head layouts of Attention's Q, K and V: 4-D `[B, N, S, H]`, or 3-D `[B, S, N*H]` split by
/// `q_num_heads` / `kv_num_heads`.
fn attention_layouts(attrs: &Attrs, q: &Tensor, k: &Tensor, v: &Tensor) -> Res<(Heads, Heads, Heads)> {
    if q.rank() == 4 {
        let four =
            |t: &Tensor| Heads { batch: t.shape[0], heads: t.shape[1], seq: t.shape[2], head: t.shape[3], bnsh: true };
        return Ok((four(q), four(k), four(v)));
    }
    let heads = |name: &str| -> Res<usize> {
        match attrs.int(name)? {
            Some(n) if n > 0 => Ok(n as usize),
            _ => bail!("3-D inputs need a positive {name}"),
        }
    };
    let (qh, kvh) = (heads("q_num_heads")?, heads("kv_num_heads")?);
    let split = |t: &Tensor, n: usize, what: &str| -> Res<Heads> {
        if !t.shape[2].is_multiple_of(n) {
            bail!("{what} hidden size {} does not split into {n} heads", t.shape[2]);
        }
        Ok(Heads { batch: t.shape[0], seq: t.shape[1], heads: n, head: t.shape[2] / n, bnsh: false })
    };
    Ok((split(q, qh, "Q")?, split(k, kvh, "K")?, split(v, kvh, "V")?))
}

/// The past length of Attention's `past_key` / `past_value` (0 without them), checked against
/// `[batch, kv_heads, head, v_head]`.
fn past_length(past_k: Option<&Tensor>, past_v: Option<&Tensor>, dims: [usize; 4]) -> Res<usize> {
    let [batch, kv_heads, head, v_head] = dims;
    match (past_k, past_v) {
        (None, None) => Ok(0),
        (Some(pk), Some(pv)) => {
            let p = pk.shape.get(2).copied().unwrap_or(0);
            if pk.shape != [batch, kv_heads, p, head] || pv.shape != [batch, kv_heads, p, v_head] {
                bail!(
                    "past_key {:?} / past_value {:?} do not fit [{batch}, {kv_heads}, past, {head}/{v_head}]",
                    pk.shape,
                    pv.shape
                );
            }
            Ok(p)
        }
        _ => bail!("past_key and past_value must be given together"),
    }
}

/// The mask as an additive bias broadcast to `full` = `[B, Hq, Sq, total]`: bool false masks,
/// float is added; a last dim shorter than the total is padded with masked entries.
fn padded_mask_bias(m: &Tensor, full: [usize; 4]) -> Res<Vec<f64>> {
    let total = full[3];
    let width = m.shape.last().copied().unwrap_or(1);
    if m.rank() > 4 || width > total {
        bail!("attn_mask {:?} does not fit {full:?}", m.shape);
    }
    let is_bool = m.dtype == DType::Bool;
    if !is_bool && !m.dtype.is_float() {
        bail!("attn_mask must be bool or float, got {}", m.dtype);
    }
    let as_bias = |x: f64| match (is_bool, x != 0.0) {
        (true, true) => 0.0,
        (true, false) => f64::NEG_INFINITY,
        (false, _) => x,
    };
    let mv = m.to_f64_vec();
    // Like the ONNX reference, a last dimension shorter than the total is padded, never
    // broadcast, even when it is 1; only a scalar mask broadcasts.
    let mut padded_shape = if m.rank() == 0 { vec![1] } else { m.shape.clone() };
    let padded: Vec<f64> = if m.rank() == 0 || width == total {
        mv.iter().map(|&x| as_bias(x)).collect()
    } else {
        let last = padded_shape.len() - 1;
        padded_shape[last] = total;
        let rows: usize = m.shape[..last].iter().product();
        (0..rows)
            .flat_map(|r| {
                let row = &mv[r * width..(r + 1) * width];
                row.iter().map(|&x| as_bias(x)).chain(std::iter::repeat_n(f64::NEG_INFINITY, total - width))
            })
            .collect()
    };
    if !broadcasts_to(&padded_shape, &full) {
        bail!("attn_mask {:?} does not broadcast to {full:?}", m.shape);
    }
    Ok(broadcast_index_map(&padded_shape, &full).into_iter().map(|i| padded[i]).collect())
}

/// Per batch row, the causal offset (query i sees keys `j <= i + offset`) and how many keys are
/// valid (keys from there on are padding). Without `nonpad_kv_seqlen` (opset 24) the offset is
/// the past length and every key is valid; with it (an external cache: no past) the offset is
/// `nonpad_kv_seqlen[b] - Sq`, bottom-right aligned as the opset 24 definition has it, and only
/// the first `nonpad_kv_seqlen[b]` keys are valid.
fn key_limits(cx: &Ctx, batch: usize, sq: usize, total: usize, past_len: usize) -> Res<(Vec<i64>, Vec<usize>)> {
    let Some(nonpad) = cx.opt(6) else {
        return Ok((vec![past_len as i64; batch], vec![total; batch]));
    };
    if cx.opset() < 24 {
        bail!("nonpad_kv_seqlen needs opset 24, the model imports {}", cx.opset());
    }
    if past_len > 0 || cx.opt(4).is_some() {
        bail!("nonpad_kv_seqlen cannot be combined with past_key and past_value");
    }
    let lengths = int_values(nonpad, "nonpad_kv_seqlen")?;
    if lengths.len() != batch || lengths.iter().any(|&n| n < 0 || n as usize > total) {
        bail!("nonpad_kv_seqlen {lengths:?} must hold {batch} lengths within 0..={total}");
    }
    Ok((lengths.iter().map(|&n| n - sq as i64).collect(), lengths.iter().map(|&n| n as usize).collect()))
}

/// onnxruntime's GroupQueryAttention. Query `[B, S, N*H]` (or packed QKV `[B, S, (N+2K)*H]`
/// when key and value are absent), key/value `[B, S, K*H]`, caches BNSH. For batch row b the
/// total length is `seqlens_k[b] + 1` and the past length is that minus S, or 0 for the first
/// prompt (S equal to total_sequence_length). Present caches have
/// `max(total_sequence_length, past capacity)` rows: the past's first rows, then the new keys,
/// then zeros. Query s of row b sits at position `past + s` and sees keys `j <= past + s`
/// (within `local_window_size` of it when set) below the row's total. Rotary (do_rotary) turns
/// query and new key heads by those positions (or by position_ids). Scores are
/// `scale · q·k`, softcapped, plus attention_bias; the softmax may carry a sink logit (0 with
/// smooth_softmax, or head_sink[h]). output_qk (qk_output 1/2) returns the biased scores or
/// the probabilities, zero where masked.
pub(super) fn group_query_attention(cx: &Ctx) -> Res<Vec<Tensor>> {
    let query = cx.input(0, "query")?;
    let seqlens = cx.input(5, "seqlens_k")?;
    let total = cx.input(6, "total_sequence_length")?;
    let (heads, kv_heads) = gqa_heads(cx.attrs())?;
    let [batch, seq, width] = gqa_query_dims(cx, query)?;
    let qkv = split_qkv(query, (cx.opt(1), cx.opt(2)), [batch, seq, width], (heads, kv_heads))?;
    let d = GqaDims { batch, seq, heads, kv_heads, head: qkv.head };
    let rows = gqa_rows(d, seqlens, total, (cx.opt(3), cx.opt(4)))?;
    let (q_vals, k_vals) = gqa_rotary(cx, d, &rows.past_lens, qkv.q, qkv.k)?;
    let [keys, values] = present_caches(d, &rows, [cx.opt(3), cx.opt(4)], [&k_vals, &qkv.v]);
    let scoring = GqaScoring::read(cx, d, &rows.totals)?;
    let (out, qk) = gqa_attend(d, &rows, &scoring, &q_vals, [&keys, &values]);

    let cache_shape = vec![batch, kv_heads, rows.present_len, d.head];
    let mut outputs = vec![
        float_tensor(query.dtype, vec![batch, seq, heads * d.head], out),
        float_tensor(query.dtype, cache_shape.clone(), keys),
        float_tensor(query.dtype, cache_shape, values),
    ];
    if scoring.qk_mode == 1 || scoring.qk_mode == 2 {
        outputs.push(float_tensor(query.dtype, vec![batch, heads, seq, rows.present_len], qk));
    }
    Ok(outputs)
}

/// GroupQueryAttention's sizes: batch rows, new tokens per row, query heads, kv heads and the
/// head size.
#[derive(Clone, Copy)]
struct GqaDims {
    batch: usize,
    seq: usize,
    heads: usize,
    kv_heads: usize,
    head: usize,
}

impl GqaDims {
    /// The `[B, S, N*H]` layouts of the query heads and of the new key/value heads.
    fn layouts(self) -> (Heads, Heads) {
        let Self { batch, seq, heads, kv_heads, head } = self;
        (Heads { batch, seq, heads, head, bnsh: false }, Heads { batch, seq, heads: kv_heads, head, bnsh: false })
    }
}

/// `num_heads` and `kv_num_heads`, positive and grouping evenly; quantised caches are refused.
fn gqa_heads(attrs: &Attrs) -> Res<(usize, usize)> {
    let positive = |name: &str| -> Res<usize> {
        match attrs.int(name)? {
            Some(n) if n > 0 => Ok(n as usize),
            _ => bail!("attribute {name} must be a positive int"),
        }
    };
    let (heads, kv_heads) = (positive("num_heads")?, positive("kv_num_heads")?);
    if heads % kv_heads != 0 {
        bail!("{heads} heads do not group over {kv_heads} kv heads");
    }
    for name in ["k_quant_type", "v_quant_type"] {
        if attrs.str(name)?.is_some_and(|q| q != "NONE") {
            bail!("quantised KV caches ({name}) are not supported");
        }
    }
    Ok((heads, kv_heads))
}

/// The query's `[B, S, width]`, checked to be a float with features; key, value, the past
/// caches, attention_bias and head_sink must have its dtype.
fn gqa_query_dims(cx: &Ctx, query: &Tensor) -> Res<[usize; 3]> {
    require_float(query, "query")?;
    let [batch, seq, width] = query.shape[..] else {
        bail!("query must be 3-D, got {:?}", query.shape);
    };
    if width == 0 {
        bail!("query has no features");
    }
    for (index, what) in
        [(1, "key"), (2, "value"), (3, "past_key"), (4, "past_value"), (10, "attention_bias"), (11, "head_sink")]
    {
        if let Some(t) = cx.opt(index).filter(|t| t.dtype != query.dtype) {
            bail!("{what} has dtype {}, query {}", t.dtype, query.dtype);
        }
    }
    Ok([batch, seq, width])
}

/// Query, key and value as `[B, S, heads*H]` f64 blocks, with the head size H.
struct Qkv {
    head: usize,
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
}

/// Splits a packed QKV query when key and value are absent; otherwise checks key and value
/// against the query's batch, sequence and head size.
fn split_qkv(
    query: &Tensor,
    (key, value): (Option<&Tensor>, Option<&Tensor>),
    [batch, seq, width]: [usize; 3],
    (heads, kv_heads): (usize, usize),
) -> Res<Qkv> {
    let qv_all = query.to_f64_vec();
    match (key, value) {
        (None, None) => {
            let parts = heads + 2 * kv_heads;
            if width % parts != 0 {
                bail!("packed QKV width {width} does not split into {parts} heads");
            }
            let head = width / parts;
            let take = |from: usize, len: usize| -> Vec<f64> {
                qv_all.chunks(width).flat_map(|row| row[from * head..(from + len) * head].to_vec()).collect()
            };
            Ok(Qkv { head, q: take(0, heads), k: take(heads, kv_heads), v: take(heads + kv_heads, kv_heads) })
        }
        (Some(k), Some(v)) => {
            if width % heads != 0 {
                bail!("query width {width} does not split into {heads} heads");
            }
            let head = width / heads;
            let expected = [batch, seq, kv_heads * head];
            if k.shape != expected || v.shape != expected {
                bail!("key {:?} and value {:?} must be {expected:?}", k.shape, v.shape);
            }
            Ok(Qkv { head, q: qv_all, k: k.to_f64_vec(), v: v.to_f64_vec() })
        }
        _ => bail!("key and value must be given together"),
    }
}

/// Where each batch row's step sits in the present caches.
struct GqaRows {
    /// Rows of the past caches (0 without them).
    capacity: usize,
    /// Rows of the present caches: `max(total_sequence_length, capacity)`.
    present_len: usize,
    /// Per batch row, the tokens before this step.
    past_lens: Vec<usize>,
    /// Per batch row, the tokens up to and including this step (`seqlens_k[b] + 1`).
    totals: Vec<usize>,
}

/// Each batch row's past and total lengths from `seqlens_k`, checked against
/// total_sequence_length and the past caches' capacity.
fn gqa_rows(d: GqaDims, seqlens: &Tensor, total_t: &Tensor, past: (Option<&Tensor>, Option<&Tensor>)) -> Res<GqaRows> {
    let GqaDims { batch, seq, heads, kv_heads, head } = d;
    let seqlens_v = int_values(seqlens, "seqlens_k")?;
    if seqlens_v.len() != batch {
        bail!("seqlens_k must hold {batch} values, got {:?}", seqlens.shape);
    }
    let total = super::int_scalar(total_t, "total_sequence_length")?;
    let capacity = past_capacity(d, past)?;
    if total < seq as i64 {
        bail!("total_sequence_length {total} is below the sequence length {seq}");
    }
    let present_len = (total as usize).max(capacity);
    checked_numel(&[batch, kv_heads, present_len, head])?;
    checked_numel(&[batch, heads, seq, present_len])?;
    let first_prompt = total == seq as i64;
    let mut past_lens = Vec::with_capacity(batch);
    let mut totals = Vec::with_capacity(batch);
    for (b, &sl) in seqlens_v.iter().enumerate() {
        let t = sl.saturating_add(1);
        let past = if first_prompt { 0 } else { t - seq as i64 };
        if t < 1 || t > total || past < 0 || past as usize > capacity || past as usize + seq > present_len {
            bail!("seqlens_k[{b}] = {sl} is inconsistent with sequence length {seq}, total {total} and past capacity {capacity}");
        }
        past_lens.push(past as usize);
        totals.push(t as usize);
    }
    Ok(GqaRows { capacity, present_len, past_lens, totals })
}

/// The rows of GroupQueryAttention's past caches, checked to be `[B, K, past, H]` (0 without
/// them).
fn past_capacity(d: GqaDims, past: (Option<&Tensor>, Option<&Tensor>)) -> Res<usize> {
    let GqaDims { batch, kv_heads, head, .. } = d;
    match past {
        (None, None) => Ok(0),
        (Some(pk), Some(pv)) => {
            let cap = pk.shape.get(2).copied().unwrap_or(0);
            if pk.shape != [batch, kv_heads, cap, head] || pv.shape != pk.shape {
                bail!(
                    "past_key {:?} / past_value {:?} must be [{batch}, {kv_heads}, past, {head}]",
                    pk.shape,
                    pv.shape
                );
            }
            Ok(cap)
        }
        _ => bail!("past_key and past_value must be given together"),
    }
}

/// Query and new key heads turned by rotary embedding when `do_rotary` is set: token s of row
/// b by `position_ids[b, s]`, or by its position `past + s`; unchanged otherwise.
fn gqa_rotary(
    cx: &Ctx,
    d: GqaDims,
    past_lens: &[usize],
    q_vals: Vec<f64>,
    k_vals: Vec<f64>,
) -> Res<(Vec<f64>, Vec<f64>)> {
    let attrs = cx.attrs();
    if attrs.int_or("do_rotary", 0)? == 0 {
        return Ok((q_vals, k_vals));
    }
    let GqaDims { batch, seq, head, .. } = d;
    let (Some(cos), Some(sin)) = (cx.opt(7), cx.opt(8)) else {
        bail!("do_rotary needs cos_cache and sin_cache");
    };
    if cos.rank() != 2 {
        bail!("cos_cache must be 2-D, got {:?}", cos.shape);
    }
    let interleaved = attrs.int_or("rotary_interleaved", 0)? != 0;
    let ids = cx.opt(9).map(|t| int_values(t, "position_ids")).transpose()?;
    if ids.is_some_and(|v| v.len() != batch * seq) {
        bail!("position_ids must be [{batch}, {seq}]");
    }
    let row = |b: usize, s: usize| -> Res<usize> {
        let p = ids.map_or((past_lens[b] + s) as i64, |v| v[b * seq + s]);
        if p < 0 {
            bail!("negative position {p}");
        }
        Ok(p as usize)
    };
    let rotate_all = |vals: Vec<f64>, layout: Heads| -> Res<Vec<f64>> {
        let t = Tensor::from_f64(vec![batch, seq, layout.heads * head], vals);
        let rotated = apply_rotary(&t, layout, (cos, sin), interleaved, row)?;
        Ok(rotated.to_f64_vec())
    };
    let (q_layout, kv_layout) = d.layouts();
    Ok((rotate_all(q_vals, q_layout)?, rotate_all(k_vals, kv_layout)?))
}

/// The present key and value caches `[B, K, present_len, H]`: each row's past rows from the
/// past caches, then its new rows, zeros beyond.
fn present_caches(d: GqaDims, rows: &GqaRows, past: [Option<&Tensor>; 2], new: [&[f64]; 2]) -> [Vec<f64>; 2] {
    let GqaDims { batch, seq, kv_heads, head, .. } = d;
    let (_, kv_layout) = d.layouts();
    let (present_len, capacity, past_lens) = (rows.present_len, rows.capacity, &rows.past_lens);
    let past_kv = past.map(|t| t.map(Tensor::to_f64_vec));
    let mut present =
        [vec![0.0; batch * kv_heads * present_len * head], vec![0.0; batch * kv_heads * present_len * head]];
    for (which, new_vals) in new.into_iter().enumerate() {
        for b in 0..batch {
            for n in 0..kv_heads {
                let dst = (b * kv_heads + n) * present_len * head;
                if let Some(past) = &past_kv[which] {
                    let src = (b * kv_heads + n) * capacity * head;
                    present[which][dst..dst + past_lens[b] * head]
                        .copy_from_slice(&past[src..src + past_lens[b] * head]);
                }
                for s in 0..seq {
                    let at = dst + (past_lens[b] + s) * head;
                    present[which][at..at + head].copy_from_slice(&new_vals[kv_layout.offset(b, n, s)..][..head]);
                }
            }
        }
    }
    present
}

/// How GroupQueryAttention scores a query row, from its attributes, attention_bias and
/// head_sink.
struct GqaScoring {
    scale: f64,
    softcap: f64,
    /// `local_window_size`: a query sees keys fewer than this many positions back (all when
    /// not positive).
    window: i64,
    smooth: bool,
    /// Per query head, a logit that joins the softmax denominator only.
    sinks: Option<Vec<f64>>,
    /// attention_bias's values and its `[1 or B, 1 or N, S, total]` shape.
    bias: Option<(Vec<f64>, Vec<usize>)>,
    /// `qk_output`: 1 returns the biased scores, 2 the probabilities, 0 neither.
    qk_mode: i64,
}

impl GqaScoring {
    fn read(cx: &Ctx, d: GqaDims, totals: &[usize]) -> Res<Self> {
        let GqaDims { batch, seq, heads, head, .. } = d;
        let attrs = cx.attrs();
        let scale = match attrs.float("scale")? {
            Some(s) if s != 0.0 => s as f64,
            _ => 1.0 / (head as f64).sqrt(),
        };
        let softcap = attrs.float_or("softcap", 0.0)? as f64;
        let window = attrs.int_or("local_window_size", -1)?;
        let smooth = attrs.int_or("smooth_softmax", -1)? == 1;
        let sinks = cx.opt(11).map(Tensor::to_f64_vec);
        if sinks.as_ref().is_some_and(|s| s.len() != heads) {
            bail!("head_sink must hold {heads} values");
        }
        let bias = cx.opt(10).map(|t| (t.to_f64_vec(), t.shape.clone()));
        if let Some((_, shape)) = &bias {
            let ok = shape.len() == 4
                && (shape[0] == 1 || shape[0] == batch)
                && (shape[1] == 1 || shape[1] == heads)
                && shape[2] == seq
                && shape[3] >= totals.iter().copied().max().unwrap_or(0);
            if !ok {
                bail!("attention_bias {shape:?} must be [1 or {batch}, 1 or {heads}, {seq}, total]");
            }
        }
        let qk_mode = attrs.int_or("qk_output", 0)?;
        Ok(Self { scale, softcap, window, smooth, sinks, bias, qk_mode })
    }

    /// The sink logit of query head h: head_sink[h], or 0 with smooth_softmax.
    fn sink(&self, h: usize) -> Option<f64> {
        match &self.sinks {
            Some(s) => Some(s[h]),
            None if self.smooth => Some(0.0),
            None => None,
        }
    }

    /// attention_bias for query s of row b, head h, against key j (0 without one).
    fn bias_at(&self, seq: usize, (b, h, s): (usize, usize, usize), j: usize) -> f64 {
        match &self.bias {
            Some((v, sh)) => {
                let (bb, hh) = (if sh[0] == 1 { 0 } else { b }, if sh[1] == 1 { 0 } else { h });
                v[((bb * sh[1] + hh) * seq + s) * sh[3] + j]
            }
            None => 0.0,
        }
    }
}

/// The attention output `[B, S, N*H]` and the scores `[B, N, S, present_len]` output_qk
/// returns (zero where masked). Query head h reads kv head `h / (N / K)`; query s of row b sees
/// the keys [`GqaScoring`] and the row's lengths leave visible.
fn gqa_attend(
    d: GqaDims,
    rows: &GqaRows,
    scoring: &GqaScoring,
    q_vals: &[f64],
    [keys, values]: [&[f64]; 2],
) -> (Vec<f64>, Vec<f64>) {
    let GqaDims { batch, seq, heads, kv_heads, head } = d;
    let (q_layout, _) = d.layouts();
    let present_len = rows.present_len;
    let window = scoring.window;
    let group = heads / kv_heads;
    let mut out = vec![0.0; batch * seq * heads * head];
    let mut qk = vec![0.0; batch * heads * seq * present_len];
    for b in 0..batch {
        for h in 0..heads {
            let kv_rows = (b * kv_heads + h / group) * present_len;
            let sink = scoring.sink(h);
            for s in 0..seq {
                let pos = rows.past_lens[b] + s;
                let visible = |j: usize| j < rows.totals[b] && j <= pos && (window <= 0 || pos - j < window as usize);
                let bias = |j: usize| if visible(j) { scoring.bias_at(seq, (b, h, s), j) } else { f64::NEG_INFINITY };
                let qv = &q_vals[q_layout.offset(b, h, s)..][..head];
                let scores = score_row(
                    qv,
                    &keys[kv_rows * head..][..present_len * head],
                    scoring.scale,
                    scoring.softcap,
                    bias,
                    sink,
                );
                let at = q_layout.offset(b, h, s);
                weighted_sum(&scores.probs, &values[kv_rows * head..][..present_len * head], &mut out[at..at + head]);
                let recorded = if scoring.qk_mode == 2 { &scores.probs } else { &scores.logits };
                let row = ((b * heads + h) * seq + s) * present_len;
                for (j, &x) in recorded.iter().enumerate() {
                    qk[row + j] = if visible(j) { x } else { 0.0 };
                }
            }
        }
    }
    (out, qk)
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use crate::attr::Attr;
    use crate::dtype::DType;
    use crate::tensor::Tensor;

    #[test]
    fn onnx_rotary_rotates_halves_or_interleaved_pairs() {
        let x = f32t(&[1, 1, 1, 4], &[1.0, 2.0, 3.0, 4.0]);
        // Pair 0 turns by 90 degrees (cos 0, sin 1), pair 1 not at all (cos 1, sin 0).
        let (cos, sin, pos) = (f32t(&[1, 2], &[0.0, 1.0]), f32t(&[1, 2], &[1.0, 0.0]), i64t(&[1, 1], &[0]));
        // Halves pair (x0, x2) and (x1, x3): (1, 3) -> (-3, 1).
        assert_eq!(f32s(&run1("RotaryEmbedding", &[], &[&x, &cos, &sin, &pos])), vec![-3.0, 2.0, 1.0, 4.0]);
        // Interleaving pairs (x0, x1) and (x2, x3): (1, 2) -> (-2, 1).
        let il = [("interleaved", Attr::Int(1))];
        assert_eq!(f32s(&run1("RotaryEmbedding", &il, &[&x, &cos, &sin, &pos])), vec![-2.0, 1.0, 3.0, 4.0]);
        // A partial rotation of the first two entries leaves the rest alone.
        let (c1, s1) = (f32t(&[1, 1], &[0.0]), f32t(&[1, 1], &[1.0]));
        let partial = [("rotary_embedding_dim", Attr::Int(2))];
        assert_eq!(f32s(&run1("RotaryEmbedding", &partial, &[&x, &c1, &s1, &pos])), vec![-2.0, 1.0, 3.0, 4.0]);
        // 3-D input split into two heads of two; without position ids the caches are [B, S, half].
        let x3 = f32t(&[1, 1, 4], &[1.0, 2.0, 3.0, 4.0]);
        let (cb, sb) = (f32t(&[1, 1, 1], &[0.0]), f32t(&[1, 1, 1], &[1.0]));
        let y = run("RotaryEmbedding", &[("num_heads", Attr::Int(2))], &[Some(&x3), Some(&cb), Some(&sb)], 1).unwrap();
        assert_eq!(f32s(&y[0]), vec![-2.0, 1.0, -4.0, 3.0]);
        let far = i64t(&[1, 1], &[5]);
        assert!(
            err_msg(run("RotaryEmbedding", &[], &[Some(&x), Some(&cos), Some(&sin), Some(&far)], 1)).contains("beyond")
        );
    }

    #[test]
    fn contrib_rotary_takes_a_start_offset() {
        // Position ids [1]: token s uses cache row 1 + s. Row 1 turns by 90 degrees, row 2 by 180.
        let x = f32t(&[1, 2, 2], &[1.0, 2.0, 3.0, 4.0]);
        let (cos, sin) = (f32t(&[3, 1], &[1.0, 0.0, -1.0]), f32t(&[3, 1], &[0.0, 1.0, 0.0]));
        let y =
            run_ms("RotaryEmbedding", &[], &[Some(&x), Some(&i64t(&[1], &[1])), Some(&cos), Some(&sin)], 1).unwrap();
        assert_eq!(f32s(&y[0]), vec![-2.0, 1.0, -3.0, -4.0]);
        let ids = i64t(&[1, 2], &[2, 0]);
        let y = run_ms("RotaryEmbedding", &[], &[Some(&x), Some(&ids), Some(&cos), Some(&sin)], 1).unwrap();
        assert_eq!(f32s(&y[0]), vec![-1.0, -2.0, 3.0, 4.0]);
    }

    fn i32s(shape: &[usize], v: &[i64]) -> Tensor {
        typed(DType::I32, shape, v)
    }

    // onnxruntime 1.32's outputs: 2 query heads over 1 kv head of size 16, 3 tokens, an empty
    // past, half-split rotary from 4x8 caches.
    #[rustfmt::skip]
    const GQA_PROMPT_OUT: [f32; 96] = [
        0.25, 0.6875, -0.3125, 0.125, 0.5625, -0.4375, 0.0, 0.4375,
        -0.5625, -0.125, 0.3125, -0.6875, -0.25, 0.1875, 0.625, -0.375,
        0.25, 0.6875, -0.3125, 0.125, 0.5625, -0.4375, 0.0, 0.4375,
        -0.5625, -0.125, 0.3125, -0.6875, -0.25, 0.1875, 0.625, -0.375,
        0.15940326, 0.59690326, -0.40309674, 0.03440326, 0.47190326, -0.52809674, -0.09059673, 0.34690326,
        0.04147822, -0.21559672, 0.22190326, -0.08352177, -0.34059674, 0.096903265, 0.53440326, -0.4655967,
        0.1617287, 0.59922874, -0.40077132, 0.036728688, 0.4742287, -0.5257713, -0.088271305, 0.3492287,
        0.025975397, -0.2132713, 0.2242287, -0.0990246, -0.33827132, 0.099228695, 0.53672874, -0.46327132,
        0.06757613, 0.50507617, -0.49492386, -0.057423864, 0.38007614, -0.1799563, -0.18242387, 0.25507614,
        0.21369152, -0.30742386, 0.13007614, 0.08869151, -0.43242386, 0.0050761406, 0.4425761, -0.117456295,
        0.06924321, 0.5067432, -0.4932568, -0.055756796, 0.38174325, -0.16933198, -0.1807568, 0.2567432,
        0.1936205, -0.3057568, 0.13174321, 0.06862049, -0.4307568, 0.0067432052, 0.44424325, -0.106832,
    ];

    #[rustfmt::skip]
    const GQA_PROMPT_KEY: [f32; 48] = [
        0.28125, -0.21875, -0.0, 0.21875, -0.28125, -0.0625, -0.29296875, -0.34375,
        0.3515625, 0.14453125, -0.1953125, 0.3203125, 0.25390625, 0.14453125, -0.09765625, 0.42578125,
        0.0390625, 0.34765625, 0.296875, 0.15625, -0.25390625, 0.0546875, 0.2734375, -0.13671875,
        -0.109375, -0.0234375, -0.4296875, -0.0703125, 0.06640625, -0.46875, 0.03125, -0.05078125,
        -0.29296875, 0.1953125, -0.03515625, -0.17578125, 0.1328125, -0.09765625, -0.05859375, 0.0703125,
        -0.23046875, -0.390625, 0.125, -0.30078125, 0.3984375, 0.15625, -0.30859375, 0.3515625,
    ];

    #[test]
    fn gqa_first_prompt_with_rotary_matches_onnxruntime() {
        let q = f32t(&[1, 3, 32], &pattern(96, 1));
        let (k, v) = (f32t(&[1, 3, 16], &pattern(48, 2)), f32t(&[1, 3, 16], &pattern(48, 3)));
        let past = f32t(&[1, 1, 0, 16], &[]);
        let (cos, sin) = (f32t(&[4, 8], &pattern(32, 4)), f32t(&[4, 8], &pattern(32, 5)));
        let (seqlens, total) = (i32s(&[1], &[2]), i32s(&[], &[3]));
        let attrs = [("num_heads", Attr::Int(2)), ("kv_num_heads", Attr::Int(1)), ("do_rotary", Attr::Int(1))];
        let inputs = [
            Some(&q),
            Some(&k),
            Some(&v),
            Some(&past),
            Some(&past),
            Some(&seqlens),
            Some(&total),
            Some(&cos),
            Some(&sin),
        ];
        let y = run_ms("GroupQueryAttention", &attrs, &inputs, 3).unwrap();
        assert_eq!((y[0].shape.clone(), y[1].shape.clone()), (vec![1, 3, 32], vec![1, 1, 3, 16]));
        assert_close(&f32s(&y[0]), &GQA_PROMPT_OUT, 1e-6);
        assert_close(&f32s(&y[1]), &GQA_PROMPT_KEY, 1e-6);
        assert_eq!(f32s(&y[2]), pattern(48, 3), "values are cached unrotated");
    }

    // onnxruntime 1.32's outputs: one new token after 3 cached ones, so it sits at position 3.
    #[rustfmt::skip]
    const GQA_DECODE_OUT: [f32; 32] = [
        -0.012825079, -0.28967562, 0.14782439, 0.21596058, -0.085905895, 0.022824394, 0.09096059, -0.21090592,
        -0.10217561, 0.33532438, 0.049674913, -0.22717561, 0.21032438, -0.07532508, -0.35217562, 0.0853244,
        -0.02390919, -0.2858987, 0.15160133, 0.22575998, -0.09721734, 0.02660131, 0.10075998, -0.22221734,
        -0.09839869, 0.3391013, 0.03859081, -0.2233987, 0.21410131, -0.0864092, -0.3483987, 0.08910132,
    ];

    #[rustfmt::skip]
    const GQA_DECODE_KEY: [f32; 64] = [
        0.6875, -0.3125, 0.125, 0.5625, -0.4375, 0.0, 0.4375, -0.5625,
        -0.125, 0.3125, -0.6875, -0.25, 0.1875, 0.625, -0.375, 0.0625,
        0.5, -0.5, -0.0625, 0.375, -0.625, -0.1875, 0.25, 0.6875,
        -0.3125, 0.125, 0.5625, -0.4375, 0.0, 0.4375, -0.5625, -0.125,
        0.3125, -0.6875, -0.25, 0.1875, 0.625, -0.375, 0.0625, 0.5,
        -0.5, -0.0625, 0.375, -0.625, -0.1875, 0.25, 0.6875, -0.3125,
        0.03515625, -0.2265625, 0.01953125, -0.15625, -0.265625, -0.53125, 0.16796875, -0.09375,
        -0.02734375, 0.16796875, -0.3125, 0.25390625, 0.30078125, 0.1640625, -0.07421875, 0.16796875,
    ];

    #[test]
    fn gqa_decode_with_past_and_interleaved_rotary_matches_onnxruntime() {
        let q = f32t(&[1, 1, 32], &pattern(32, 6));
        let (k, v) = (f32t(&[1, 1, 16], &pattern(16, 7)), f32t(&[1, 1, 16], &pattern(16, 8)));
        let (pk, pv) = (f32t(&[1, 1, 3, 16], &pattern(48, 9)), f32t(&[1, 1, 3, 16], &pattern(48, 10)));
        let (cos, sin) = (f32t(&[4, 8], &pattern(32, 4)), f32t(&[4, 8], &pattern(32, 5)));
        let (seqlens, total) = (i32s(&[1], &[3]), i32s(&[], &[4]));
        let attrs = [
            ("num_heads", Attr::Int(2)),
            ("kv_num_heads", Attr::Int(1)),
            ("do_rotary", Attr::Int(1)),
            ("rotary_interleaved", Attr::Int(1)),
        ];
        let inputs =
            [Some(&q), Some(&k), Some(&v), Some(&pk), Some(&pv), Some(&seqlens), Some(&total), Some(&cos), Some(&sin)];
        let y = run_ms("GroupQueryAttention", &attrs, &inputs, 3).unwrap();
        assert_eq!(y[1].shape, vec![1, 1, 4, 16]);
        assert_close(&f32s(&y[0]), &GQA_DECODE_OUT, 1e-6);
        assert_close(&f32s(&y[1]), &GQA_DECODE_KEY, 1e-6);
    }

    #[test]
    fn gqa_ragged_batch_in_a_shared_cache_with_a_local_window_matches_onnxruntime() {
        // onnxruntime 1.32's outputs: batch rows with 2 and 4 tokens in a 4-row cache, a window of 2
        // keys; rows past a batch row's total are zero in the present cache.
        #[rustfmt::skip]
        const GQA_RAGGED_OUT: [f32; 32] = [
            0.1497771, -0.23059776, 0.20690222, 0.024777094, -0.35559776, 0.081902236, -0.10022289, 0.3372771,
            0.08056974, -0.17736132, 0.26013863, -0.04443026, -0.3023613, 0.13513865, -0.16943024, 0.26806974,
            0.10386885, -0.14266568, 0.29483432, -0.02113115, -0.26766568, 0.16983432, -0.14613116, -0.39266568,
            0.19154762, -0.1990306, 0.23846938, 0.066547625, -0.3240306, 0.11346938, -0.05845237, -0.4490306,
        ];
        const GQA_RAGGED_VALUE: [f32; 64] = [
            -0.3125, 0.125, 0.5625, -0.4375, 0.0, 0.4375, -0.5625, -0.125, 0.5, -0.5, -0.0625, 0.375, -0.625, -0.1875,
            0.25, 0.6875, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -0.6875,
            -0.25, 0.1875, 0.625, -0.375, 0.0625, 0.5, -0.5, -0.0625, 0.375, -0.625, -0.1875, 0.25, 0.6875, -0.3125,
            0.125, 0.5625, -0.4375, 0.0, 0.4375, -0.5625, -0.125, 0.3125, -0.6875, -0.3125, 0.125, 0.5625, -0.4375,
            0.0, 0.4375, -0.5625, -0.125,
        ];
        let q = f32t(&[2, 1, 16], &pattern(32, 11));
        let (k, v) = (f32t(&[2, 1, 8], &pattern(16, 12)), f32t(&[2, 1, 8], &pattern(16, 13)));
        let (pk, pv) = (f32t(&[2, 1, 4, 8], &pattern(64, 14)), f32t(&[2, 1, 4, 8], &pattern(64, 15)));
        let (seqlens, total) = (i32s(&[2], &[1, 3]), i32s(&[], &[4]));
        let attrs = [("num_heads", Attr::Int(2)), ("kv_num_heads", Attr::Int(1)), ("local_window_size", Attr::Int(2))];
        let inputs = [Some(&q), Some(&k), Some(&v), Some(&pk), Some(&pv), Some(&seqlens), Some(&total)];
        let y = run_ms("GroupQueryAttention", &attrs, &inputs, 3).unwrap();
        assert_close(&f32s(&y[0]), &GQA_RAGGED_OUT, 1e-6);
        assert_eq!(f32s(&y[2]), GQA_RAGGED_VALUE);
    }

    #[test]
    fn gqa_packed_qkv_with_sink_bias_and_softcap_matches_onnxruntime() {
        // onnxruntime 1.32's outputs, including output_qk (qk_output=1: the softcapped, biased
        // scores, zero where masked).
        #[rustfmt::skip]
        const GQA_PACKED_OUT: [f32; 32] = [
            0.2807954, -0.2548348, -0.020496596, 0.21384162, -0.32178858, -0.08745037, 0.14688784, 0.025054347,
            0.46958596, -0.33849555, 0.015040109, 0.36857578, -0.43950576, -0.08597008, 0.26756558, -0.2686177,
            0.19854322, -0.01425682, -0.19947733, 0.110094205, -0.10270583, -0.28792635, 0.0216452, 0.19284974,
            0.39546132, -0.17808983, -0.081694216, 0.28942674, -0.28412437, -0.18772878, 0.18339217, -0.18154687,
        ];
        #[rustfmt::skip]
        const GQA_PACKED_QK: [f32; 12] = [
            -0.3781737, -0.22821185, 0.0, -0.8611456, 0.15959924, 0.41308242, 0.6709299, -0.5145478,
            0.0, 0.7163466, -0.54448855, -0.26919317,
        ];
        let qkv = f32t(&[1, 2, 32], &pattern(64, 16));
        let (pk, pv) = (f32t(&[1, 1, 1, 8], &pattern(8, 17)), f32t(&[1, 1, 1, 8], &pattern(8, 18)));
        let bias = f32t(&[1, 2, 2, 3], &pattern(12, 19));
        let sink = f32t(&[2], &[0.25, -0.5]);
        let (seqlens, total) = (i32s(&[1], &[2]), i32s(&[], &[3]));
        let attrs = [
            ("num_heads", Attr::Int(2)),
            ("kv_num_heads", Attr::Int(1)),
            ("softcap", Attr::Float(0.75)),
            ("qk_output", Attr::Int(1)),
        ];
        let inputs = [
            Some(&qkv),
            None,
            None,
            Some(&pk),
            Some(&pv),
            Some(&seqlens),
            Some(&total),
            None,
            None,
            None,
            Some(&bias),
            Some(&sink),
        ];
        let y = run_ms("GroupQueryAttention", &attrs, &inputs, 4).unwrap();
        assert_close(&f32s(&y[0]), &GQA_PACKED_OUT, 1e-6);
        assert_eq!(y[3].shape, vec![1, 2, 2, 3]);
        assert_close(&f32s(&y[3]), &GQA_PACKED_QK, 1e-6);
    }

    #[test]
    fn gqa_rejects_inconsistent_lengths() {
        let q = f32t(&[1, 1, 16], &pattern(16, 1));
        let k = f32t(&[1, 1, 8], &pattern(8, 2));
        let past = f32t(&[1, 1, 1, 8], &pattern(8, 3));
        let attrs = [("num_heads", Attr::Int(2)), ("kv_num_heads", Attr::Int(1))];
        // Total 5 with one new token needs 4 cached tokens, but the past holds only 1.
        let inputs =
            [Some(&q), Some(&k), Some(&k), Some(&past), Some(&past), Some(&i32s(&[1], &[4])), Some(&i32s(&[], &[5]))];
        let e = err_msg(run_ms("GroupQueryAttention", &attrs, &inputs, 3));
        assert!(e.contains("seqlens_k[0] = 4 is inconsistent"), "{e}");
        let e = err_msg(run_ms("GroupQueryAttention", &attrs[..1], &inputs, 3));
        assert!(e.contains("kv_num_heads"), "{e}");
    }

    /// Q [1, 2, 2, 4], K/V [1, 1, 2, 4], past [1, 1, 1, 4] from the test pattern.
    fn attention_inputs() -> [Tensor; 5] {
        [
            f32t(&[1, 2, 2, 4], &pattern(16, 1)),
            f32t(&[1, 1, 2, 4], &pattern(8, 2)),
            f32t(&[1, 1, 2, 4], &pattern(8, 3)),
            f32t(&[1, 1, 1, 4], &pattern(4, 4)),
            f32t(&[1, 1, 1, 4], &pattern(4, 5)),
        ]
    }

    #[test]
    fn attention_is_causal_from_the_end_of_the_past() {
        // onnxruntime 1.32's outputs for the causal case, 4-D and 3-D.
        const ATTN_CAUSAL_PAST_Y: [f32; 16] = [
            -0.12733777,
            0.31016222,
            -0.022240166,
            -0.25233778,
            0.15622663,
            0.078049965,
            -0.04202946,
            0.03122663,
            -0.10377981,
            0.33372015,
            -0.04036168,
            -0.22877981,
            -0.014556564,
            0.0015357807,
            0.053084917,
            -0.13955656,
        ];
        const ATTN_3D_Y: [f32; 16] = [
            -0.12733777,
            0.31016222,
            -0.022240166,
            -0.25233778,
            -0.10377981,
            0.33372015,
            -0.04036168,
            -0.22877981,
            0.15622663,
            0.078049965,
            -0.04202946,
            0.03122663,
            -0.014556564,
            0.0015357807,
            0.053084917,
            -0.13955656,
        ];
        let [q, k, v, pk, pv] = attention_inputs();
        let causal = [("is_causal", Attr::Int(1))];
        let y = run("Attention", &causal, &[Some(&q), Some(&k), Some(&v), None, Some(&pk), Some(&pv)], 3).unwrap();
        assert_close(&f32s(&y[0]), &ATTN_CAUSAL_PAST_Y, 1e-6);
        assert_eq!(y[1].shape, vec![1, 1, 3, 4]);
        assert_eq!(&f32s(&y[1])[..4], &pattern(4, 4)[..]);
        let to_3d = |t: &Tensor| {
            let bsnh = run1("Transpose", &[("perm", Attr::Ints(vec![0, 2, 1, 3]))], &[t]);
            let hidden = (t.shape[1] * t.shape[3]) as i64;
            run1("Reshape", &[], &[&bsnh, &i64t(&[3], &[1, 2, hidden])])
        };
        let attrs = [("is_causal", Attr::Int(1)), ("q_num_heads", Attr::Int(2)), ("kv_num_heads", Attr::Int(1))];
        let y = run(
            "Attention",
            &attrs,
            &[Some(&to_3d(&q)), Some(&to_3d(&k)), Some(&to_3d(&v)), None, Some(&pk), Some(&pv)],
            3,
        )
        .unwrap();
        assert_eq!(y[0].shape, vec![1, 2, 8]);
        assert_close(&f32s(&y[0]), &ATTN_3D_Y, 1e-6);
    }

    #[test]
    fn attention_float_mask_softcap_and_probabilities_output() {
        // onnxruntime 1.32's outputs with a float mask, softcap 0.5, scale 0.75 and
        // qk_matmul_output_mode 3 (the probabilities).
        const ATTN_MASK_Y: [f32; 16] = [
            0.25377205,
            -0.0050180685,
            -0.047597684,
            0.12877205,
            0.3021981,
            0.0034074448,
            -0.069463685,
            0.17719811,
            0.3025838,
            -0.03706816,
            -0.054044485,
            0.17758381,
            0.14772767,
            -0.056923427,
            0.013152223,
            0.022727646,
        ];
        const ATTN_MASK_QK: [f32; 12] = [
            0.18165584, 0.33396843, 0.48437575, 0.13275701, 0.3550408, 0.5122022, 0.1432151, 0.31615746, 0.5406275,
            0.29768667, 0.25559956, 0.4467138,
        ];
        let [q, k, v, pk, pv] = attention_inputs();
        let mask = f32t(&[2, 3], &pattern(6, 6));
        let attrs =
            [("qk_matmul_output_mode", Attr::Int(3)), ("softcap", Attr::Float(0.5)), ("scale", Attr::Float(0.75))];
        let y =
            run("Attention", &attrs, &[Some(&q), Some(&k), Some(&v), Some(&mask), Some(&pk), Some(&pv)], 4).unwrap();
        assert_close(&f32s(&y[0]), &ATTN_MASK_Y, 1e-6);
        assert_eq!(y[3].shape, vec![1, 2, 2, 3]);
        assert_close(&f32s(&y[3]), &ATTN_MASK_QK, 1e-6);
    }

    #[test]
    fn attention_fully_masked_rows_are_zero_and_short_masks_are_padded() {
        let [q, k, v, pk, pv] = attention_inputs();
        // Query row 0 may see nothing; row 1 sees everything.
        let mask = booleans(&[2, 3], &[false, false, false, true, true, true]);
        let y = run("Attention", &[], &[Some(&q), Some(&k), Some(&v), Some(&mask), Some(&pk), Some(&pv)], 1).unwrap();
        let out = f32s(&y[0]);
        assert_eq!(&out[..4], &[0.0; 4]);
        assert!(out[4..8].iter().any(|&x| x != 0.0));
        // A one-key mask is padded (not broadcast) with masked entries: only key 0 (the past) is
        // visible, so every output row is past value row 0.
        let short = booleans(&[1], &[true]);
        let y = run("Attention", &[], &[Some(&q), Some(&k), Some(&v), Some(&short), Some(&pk), Some(&pv)], 1).unwrap();
        assert_eq!(f32s(&y[0]), pattern(4, 5).repeat(4));
        let e = err_msg(run("Attention", &[], &[Some(&q), Some(&k), Some(&v), None, Some(&pk)], 1));
        assert!(e.contains("together"), "{e}");
    }

    #[test]
    fn nonpad_kv_seqlen_hides_padding_keys_and_moves_the_causal_frontier() {
        // One query against three keys that all score 0: the output is the mean of the values
        // the query may see.
        let (q, k) = (f32t(&[1, 1, 1, 1], &[1.0]), f32t(&[1, 1, 3, 1], &[0.0; 3]));
        let v = f32t(&[1, 1, 3, 1], &[1.0, 2.0, 30.0]);
        let attend = |nonpad: i64, causal: i64, opset: i64| {
            let lengths = i64t(&[1], &[nonpad]);
            let inputs = [Some(&q), Some(&k), Some(&v), None, None, None, Some(&lengths)];
            run_at("Attention", opset, &[("is_causal", Attr::Int(causal))], &inputs, 1)
        };
        // Two valid keys: values 1 and 2.
        assert_eq!(f32s(&attend(2, 0, 24).unwrap()[0]), vec![1.5]);
        // Causal with an external cache: offset 2 - 1, so the query sees keys 0 and 1.
        assert_eq!(f32s(&attend(2, 1, 24).unwrap()[0]), vec![1.5]);
        // One valid key: offset 0, key 0 only.
        assert_eq!(f32s(&attend(1, 1, 24).unwrap()[0]), vec![1.0]);
        assert!(err_msg(attend(2, 0, 23)).contains("opset 24"));
        assert!(err_msg(attend(4, 0, 24)).contains("within 0..=3"));
    }
}

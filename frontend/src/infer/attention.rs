//! Attention: ONNX Attention (opset 23; 4-D `[batch, heads, length, head]` or 3-D
//! `[batch, length, heads·head]` inputs), com.microsoft's GroupQueryAttention (packed or separate
//! QKV, caches of `kv_num_heads` heads) with their present key/value caches. RotaryEmbedding keeps
//! its input's shape and is dispatched to `like_first_input`.

use super::node::{opt, req, In, NodeCtx};
use super::value::{Ctx, Info};
use crate::error::ErrorKind;
use ir::{DType, Dim};

/// The keys' and values' geometry as Attention reads it.
struct KvGeometry {
    heads: Dim,
    head_k: Dim,
    head_v: Dim,
    len: Dim,
    batch: Dim,
}

/// Attention: the output has the query's layout with the value head size; the present caches
/// (outputs 1 and 2) are `[batch, kv heads, past + length, head]`, and output 3 (the QK product)
/// a size of its own.
pub(super) fn attention(n: &NodeCtx, ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    let (q, k, v) = (req(n, inputs, 0)?, req(n, inputs, 1)?, req(n, inputs, 2)?);
    let past_k = opt(inputs, 4);
    let kv = kv_geometry(n, k, v)?;
    // Keys and values have one length (torch.export names the two caches' lengths apart).
    if let Some(v_len) = v.shape.get(if v.shape.len() == 4 { 2 } else { 1 }) {
        ctx.unify(&kv.len, v_len);
    }
    let y = if q.shape.len() == 4 {
        vec![q.shape[0].clone(), q.shape[1].clone(), q.shape[2].clone(), kv.head_v.clone()]
    } else {
        let qh = n.attr_int("q_num_heads", 0)?;
        let w = kv.head_v.mul(&Dim::known(qh)).ok_or_else(|| n.shape_err("overflow"))?;
        vec![q.shape[0].clone(), q.shape[1].clone(), w]
    };
    let mut outs = vec![Info::new(q.dtype, y)];
    let total = match past_k {
        Some(p) if p.shape.len() == 4 => p.shape[2].add(&kv.len).ok_or_else(|| n.shape_err("overflow"))?,
        _ => kv.len,
    };
    let total = ctx.normalize(&total);
    let KvGeometry { heads, head_k, head_v, batch, .. } = kv;
    if n.num_outputs > 1 {
        outs.push(Info::new(k.dtype, vec![batch.clone(), heads.clone(), total.clone(), head_k]));
    }
    if n.num_outputs > 2 {
        outs.push(Info::new(v.dtype, vec![batch, heads, total, head_v]));
    }
    if n.num_outputs > 3 {
        outs.push(Info::new(q.dtype, vec![ctx.fresh("qk")]));
    }
    Ok(outs)
}

/// Heads, head sizes, length and batch of 4-D keys and values, or of 3-D ones split into
/// `kv_num_heads` heads.
fn kv_geometry(n: &NodeCtx, k: &Info, v: &Info) -> Result<KvGeometry, ErrorKind> {
    if k.shape.len() == 4 {
        let s = &k.shape;
        return Ok(KvGeometry {
            heads: s[1].clone(),
            head_k: s[3].clone(),
            head_v: v.shape[3].clone(),
            len: s[2].clone(),
            batch: s[0].clone(),
        });
    }
    let kvh = n.attr_int("kv_num_heads", 0)?;
    if kvh <= 0 {
        return Err(n.bad("3-D Attention inputs need kv_num_heads"));
    }
    let head_k =
        k.shape[2].div_exact(&Dim::known(kvh)).ok_or_else(|| n.shape_err("key width not divisible by kv_num_heads"))?;
    let head_v = v.shape[2]
        .div_exact(&Dim::known(kvh))
        .ok_or_else(|| n.shape_err("value width not divisible by kv_num_heads"))?;
    Ok(KvGeometry { heads: Dim::known(kvh), head_k, head_v, len: k.shape[1].clone(), batch: k.shape[0].clone() })
}

/// GroupQueryAttention: the output is `[batch, sequence, num_heads · head]`; the present caches
/// (outputs 1 and 2) `[batch, kv_num_heads, total, head]`, where the head size divides the query
/// width (packed QKV when key is absent: `num_heads + 2·kv_num_heads` heads); output 3 (the QK
/// product) is float32 of a size of its own.
pub(super) fn group_query_attention(n: &NodeCtx, ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    let q = req(n, inputs, 0)?;
    if q.shape.len() != 3 {
        return Err(n.shape_err("query must be [batch, sequence, hidden]"));
    }
    let heads = n.attr_int("num_heads", 0)?;
    let kv_heads = n.attr_int("kv_num_heads", 0)?;
    if heads <= 0 || kv_heads <= 0 || heads % kv_heads != 0 {
        return Err(n.bad(format!(
            "num_heads {heads} and kv_num_heads {kv_heads} must be positive, heads a multiple of kv heads"
        )));
    }
    let width = if opt(inputs, 1).is_some() { heads } else { heads + 2 * kv_heads };
    let head = q.shape[2]
        .div_exact(&Dim::known(width))
        .ok_or_else(|| n.shape_err(format!("query width {} is not a multiple of {width} heads", q.shape[2])))?;
    unify_caches(n, ctx, [opt(inputs, 3), opt(inputs, 4)], kv_heads, &head)?;
    let total = gqa_total_length(n, ctx, inputs, q)?;
    let hidden = head.mul(&Dim::known(heads)).ok_or_else(|| n.shape_err("overflow"))?;
    let mut outs = vec![Info::new(q.dtype, vec![q.shape[0].clone(), q.shape[1].clone(), hidden])];
    for _ in 1..n.num_outputs.min(3) {
        outs.push(Info::new(q.dtype, vec![q.shape[0].clone(), Dim::known(kv_heads), total.clone(), head.clone()]));
    }
    if n.num_outputs > 3 {
        outs.push(Info::new(DType::F32, vec![ctx.fresh("qk")]));
    }
    Ok(outs)
}

/// The caches hold kv_num_heads heads of the query's head size; the builder declares the last
/// dim as a size of its own (`kv_cache_dim`), which this makes the head size.
fn unify_caches(
    n: &NodeCtx,
    ctx: &mut Ctx,
    caches: [Option<&Info>; 2],
    kv_heads: i64,
    head: &Dim,
) -> Result<(), ErrorKind> {
    for cache in caches.into_iter().flatten().filter(|c| c.shape.len() == 4) {
        for (dim, want) in [(&cache.shape[1], Dim::known(kv_heads)), (&cache.shape[3], head.clone())] {
            let dim = ctx.normalize(dim);
            if dim.is_known() && want.is_known() && dim != want {
                return Err(n.shape_err(format!(
                    "a past cache is {} where {want} is expected",
                    ir::dim::shape_to_string(&cache.shape)
                )));
            }
            ctx.unify(&dim, &want);
        }
    }
    Ok(())
}

/// The present caches' length. Without a shared KV buffer the present cache is the past plus
/// this step's tokens, which is what `total_sequence_length` (input 6) must then be.
fn gqa_total_length(n: &NodeCtx, ctx: &mut Ctx, inputs: In, q: &Info) -> Result<Dim, ErrorKind> {
    let appended = match opt(inputs, 3) {
        Some(p) if p.shape.len() == 4 => Some(p.shape[2].add(&q.shape[1]).ok_or_else(|| n.shape_err("overflow"))?),
        _ => None,
    };
    let total = match (opt(inputs, 6).and_then(|t| t.as_dims()), appended) {
        (Some((d, _)), Some(a)) if d.len() == 1 => ctx.unify(&d[0], &a),
        (Some((d, _)), None) if d.len() == 1 => d[0].clone(),
        (_, Some(a)) => a,
        _ => ctx.fresh("total"),
    };
    Ok(ctx.normalize(&total))
}

#[cfg(test)]
mod tests {
    use crate::infer::testing::*;
    use crate::infer::Ctx;
    use ir::DType::*;
    use ir::Dim;

    /// GroupQueryAttention with SmolLM2's 9 query and 3 KV heads.
    fn gqa() -> TestNode {
        TestNode::contrib("gqa", "GroupQueryAttention").int("num_heads", 9).int("kv_num_heads", 3).outputs(3)
    }

    #[test]
    fn gqa_presents_the_past_plus_this_steps_tokens() {
        // Head size 576 / 9 = 64; present caches [batch, kv_num_heads, past + seq, 64].
        let q = value(F16, &["batch", "seq", "576"]);
        let kv = value(F16, &["batch", "seq", "192"]);
        let past = value(F16, &["batch", "3", "past", "64"]);
        let (seqlens, total) = (value(I32, &["batch"]), value(I32, &[]));
        let present = "f16[batch,3,past + seq,64]";
        let out = gqa().types(&[&q, &kv, &kv, &past, &past, &seqlens, &total]);
        assert_eq!(out, ["f16[batch,seq,576]", present, present]);
        // Packed QKV (no key input): the query holds 9 + 2·3 heads of 64.
        let packed = value(F16, &["batch", "seq", "960"]);
        let inputs = [Some(&packed), None, None, Some(&past), Some(&past), Some(&seqlens), Some(&total)];
        let out = gqa().infer(&mut Ctx::default(), &inputs).unwrap();
        assert_eq!(out.iter().map(typed).collect::<Vec<_>>(), ["f16[batch,seq,576]", present, present]);
    }

    #[test]
    fn gqa_makes_total_sequence_length_and_the_cache_head_size_what_they_must_be() {
        // The builder names the cache's last dim kv_cache_dim and passes total_sequence_length.
        let q = value(F16, &["batch", "seq", "576"]);
        let kv = value(F16, &["batch", "seq", "192"]);
        let past = value(F16, &["batch", "3", "past", "kv_cache_dim"]);
        let (seqlens, total) = (value(I32, &["batch"]), size(sym("total")));
        let mut ctx = Ctx::default();
        let inputs = [&q, &kv, &kv, &past, &past, &seqlens, &total].map(Some);
        let out = gqa().infer(&mut ctx, &inputs).unwrap();
        assert_eq!(typed(&out[1]), "f16[batch,3,past + seq,64]");
        let want = [("kv_cache_dim".to_string(), Dim::known(64)), ("total".to_string(), sum("past", "seq"))];
        assert_eq!(ctx.substitutions, want);
    }

    #[test]
    fn gqa_refuses_head_counts_and_caches_that_do_not_fit() {
        let q = value(F16, &["batch", "seq", "576"]);
        let kv = value(F16, &["batch", "seq", "192"]);
        let gqa_9_4 = TestNode::contrib("gqa", "GroupQueryAttention").int("num_heads", 9).int("kv_num_heads", 4);
        let err = gqa_9_4.refusal(&[&q, &kv, &kv]);
        let want = "num_heads 9 and kv_num_heads 4 must be positive, heads a multiple of kv heads";
        assert_eq!(err, format!("node `gqa` (GroupQueryAttention): {want}"));
        let past = value(F16, &["batch", "4", "past", "64"]);
        let err = gqa().refusal(&[&q, &kv, &kv, &past, &past]);
        let want = "shape mismatch: a past cache is [batch,4,past,64] where 3 is expected";
        assert_eq!(err, format!("node `gqa` (GroupQueryAttention): {want}"));
        let err = gqa().refusal(&[&value(F16, &["batch", "seq", "500"]), &kv, &kv]);
        let want = "shape mismatch: query width 500 is not a multiple of 9 heads";
        assert_eq!(err, format!("node `gqa` (GroupQueryAttention): {want}"));
    }

    #[test]
    fn attention_4d_presents_past_plus_new_keys_with_each_head_size() {
        // Y: [batch, q_heads, q_length, v_head]; present_key/value: [batch, kv_heads, past + kv, head].
        let q = value(F32, &["b", "8", "s", "64"]);
        let (k, v) = (value(F32, &["b", "2", "kv", "64"]), value(F32, &["b", "2", "kv", "32"]));
        let (past_k, past_v) = (value(F32, &["b", "2", "past", "64"]), value(F32, &["b", "2", "past", "32"]));
        let attn = TestNode::new("attn", "Attention").outputs(3);
        let inputs = [Some(&q), Some(&k), Some(&v), None, Some(&past_k), Some(&past_v)];
        let out = attn.infer(&mut Ctx::default(), &inputs).unwrap();
        // The printer orders a sum's terms by name: kv + past.
        let want = ["f32[b,8,s,32]", "f32[b,2,kv + past,64]", "f32[b,2,kv + past,32]"];
        assert_eq!(out.iter().map(typed).collect::<Vec<_>>(), want);
    }

    #[test]
    fn attention_3d_splits_widths_into_heads_and_needs_kv_num_heads() {
        // Q [b, s, 8·64], K and V [b, kv, 2·64]: Y is [b, s, 8·64].
        let q = value(F32, &["b", "s", "512"]);
        let kv = value(F32, &["b", "kv", "128"]);
        let attn = TestNode::new("attn", "Attention").int("q_num_heads", 8).int("kv_num_heads", 2);
        assert_eq!(attn.types(&[&q, &kv, &kv]), ["f32[b,s,512]"]);
        let err = TestNode::new("attn", "Attention").int("q_num_heads", 8).refusal(&[&q, &kv, &kv]);
        assert_eq!(err, "node `attn` (Attention): 3-D Attention inputs need kv_num_heads");
    }

    #[test]
    fn attention_keys_and_values_have_one_length() {
        let q = value(F32, &["b", "8", "s", "64"]);
        let (k, v) = (value(F32, &["b", "2", "k_len", "64"]), value(F32, &["b", "2", "v_len", "64"]));
        let mut ctx = Ctx::default();
        let out = TestNode::new("attn", "Attention").outputs(2).infer(&mut ctx, &[Some(&q), Some(&k), Some(&v)]);
        assert_eq!(typed(&out.unwrap()[1]), "f32[b,2,v_len,64]");
        assert_eq!(ctx.substitutions, [("k_len".to_string(), sym("v_len"))]);
    }

    #[test]
    fn rotary_embedding_keeps_its_input_type() {
        let x = value(F16, &["batch", "seq", "576"]);
        let (cos, sin, pos) = (value(F16, &["2048", "32"]), value(F16, &["2048", "32"]), value(I64, &["batch", "seq"]));
        let rope = TestNode::new("rope", "RotaryEmbedding").int("num_heads", 9);
        assert_eq!(rope.types(&[&x, &cos, &sin, &pos]), ["f16[batch,seq,576]"]);
    }
}

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

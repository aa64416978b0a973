//! Rule family `attention`: scaled-dot-product attention over the KV cache into one
//! `npuc::Attention{q_heads, kv_heads, scale}(q, k, v, past_k, past_v, mask)` → y, present_k,
//! present_v (BNSH layout; exact semantics in `ir::fused::attention`).
//!
//! Identity: query i of `q` [B, Hq, S, D] (absolute position P + i, P the past length) attends to
//! key t of `concat(past_k, k)` [B, Hkv, P+S, D] when `t ≤ P + i` and `mask[b, t] ≠ 0`, with
//! weights `softmax(scale · q·k_t)`, query head h reading kv head `h / (Hq/Hkv)`; the presents are
//! `concat(past, new)` on the sequence axis. Every rule below unions the op's `y` with the
//! attention output and `present_k`/`present_v` with the graph's KV concatenations (or the
//! presents of the folded op), so the cache append disappears into the op.
//!
//! Exporter spellings recognised:
//! - torch / optimum eager attention (optimum-onnx's export; Llama, Qwen3, SmolLM2): `present = Concat{axis=2}
//!   (past, new)`; kv heads repeated by `Reshape(Expand(Unsqueeze(present, [2])))` (absent when
//!   Hq = Hkv); `MatMul(Softmax{axis=-1}(Add(Div or Mul(MatMul(q, Transpose{perm=[0,1,3,2]}
//!   (k_rep)), s), mask)), v_rep)`. The mask must be the one transformers builds from
//!   `attention_mask` and the cache position, float32 min where masked, in one of two spellings
//!   matched node for node (anything else is declined, saying which part differs):
//!   - eager causal mask (Llama, SmolLM2): `Where(Equal(causal + Unsqueeze(Cast(attention_mask),
//!     [1,2]), 0), min, causal)` with `causal = Expand(Unsqueeze(Trilu{upper=1}(ConstantOfShape
//!     (min), 1) · Cast(Greater(Range(0, T), Reshape(Range(P, T), [-1, 1]))), [0,1]))`;
//!   - `masking_utils` (Qwen3): `Expand(Max(Unsqueeze(Where(LessOrEqual(Unsqueeze(Range(0, T),
//!     [0]), Unsqueeze(Range(0, S) + P, [1])), 0, min), [0,1]) + Unsqueeze((1 − Cast
//!     (attention_mask))·min, [1,2]), min))` with `T = S + P`.
//!
//!   Both are "causal AND attention_mask"; the fold passes `attention_mask` itself as the mask.
//!   Exact for 0/1 attention masks (the Qwen3 spelling adds `(1 − m)·min`, so other values are
//!   not a mask there). A query row with no visible key at all (a fully padded row) differs: the
//!   decomposed softmax averages every key uniformly (all scores equal float32 min), the fused op
//!   outputs zeros; such rows are padding whose output nothing reads.
//! - torch.export (`torch.onnx.export(dynamo=True)`): as transformers' SDPA export above, with
//!   `kᵀ` spelled `Reshape(Transpose{[0,2,1]}(Reshape(k, [B·H, T, D])), [B, H, D, T])`, which
//!   `attention-kt-through-3d` proves a 4-D transpose from the shapes.
//! - onnxruntime-genai `com.microsoft::GroupQueryAttention` (the model builder): query/key/value
//!   `[B, S, H·D]` (the builder packs Q, K and V into `query` with key/value absent, except where
//!   it splits them itself, as for Qwen3's q/k norms), BNSH
//!   caches, `seqlens_k`, `total_sequence_length`, rotary caches `[max_pos, D/2]` with
//!   `do_rotary=1`. Lowered to `Reshape`/`Transpose` into BNSH (one `Slice` per part when packed),
//!   `Rope` on q and k with tables `Gather(cache, Range(P, P+S))` widened to D (the positions the
//!   fused op itself assumes), `Attention`, and `Transpose`/`Reshape` back. The mask is
//!   `attention_mask` when `seqlens_k = Cast(ReduceSum(attention_mask, [1]) − 1)`, absent
//!   otherwise. GroupQueryAttention keys its positions and cache writes on `seqlens_k`; the two
//!   agree when every attention_mask row is all ones (what onnxruntime-genai feeds it), and the
//!   fold is declined when the present length is not `past + S` (a shared-buffer cache is written
//!   in place, not appended). A local window (`local_window_size`, gpt-oss) becomes Attention's
//!   `window` and `head_sink` its `sinks` input. Declined: softcap, smooth softmax, quantised
//!   caches, position_ids, attention bias, partial rotary.
//! - ai.onnx `Attention` (opset 23; torch dynamo's export after onnxscript's fusion): 3-D `[B, S, H·D]` Q/K/V with
//!   `q_num_heads`/`kv_num_heads` (viewed as heads through the Reshape they came from, if any) or
//!   4-D BNSH, BNSH past, `is_causal=1` (bottom-right aligned with the past, as the fused op) or
//!   `is_causal=0` with a mask proven causal (and windowed, when it is) by probing it, and
//!   a boolean mask `Expand(Cast{to=bool}(Unsqueeze(attention_mask, [1,2])))` or none. A mask
//!   width named by a size of its own (`total_sequence_length`, which the exporter declares as
//!   past + S without the graph saying so) is taken as past + S; the fused op checks it at run
//!   time. Declined: `is_causal=0` with a mask the probe cannot prove causal, softcap, a used
//!   scores output.
//!
//! QDQ graphs (`quantize_static` and AMD Quark on optimum's export, eager or SDPA where the pairs sit on
//! q·√s and kᵀ·√s and the probabilities follow the NaN guard): Q/DQ pairs sit on both
//! activation×activation matmuls: on q and kᵀ into QKᵀ, on the scores after it, on the
//! probabilities and on v into AV.
//! Decision: dequantise. The pairs inside the attention are dropped and the float attention is
//! fused; the pair on the attention output (next to o_proj's input quantisation) stays, exact. An
//! NPU attention kernel (flash-attention style on AIE tiles, the Intel NPU's SDPA) computes QKᵀ,
//! an online softmax and P·V in bf16/f32 with the [S, T] scores never leaving the tile; an int8
//! attention would need the scores requantised between the matmuls with one calibrated scale for
//! every row and softmax over codes, and the probabilities on a static 8-bit grid (steps of
//! max/255) are the coarsest values of the whole QDQ graph. Each pair costs a round-half-even, a
//! clamp and a rescale of a [B, H, S, T] tensor on the host. Dropping one changes each value by at
//! most half its quantisation step (values calibration clamps excepted), so the fused result
//! differs from ONNX Runtime's QDQ run by about the quantisation noise the pairs added, and is
//! ONNX Runtime's on the same file with exactly those pairs bypassed (the corpus's contract for
//! QDQ files, `tests/corpus.rs`).

use crate::apply::{bound, no_match, Computed, Decline, Fold, Folded};
use crate::cond::var;
use crate::egraph_ops::{
    add_typed, attrs, cache_rows, dim_value, dims, full_width, heads_view, i64_scalar, i64s, int_attr, is_absent,
    is_int, node_attrs, node_of, onnx, reshape, rope, scalar_value, transpose, type_of, union_all,
};
use crate::Rewrite;
use egg::{rewrite as rw, ENodeOrVar, Id, Language, Pattern, Subst, Symbol};
use ir::egraph::{EGraph, ENode, Head, TypeInfo};
use ir::{Attr, Attrs, DType, Dim, Domain};

/// The family's rules.
pub fn rules() -> Vec<Rewrite> {
    #[rustfmt::skip]
    let rules = vec![
        // softmax(q·kᵀ / s + causal∧mask)·v over concat(past, new), kv heads repeated  →  Attention
        rw!("attention-sdpa-div";
            "(MatMul (Softmax{axis=-1} (Add (Div (MatMul ?q (Transpose{perm=[0,1,3,2]} ?krep)) ?s) ?mask)) ?vrep)"
            => { FoldSdpa::new(ScaleBy::Divide) }),
        // softmax(q·kᵀ · s + causal∧mask)·v over concat(past, new), kv heads repeated  →  Attention
        rw!("attention-sdpa-mul";
            "(MatMul (Softmax{axis=-1} (Add (Mul (MatMul ?q (Transpose{perm=[0,1,3,2]} ?krep)) ?s) ?mask)) ?vrep)"
            => { FoldSdpa::new(ScaleBy::Multiply) }),
        // k [B,H,T,D] reshaped to [B·H,T,D], transposed [0,2,1], reshaped to [B,H,D,T]  =  Transpose{[0,1,3,2]}(k)
        rw!("attention-kt-through-3d";
            "(Reshape (Transpose{perm=[0,2,1]} ?flat) ?shape)"
            => { Computed::new(KtThrough3d) }),
        // softmax((q·√s)·(kᵀ·√s) + causal∧mask)·v, NaN rows zeroed, over concat(past, new)  →  Attention
        rw!("attention-sdpa-split-scale";
            "(MatMul (Where (IsNaN (Softmax{axis=-1} (Add (MatMul (Mul ?q ?s) (Mul (Transpose{perm=[0,1,3,2]} ?krep) ?s2)) ?mask))) ?zero (Softmax{axis=-1} (Add (MatMul (Mul ?q ?s) (Mul (Transpose{perm=[0,1,3,2]} ?krep) ?s2)) ?mask))) ?vrep)"
            => { FoldSdpa::new(ScaleBy::Split) }),
        // the split-scale form with Q/DQ pairs on q·√s, kᵀ·√s, the scores, the probabilities and v, dropped  →  Attention
        rw!("attention-sdpa-split-scale-qdq";
            "(MatMul (DequantizeLinear (QuantizeLinear (Where (IsNaN (Softmax{axis=-1} (Add (DequantizeLinear (QuantizeLinear (MatMul (DequantizeLinear (QuantizeLinear (Mul ?q ?s) ?qs ?qz) ?qs ?qz) (DequantizeLinear (QuantizeLinear (Mul (Transpose{perm=[0,1,3,2]} ?krep) ?s2) ?ks ?kz) ?ks ?kz)) ?ss ?sz) ?ss ?sz) ?mask))) ?zero (Softmax{axis=-1} (Add (DequantizeLinear (QuantizeLinear (MatMul (DequantizeLinear (QuantizeLinear (Mul ?q ?s) ?qs ?qz) ?qs ?qz) (DequantizeLinear (QuantizeLinear (Mul (Transpose{perm=[0,1,3,2]} ?krep) ?s2) ?ks ?kz) ?ks ?kz)) ?ss ?sz) ?ss ?sz) ?mask))) ?ps ?pz) ?ps ?pz) (DequantizeLinear (QuantizeLinear ?vrep ?vs ?vz) ?vs ?vz))"
            => { FoldSdpa::new(ScaleBy::Split) }),
        // the same with Q/DQ pairs on q, kᵀ, the scores, the probabilities and v, dropped  →  Attention
        rw!("attention-sdpa-div-qdq";
            "(MatMul (DequantizeLinear (QuantizeLinear (Softmax{axis=-1} (Add (Div (DequantizeLinear (QuantizeLinear (MatMul (DequantizeLinear (QuantizeLinear ?q ?qs ?qz) ?qs ?qz) (DequantizeLinear (QuantizeLinear (Transpose{perm=[0,1,3,2]} ?krep) ?ks ?kz) ?ks ?kz)) ?ss ?sz) ?ss ?sz) ?s) ?mask)) ?ps ?pz) ?ps ?pz) (DequantizeLinear (QuantizeLinear ?vrep ?vs ?vz) ?vs ?vz))"
            => { FoldSdpa::new(ScaleBy::Divide) }),
        // the same with Q/DQ pairs on q, kᵀ, the scores, the probabilities and v, dropped  →  Attention
        rw!("attention-sdpa-mul-qdq";
            "(MatMul (DequantizeLinear (QuantizeLinear (Softmax{axis=-1} (Add (Mul (DequantizeLinear (QuantizeLinear (MatMul (DequantizeLinear (QuantizeLinear ?q ?qs ?qz) ?qs ?qz) (DequantizeLinear (QuantizeLinear (Transpose{perm=[0,1,3,2]} ?krep) ?ks ?kz) ?ks ?kz)) ?ss ?sz) ?ss ?sz) ?s) ?mask)) ?ps ?pz) ?ps ?pz) (DequantizeLinear (QuantizeLinear ?vrep ?vs ?vz) ?vs ?vz))"
            => { FoldSdpa::new(ScaleBy::Multiply) }),
        // GroupQueryAttention(q, k, v, cache, seqlens, total, rotary caches)  →  Rope, Rope, Attention in BNSH
        rw!("attention-gqa";
            "(com.microsoft::GroupQueryAttention ?q ?k ?v ?pk ?pv ?seqlens ?total ?cos ?sin)"
            => { Computed::new(FoldGqa) }),
        // GroupQueryAttention(q, k, v, cache, seqlens, total) without rotary  →  Attention in BNSH
        rw!("attention-gqa-no-rotary";
            "(com.microsoft::GroupQueryAttention ?q ?k ?v ?pk ?pv ?seqlens ?total)"
            => { Computed::new(FoldGqa) }),
        // the same with position_ids, attention_bias or head_sink inputs: folded only when absent
        rw!("attention-gqa-position-ids";
            "(com.microsoft::GroupQueryAttention ?q ?k ?v ?pk ?pv ?seqlens ?total ?cos ?sin ?position_ids)"
            => { Computed::new(FoldGqa) }),
        rw!("attention-gqa-bias";
            "(com.microsoft::GroupQueryAttention ?q ?k ?v ?pk ?pv ?seqlens ?total ?cos ?sin ?position_ids ?bias)"
            => { Computed::new(FoldGqa) }),
        rw!("attention-gqa-head-sink";
            "(com.microsoft::GroupQueryAttention ?q ?k ?v ?pk ?pv ?seqlens ?total ?cos ?sin ?position_ids ?bias ?head_sink)"
            => { Computed::new(FoldGqa) }),
        // Attention{is_causal=1}(q, k, v, padding mask, cache)  →  Attention in BNSH
        rw!("attention-onnx";
            "(Attention ?q ?k ?v ?mask ?pk ?pv)"
            => { Computed::new(FoldOnnx) }),
        // Attention{is_causal=1}(q, k, v, padding mask) without a cache  →  Attention in BNSH
        rw!("attention-onnx-no-cache";
            "(Attention ?q ?k ?v ?mask)"
            => { Computed::new(FoldOnnx) }),
    ];
    rules
}

/// The inputs and attributes of one `npuc::Attention`.
struct AttentionInputs {
    q: Id,
    k: Id,
    v: Id,
    past_k: Option<Id>,
    past_v: Option<Id>,
    mask: Option<Id>,
    q_heads: i64,
    kv_heads: i64,
    scale: f32,
    /// A sliding window (positions a query sees, its own included).
    window: Option<usize>,
    /// A sink logit per query head (`[q_heads]`).
    sinks: Option<Id>,
}

/// Adds `Attention(..)` and returns its three projections (y, present_k, present_v).
fn add_attention(egraph: &mut EGraph, a: &AttentionInputs) -> [Id; 3] {
    let absent = egraph.add(ENode::leaf(Head::Absent));
    let opt = |x: Option<Id>| x.unwrap_or(absent);
    let mut pairs =
        vec![("q_heads", Attr::Int(a.q_heads)), ("kv_heads", Attr::Int(a.kv_heads)), ("scale", Attr::Float(a.scale))];
    pairs.extend(a.window.map(|w| ("window", Attr::Int(w as i64))));
    let node = ENode::op(
        Domain::Npuc,
        "Attention",
        attrs(&pairs),
        [a.q, a.k, a.v, opt(a.past_k), opt(a.past_v), opt(a.mask)].into_iter().chain(a.sinks).collect(),
    );
    let tuple = egraph.add(node);
    [0, 1, 2].map(|i| egraph.add(ENode { head: Head::Proj(i), children: vec![tuple] }))
}

/// Pairs each output of the matched op's class `tuple` with its counterpart in `mine`: the class
/// itself when the op has one output (a single-output node is its own value), its projections
/// otherwise.
fn outputs_of(egraph: &EGraph, tuple: Id, mine: [Id; 3]) -> Vec<(Id, Id)> {
    if egraph[tuple].data.types.len() == 1 {
        return vec![(tuple, mine[0])];
    }
    (0..3)
        .filter_map(|i| egraph.lookup(ENode { head: Head::Proj(i), children: vec![tuple] }).map(|p| (p, mine[i])))
        .collect()
}

/// True when the class is a one-element constant at or below −1e30: a masked score (float32 min
/// in every exporter) whose exponential underflows to exactly zero against any real score.
fn is_masking_value(egraph: &EGraph, id: Id) -> bool {
    scalar_value(egraph, id).is_some_and(|v| v <= -1e30)
}

/// How the scores are scaled in an eager-attention match.
#[derive(Clone, Copy)]
enum ScaleBy {
    Divide,
    Multiply,
    /// `(q·?s)·(kᵀ·?s2)`: transformers' SDPA export scales both operands by √scale.
    Split,
}

/// Folds eager attention (optimum's export and its QDQ graphs) into `Attention`.
struct FoldSdpa {
    scale: ScaleBy,
    masks: MaskPatterns,
}

/// The KV cache an eager-attention match reads: each present, the past and new parts it
/// concatenates, and how many query heads each of its heads serves.
struct EagerCache {
    present_k: Id,
    present_v: Id,
    past_k: Id,
    past_v: Id,
    k: Id,
    v: Id,
    k_rep: i64,
    v_rep: i64,
}

/// The shapes of an eager-attention match, checked to agree: the query's dims, the head counts
/// and the past and total lengths.
struct EagerShapes {
    qd: Vec<Dim>,
    q_heads: i64,
    kv_heads: i64,
    past_len: Dim,
    total: Dim,
}

impl FoldSdpa {
    fn new(scale: ScaleBy) -> Computed<FoldSdpa> {
        Computed::new(FoldSdpa { scale, masks: MaskPatterns::new() })
    }

    /// The factor the scores are multiplied by.
    fn score_scale(&self, egraph: &EGraph, subst: &Subst) -> Result<f32, Decline> {
        let s = scalar_value(egraph, subst[var("?s")]).ok_or("the score scale is not a constant scalar")?;
        let scale = match self.scale {
            ScaleBy::Divide => 1.0 / s,
            ScaleBy::Multiply => s,
            ScaleBy::Split => {
                if scalar_value(egraph, subst[var("?zero")]) != Some(0.0) {
                    return Err("the NaN guard after the softmax does not write 0".into());
                }
                s * scalar_value(egraph, subst[var("?s2")]).ok_or("the key scale is not a constant scalar")?
            }
        } as f32;
        if !scale.is_finite() || scale == 0.0 {
            return Err(format!("score scale {s} is not usable").into());
        }
        Ok(scale)
    }
}

impl Fold for FoldSdpa {
    fn fold(&self, egraph: &mut EGraph, eclass: Id, subst: &Subst, rule: Symbol) -> Folded {
        let [q, krep, vrep, mask] = bound(subst, ["?q", "?krep", "?vrep", "?mask"]);
        let scale = self.score_scale(egraph, subst)?;
        let c = eager_cache(egraph, krep, vrep)?;
        let EagerShapes { qd, q_heads, kv_heads, past_len, total } = eager_shapes(egraph, q, &c)?;
        let seq = qd[2].clone();
        let mut caps = vec![];
        let found = self.masks.attention_mask(egraph, mask, (&qd[0], &seq, &total), &mut caps);
        record_caps(egraph, rule, &caps);
        let (am, window) = match found {
            Ok(am) => (am, None),
            Err(_) => {
                let proven = crate::causal_mask::padding_source(egraph, mask, &qd[0], &seq, &past_len)?;
                (proven.padding, proven.window)
            }
        };
        let inputs = AttentionInputs {
            q,
            k: c.k,
            v: c.v,
            past_k: Some(c.past_k),
            past_v: Some(c.past_v),
            mask: Some(am),
            q_heads,
            kv_heads,
            scale,
            window,
            sinks: None,
        };
        let [y, pk, pv] = add_attention(egraph, &inputs);
        Ok(union_all(egraph, rule, &[(eclass, y), (c.present_k, pk), (c.present_v, pv)]))
    }
}

/// The KV cache behind the repeated keys `krep` and values `vrep` of an eager-attention match.
fn eager_cache(egraph: &EGraph, krep: Id, vrep: Id) -> Result<EagerCache, Decline> {
    let (present_k, k_rep) =
        repeated_kv(egraph, krep).ok_or("the keys are not the cache, repeated over the query heads")?;
    let (present_v, v_rep) =
        repeated_kv(egraph, vrep).ok_or("the values are not the cache, repeated over the query heads")?;
    let (past_k, k) =
        cache_append(egraph, present_k).ok_or("the keys are not concat(past, new) on the sequence axis")?;
    let (past_v, v) =
        cache_append(egraph, present_v).ok_or("the values are not concat(past, new) on the sequence axis")?;
    Ok(EagerCache { present_k, present_v, past_k, past_v, k, v, k_rep, v_rep })
}

/// The shapes of query `q` over cache `c`, when they agree on batch, heads, sequence and
/// head_dim.
fn eager_shapes(egraph: &EGraph, q: Id, c: &EagerCache) -> Result<EagerShapes, Decline> {
    let qd = dims(egraph, q).ok_or_else(no_match)?;
    let kd = dims(egraph, c.k).ok_or_else(no_match)?;
    let (vd, pkd, pvd) = (dims(egraph, c.v), dims(egraph, c.past_k), dims(egraph, c.past_v));
    let td = dims(egraph, c.present_k).ok_or_else(no_match)?;
    if qd.len() != 4 || kd.len() != 4 || td.len() != 4 {
        return Err("q and the cache are not [batch, heads, sequence, head_dim]".into());
    }
    let (Some(q_heads), Some(kv_heads)) = (qd[1].as_known(), kd[1].as_known()) else {
        return Err("head counts are not known".into());
    };
    let (k_rep, v_rep) = (c.k_rep, c.v_rep);
    if k_rep != v_rep || kv_heads * k_rep != q_heads {
        return Err(format!(
            "{q_heads} query heads are not {kv_heads} kv heads repeated {k_rep} (keys) / {v_rep} (values) times"
        )
        .into());
    }
    let kv = [qd[0].clone(), kd[1].clone(), qd[2].clone(), qd[3].clone()];
    let past =
        [qd[0].clone(), kd[1].clone(), pkd.as_ref().and_then(|p| p.get(2).cloned()).unwrap_or_default(), qd[3].clone()];
    if kd != kv
        || vd.as_deref() != Some(&kv[..])
        || pkd.as_deref() != Some(&past[..])
        || pvd.as_deref() != Some(&past[..])
    {
        return Err("q, the new keys/values and the past do not agree on batch, heads, sequence and head_dim".into());
    }
    let [_, _, past_len, _] = past;
    Ok(EagerShapes { qd, q_heads, kv_heads, past_len, total: td[2].clone() })
}

/// torch.export's `kᵀ`: a 4-D `[B, H, T, D]` value reshaped to `[B·H, T, D]`, transposed to
/// `[B·H, D, T]` and reshaped back to `[B, H, D, T]` is that value transposed over its last two
/// axes. The shapes of the three classes prove it; the reshapes' shape operands (computed in the
/// graph from `Shape`) are not read.
struct KtThrough3d;

impl Fold for KtThrough3d {
    fn fold(&self, egraph: &mut EGraph, eclass: Id, subst: &Subst, rule: Symbol) -> Folded {
        let flat = subst[var("?flat")];
        let (Some(fd), Some(out)) = (dims(egraph, flat), dims(egraph, eclass)) else { return Err(no_match()) };
        let x = node_of(egraph, flat, Domain::Onnx, "Reshape").map(|n| n.children[0]).ok_or_else(no_match)?;
        let xd = dims(egraph, x).ok_or_else(no_match)?;
        let merged = xd.len() == 4 && xd[0].mul(&xd[1]).is_some_and(|bh| fd == [bh, xd[2].clone(), xd[3].clone()]);
        if !merged || out != [xd[0].clone(), xd[1].clone(), xd[3].clone(), xd[2].clone()] {
            return Err(no_match());
        }
        let t = transpose(egraph, x, &[0, 1, 3, 2]).ok_or_else(no_match)?;
        Ok(union_all(egraph, rule, &[(eclass, t)]))
    }
}

/// `class` is the BNSH cache repeated over the query heads the way transformers' `repeat_kv`
/// spells it, `Reshape(Expand(Unsqueeze(cache, [2]), [B, Hkv, n, T, D]), [B, Hkv·n, T, D])`
/// (head h reads cache head h / n), or the 4-D cache itself (n = 1): the cache and n.
fn repeated_kv(egraph: &EGraph, class: Id) -> Option<(Id, i64)> {
    let expanded = node_of(egraph, class, Domain::Onnx, "Reshape").and_then(|r| {
        let e = node_of(egraph, r.children[0], Domain::Onnx, "Expand")?;
        let u = node_of(egraph, e.children[0], Domain::Onnx, "Unsqueeze")?;
        let cache = *u.children.first()?;
        if u.children.len() != 2 || !is_int(egraph, u.children[1], &[2]) {
            return None;
        }
        let (c, x, y) = (dims(egraph, cache)?, dims(egraph, r.children[0])?, dims(egraph, class)?);
        let n = x.get(2)?.as_known()?;
        let heads = c.get(1)?.as_known()?;
        let ok = c.len() == 4
            && x == [c[0].clone(), c[1].clone(), Dim::known(n), c[2].clone(), c[3].clone()]
            && y == [c[0].clone(), Dim::known(heads * n), c[2].clone(), c[3].clone()];
        ok.then_some((cache, n))
    });
    expanded.or_else(|| (dims(egraph, class)?.len() == 4).then_some((class, 1)))
}

/// `class` is `Concat{axis=2}(past, new)` of BNSH tensors: (past, new).
fn cache_append(egraph: &EGraph, class: Id) -> Option<(Id, Id)> {
    egraph[class].nodes.iter().find_map(|n| match &n.head {
        Head::Op { domain: Domain::Onnx, op: "Concat", attrs }
            if n.children.len() == 2 && matches!(attrs.attrs.int("axis"), Ok(Some(2 | -2))) =>
        {
            Some((n.children[0], n.children[1]))
        }
        _ => None,
    })
}

/// transformers' eager causal mask (Llama, SmolLM2): the causal part broadcast over the batch,
/// combined with the padding mask by Where.
const EAGER_PADDED: &str = "(Where (Equal (Add ?causal (Unsqueeze (Cast{to=1} ?am) ?pad_axes)) ?zero) ?masked ?causal)";
/// Its causal part: min where key position > query position, 0 elsewhere.
const EAGER_CAUSAL: &str =
    "(Expand (Unsqueeze (Mul (Trilu{upper=1} ?fill ?diagonal) (Cast{to=1} (Greater ?key_pos (Reshape ?query_pos ?column)))) ?causal_axes) ?shape)";
/// transformers' `masking_utils` mask (Qwen3): causal + padding, clamped at min.
const CLAMPED_PADDED: &str =
    "(Expand (Max (Add (Unsqueeze ?causal2d ?causal_axes) (Unsqueeze (Mul (Sub ?one (Cast{to=1} ?am)) ?masked_pad) ?pad_axes)) ?floor) ?shape)";
/// Its causal part: 0 where key position ≤ query position, min elsewhere.
const CLAMPED_CAUSAL: &str =
    "(Where (LessOrEqual (Unsqueeze ?key_pos ?key_axes) (Unsqueeze ?query_pos ?query_axes)) ?zero ?masked)";

/// A mask spelling: its name in reports and its parsed pattern.
struct MaskSpelling {
    name: &'static str,
    pattern: Pattern<ENode>,
}

impl MaskSpelling {
    fn new(name: &'static str, pattern: &str) -> MaskSpelling {
        let pattern = pattern.parse().unwrap_or_else(|e| panic!("mask pattern `{pattern}`: {e}"));
        MaskSpelling { name, pattern }
    }
}

/// The parsed mask spellings.
struct MaskPatterns {
    eager_padded: MaskSpelling,
    eager_causal: MaskSpelling,
    clamped_padded: MaskSpelling,
    clamped_causal: MaskSpelling,
}

/// The matcher's cap: partial matches it collects for one operand of a pattern node before it
/// stops looking (a mask class holds a handful of candidates; a class with more is no mask any
/// exporter writes, and the search would grow with their product).
const MAX_MATCHES: usize = 64;

/// A mask search [`MAX_MATCHES`] cut short: the spelling and the class it was matched at.
#[derive(Debug)]
struct CapHit {
    spelling: &'static str,
    class: Id,
}

impl CapHit {
    fn reason(&self) -> String {
        format!(
            "matching the {} at this class stopped at the matcher's cap (MAX_MATCHES = {MAX_MATCHES} partial matches \
             per operand): candidates past it were not examined",
            self.spelling
        )
    }
}

/// Records each search the cap cut short as a decline of `rule` at the class it was matched at.
fn record_caps(egraph: &mut EGraph, rule: Symbol, caps: &[CapHit]) {
    for hit in caps {
        let class = egraph.find(hit.class);
        egraph.analysis.decline(rule.as_str(), class, hit.reason());
    }
}

/// The substitutions of `spelling` rooted at `class`; a search the cap cut short is added to
/// `caps`.
fn search(egraph: &EGraph, spelling: &MaskSpelling, class: Id, caps: &mut Vec<CapHit>) -> Vec<Subst> {
    let mut matcher = Matcher { egraph, ast: spelling.pattern.ast.as_ref(), capped: false };
    let mut out = Vec::new();
    matcher.match_node(matcher.ast.len() - 1, class, Subst::default(), &mut out);
    if matcher.capped {
        caps.push(CapHit { spelling: spelling.name, class });
    }
    out
}

/// A direct backtracking match of one pattern rather than egg's search machine: appliers run
/// between rebuilds, on an e-graph egg will not search.
struct Matcher<'a> {
    egraph: &'a EGraph,
    ast: &'a [ENodeOrVar<ENode>],
    /// Whether [`MAX_MATCHES`] stopped the search somewhere.
    capped: bool,
}

impl Matcher<'_> {
    /// Matches pattern node `at` against `class` under `subst`, pushing every completion.
    fn match_node(&mut self, at: usize, class: Id, subst: Subst, out: &mut Vec<Subst>) {
        if out.len() >= MAX_MATCHES {
            self.capped = true;
            return;
        }
        let egraph = self.egraph;
        match &self.ast[at] {
            ENodeOrVar::Var(v) => match subst.get(*v) {
                Some(&prior) if egraph.find(prior) != egraph.find(class) => {}
                Some(_) => out.push(subst),
                None => {
                    let mut s = subst;
                    s.insert(*v, egraph.find(class));
                    out.push(s);
                }
            },
            ENodeOrVar::ENode(p) => {
                for n in egraph[class].nodes.iter().filter(|n| p.matches(n)) {
                    let mut partial = vec![subst.clone()];
                    for (pc, &nc) in p.children.iter().zip(&n.children) {
                        let mut next = Vec::new();
                        for s in partial {
                            self.match_node(usize::from(*pc), nc, s, &mut next);
                        }
                        partial = next;
                    }
                    out.extend(partial);
                }
            }
        }
    }
}

impl MaskPatterns {
    fn new() -> MaskPatterns {
        MaskPatterns {
            eager_padded: MaskSpelling::new("eager padding mask", EAGER_PADDED),
            eager_causal: MaskSpelling::new("eager causal part", EAGER_CAUSAL),
            clamped_padded: MaskSpelling::new("masking_utils padding mask", CLAMPED_PADDED),
            clamped_causal: MaskSpelling::new("masking_utils causal part", CLAMPED_CAUSAL),
        }
    }

    /// The attention_mask input `mask` is made from, when `mask` is "causal AND attention_mask"
    /// for queries of length `seq` over `total` keys (past = total − seq); why not otherwise.
    /// Searches the matcher's cap cut short are added to `caps`.
    fn attention_mask(
        &self,
        egraph: &EGraph,
        mask: Id,
        (batch, seq, total): (&Dim, &Dim, &Dim),
        caps: &mut Vec<CapHit>,
    ) -> Result<Id, Decline> {
        let mut why = Vec::new();
        for s in search(egraph, &self.eager_padded, mask, caps) {
            let ok = is_int(egraph, s[var("?pad_axes")], &[1, 2])
                && scalar_value(egraph, s[var("?zero")]) == Some(0.0)
                && is_masking_value(egraph, s[var("?masked")]);
            if !ok {
                why.push("the padding mask is not Where(causal + mask == 0, min, causal)");
                continue;
            }
            match self.eager_causal_ok(egraph, s[var("?causal")], seq, total, caps) {
                Ok(()) => return padding_source(egraph, s[var("?am")], batch, total),
                Err(reason) => why.push(reason),
            }
        }
        for s in search(egraph, &self.clamped_padded, mask, caps) {
            let ok = is_int(egraph, s[var("?pad_axes")], &[1, 2])
                && is_int(egraph, s[var("?causal_axes")], &[0, 1])
                && scalar_value(egraph, s[var("?one")]) == Some(1.0)
                && is_masking_value(egraph, s[var("?masked_pad")])
                && is_masking_value(egraph, s[var("?floor")])
                && broadcasts_batch(egraph, s[var("?causal2d")], seq, total);
            if !ok {
                why.push("the padding mask is not max(causal + (1 − mask)·min, min)");
                continue;
            }
            match self.clamped_causal_ok(egraph, s[var("?causal2d")], seq, total, caps) {
                Ok(()) => return padding_source(egraph, s[var("?am")], batch, total),
                Err(reason) => why.push(reason),
            }
        }
        Err(match why.first() {
            Some(reason) => reason.to_string().into(),
            None => "the mask is not a spelling of causal AND attention_mask this family knows".into(),
        })
    }

    /// `causal` is the eager spelling's causal part over `[seq, total]`.
    fn eager_causal_ok(
        &self,
        egraph: &EGraph,
        causal: Id,
        seq: &Dim,
        total: &Dim,
        caps: &mut Vec<CapHit>,
    ) -> Result<(), &'static str> {
        for s in search(egraph, &self.eager_causal, causal, caps) {
            let filled = node_of(egraph, s[var("?fill")], Domain::Onnx, "ConstantOfShape").is_some_and(|n| {
                let value = n.head.attrs().and_then(|a| a.tensor("value").ok().flatten());
                value.is_some_and(|t| t.numel() == 1 && t.to_f64_vec()[0] <= -1e30)
            }) && dims(egraph, s[var("?fill")]).as_deref() == Some(&[seq.clone(), total.clone()][..]);
            let shape_ok = is_int(egraph, s[var("?causal_axes")], &[0, 1])
                && is_int(egraph, s[var("?column")], &[-1, 1])
                && is_int(egraph, s[var("?diagonal")], &[1])
                && broadcasts_batch(egraph, causal, seq, total);
            if !filled || !shape_ok {
                continue;
            }
            // Key positions 0..T and query positions P..T with the same T: query i sits at
            // P + i, P = T − S, and Greater masks key t > P + i (the Trilu factor, t > i, adds
            // nothing for P ≥ 0).
            let (key_pos, query_pos) = (s[var("?key_pos")], s[var("?query_pos")]);
            let Some((zero, end, step)) = range_of(egraph, key_pos) else { continue };
            let Some((_, end2, step2)) = range_of(egraph, query_pos) else { continue };
            if is_int(egraph, zero, &[0])
                && is_int(egraph, step, &[1])
                && is_int(egraph, step2, &[1])
                && egraph.find(end) == egraph.find(end2)
                && dims(egraph, key_pos).as_deref() == Some(&[total.clone()][..])
                && dims(egraph, query_pos).as_deref() == Some(&[seq.clone()][..])
            {
                return Ok(());
            }
        }
        Err("the causal part is not Trilu(min)·(Range(0, T) > Range(T − S, T)) over [S, T]")
    }

    /// `causal2d` is the `masking_utils` causal part over `[seq, total]`.
    fn clamped_causal_ok(
        &self,
        egraph: &EGraph,
        causal2d: Id,
        seq: &Dim,
        total: &Dim,
        caps: &mut Vec<CapHit>,
    ) -> Result<(), &'static str> {
        for s in search(egraph, &self.clamped_causal, causal2d, caps) {
            let ok = is_int(egraph, s[var("?key_axes")], &[0])
                && (is_int(egraph, s[var("?query_axes")], &[1]) || is_int(egraph, s[var("?query_axes")], &[-1]))
                && scalar_value(egraph, s[var("?zero")]) == Some(0.0)
                && is_masking_value(egraph, s[var("?masked")]);
            if !ok {
                continue;
            }
            // Key positions Range(0, T); query positions Range(0, S) + P with T = S + P.
            let (key_pos, query_pos) = (s[var("?key_pos")], s[var("?query_pos")]);
            let Some((zero, end, step)) = range_of(egraph, key_pos) else { continue };
            let keys_ok = is_int(egraph, zero, &[0])
                && is_int(egraph, step, &[1])
                && dims(egraph, key_pos).as_deref() == Some(&[total.clone()][..]);
            let queries_ok = egraph[query_pos].nodes.iter().any(|n| {
                if !matches!(&n.head, Head::Op { domain: Domain::Onnx, op: "Add", .. }) {
                    return false;
                }
                [(n.children[0], n.children[1]), (n.children[1], n.children[0])].into_iter().any(|(range, past)| {
                    range_of(egraph, range).is_some_and(|(z, len, st)| {
                        is_int(egraph, z, &[0])
                            && is_int(egraph, st, &[1])
                            && dims(egraph, range).as_deref() == Some(&[seq.clone()][..])
                            && is_sum_of(egraph, end, len, past)
                    })
                })
            });
            if keys_ok && queries_ok && dims(egraph, query_pos).as_deref() == Some(&[seq.clone()][..]) {
                return Ok(());
            }
        }
        Err("the causal part is not Where(Range(0, T) ≤ Range(0, S) + P, 0, min) with T = S + P")
    }
}

/// `Range(start, end, step)` in `class`.
fn range_of(egraph: &EGraph, class: Id) -> Option<(Id, Id, Id)> {
    let n = node_of(egraph, class, Domain::Onnx, "Range")?;
    Some((n.children[0], n.children[1], n.children[2]))
}

/// `class` holds `Add(a, b)` or `Add(b, a)`.
fn is_sum_of(egraph: &EGraph, class: Id, a: Id, b: Id) -> bool {
    let (a, b) = (egraph.find(a), egraph.find(b));
    egraph[class].nodes.iter().any(|n| {
        matches!(&n.head, Head::Op { domain: Domain::Onnx, op: "Add", .. }) && {
            let (x, y) = (egraph.find(n.children[0]), egraph.find(n.children[1]));
            (x, y) == (a, b) || (x, y) == (b, a)
        }
    })
}

/// `class` is a `[seq, total]` tensor (the causal part before it is broadcast over the batch).
fn broadcasts_batch(egraph: &EGraph, class: Id, seq: &Dim, total: &Dim) -> bool {
    match dims(egraph, class) {
        Some(d) if d.len() == 2 => d == [seq.clone(), total.clone()],
        Some(d) if d.len() == 4 => d[2] == *seq && d[3] == *total && d[1].as_known() == Some(1),
        _ => false,
    }
}

/// True when a mask of width `width` covers `total` keys: the same dim, or a size of its own
/// (`total_sequence_length`, which exporters declare as past + sequence without saying so in the
/// graph). The fused op checks the width at run time.
fn same_length(width: &Dim, total: &Dim) -> bool {
    width == total || width.as_symbol().is_some_and(|w| !total.symbols().any(|s| s == w))
}

/// The padding mask's source: an integer `[batch, total]` tensor (the attention_mask input).
fn padding_source(egraph: &EGraph, am: Id, batch: &Dim, total: &Dim) -> Result<Id, Decline> {
    match type_of(egraph, am) {
        Some(t)
            if t.dtype.is_int() && t.shape.len() == 2 && t.shape[0] == *batch && same_length(&t.shape[1], total) =>
        {
            Ok(am)
        }
        Some(t) => Err(format!(
            "the padding mask comes from {}{}, not an integer [batch, past + sequence] attention_mask",
            t.dtype,
            ir::dim::shape_to_string(&t.shape)
        )
        .into()),
        None => Err(no_match()),
    }
}

/// Reads the int attribute `name` (default `default`) of the matched op.
fn attr_int(attrs: &Attrs, name: &str, default: i64) -> Result<i64, Decline> {
    attrs.int_or(name, default).map_err(|e| e.to_string().into())
}

/// Reads the float attribute `name` of the matched op.
fn attr_float(attrs: &Attrs, name: &str) -> Result<Option<f32>, Decline> {
    attrs.float(name).map_err(|e| e.to_string().into())
}

/// `x` [B, S, H·D] as BNSH [B, H, S, D].
fn to_bnsh(egraph: &mut EGraph, x: Id, heads: i64, head: i64) -> Result<Id, Decline> {
    let view = heads_view(egraph, x, heads, head).ok_or_else(no_match)?;
    transpose(egraph, view, &[0, 2, 1, 3]).ok_or_else(no_match)
}

/// BNSH `y` [B, H, S, D] back to [B, S, H·D].
fn from_bnsh(egraph: &mut EGraph, y: Id, width: i64) -> Result<Id, Decline> {
    let t = transpose(egraph, y, &[0, 2, 1, 3]).ok_or_else(no_match)?;
    reshape(egraph, t, &[0, 0, width]).ok_or_else(no_match)
}

/// The attention_mask `seqlens_k` was computed from, `Cast(Sub(ReduceSum(attention_mask, [1]),
/// 1))` as onnxruntime-genai writes it, when it is an integer `[batch, total]` tensor.
fn seqlens_source(egraph: &EGraph, seqlens: Id, batch: &Dim, total: &Dim) -> Option<Id> {
    let sub = node_of(egraph, seqlens, Domain::Onnx, "Cast").map(|c| c.children[0]).unwrap_or(seqlens);
    let sub = node_of(egraph, sub, Domain::Onnx, "Sub")?;
    if scalar_value(egraph, sub.children[1]) != Some(1.0) {
        return None;
    }
    let sum = node_of(egraph, sub.children[0], Domain::Onnx, "ReduceSum")?;
    if sum.children.len() != 2 || int_attr(sum, "keepdims") != Some(0) || !is_int(egraph, sum.children[1], &[1]) {
        return None;
    }
    padding_source(egraph, sum.children[0], batch, total).ok()
}

/// Lowers com.microsoft GroupQueryAttention to Rope + Attention in BNSH.
struct FoldGqa;

/// A matched GroupQueryAttention with no input or attribute the lowering cannot carry.
struct Gqa {
    q: Id,
    k: Id,
    v: Id,
    past_k: Id,
    past_v: Id,
    seqlens: Id,
    /// The cos and sin caches, when given.
    rotary: Option<(Id, Id)>,
    do_rotary: bool,
    attrs: Attrs,
    q_heads: i64,
    kv_heads: i64,
    /// head_sink: a logit per query head joining the softmax (Attention's sinks).
    sinks: Option<Id>,
    /// local_window_size when positive: a query sees that many positions, its own included.
    window: Option<usize>,
}

/// The layout of a [`Gqa`]'s operands.
struct GqaLayout {
    qt: TypeInfo,
    /// Q, K and V packed into `q`, key and value absent.
    packed: bool,
    /// Heads in the query's width: `q_heads`, or `q_heads + 2·kv_heads` when packed.
    parts: i64,
    head: i64,
    has_past: bool,
    total: Dim,
}

impl GqaLayout {
    fn batch(&self) -> &Dim {
        &self.qt.shape[0]
    }

    fn seq(&self) -> &Dim {
        &self.qt.shape[1]
    }
}

impl Fold for FoldGqa {
    fn fold(&self, egraph: &mut EGraph, eclass: Id, subst: &Subst, rule: Symbol) -> Folded {
        let op = gqa_operands(egraph, eclass, subst)?;
        let layout = gqa_layout(egraph, eclass, &op)?;
        let (mut qb, mut kb, vb) = gqa_bnsh(egraph, &op, &layout)?;
        if op.do_rotary {
            (qb, kb) = gqa_rotary(egraph, &op, &layout, qb, kb)?;
        }
        let mask = seqlens_source(egraph, op.seqlens, layout.batch(), &layout.total);
        let scale = match attr_float(&op.attrs, "scale")? {
            Some(s) if s != 0.0 => s,
            _ => 1.0 / (layout.head as f32).sqrt(),
        };
        let inputs = AttentionInputs {
            q: qb,
            k: kb,
            v: vb,
            past_k: layout.has_past.then_some(op.past_k),
            past_v: layout.has_past.then_some(op.past_v),
            mask,
            q_heads: op.q_heads,
            kv_heads: op.kv_heads,
            scale,
            window: op.window,
            sinks: op.sinks,
        };
        let [y, yk, yv] = add_attention(egraph, &inputs);
        let out = from_bnsh(egraph, y, op.q_heads * layout.head)?;
        Ok(union_all(egraph, rule, &outputs_of(egraph, eclass, [out, yk, yv])))
    }
}

/// The matched GroupQueryAttention, or why it has no Attention form.
fn gqa_operands(egraph: &EGraph, eclass: Id, subst: &Subst) -> Result<Gqa, Decline> {
    let names =
        ["?q", "?k", "?v", "?pk", "?pv", "?seqlens", "?total", "?cos", "?sin", "?position_ids", "?bias", "?head_sink"];
    let children: Vec<Id> = names.iter().filter_map(|n| subst.get(var(n)).copied()).collect();
    let attrs = node_attrs(egraph, eclass, Domain::Microsoft, "GroupQueryAttention", &children).ok_or_else(no_match)?;
    // position_ids only steer the rotation; a bias changes the softmax (a head sink joins it as
    // Attention's sinks).
    let do_rotary = attr_int(&attrs, "do_rotary", 0)? != 0;
    for (i, what, matters) in [(9, "position_ids", do_rotary), (10, "attention_bias", true)] {
        if matters && children.get(i).is_some_and(|&c| !is_absent(egraph, c)) {
            return Err(format!("a {what} input has no Attention form").into());
        }
    }
    let q_heads = attr_int(&attrs, "num_heads", 0)?;
    let kv_heads = attr_int(&attrs, "kv_num_heads", 0)?;
    if q_heads <= 0 || kv_heads <= 0 || q_heads % kv_heads != 0 {
        return Err(format!("{q_heads} heads do not group over {kv_heads} kv heads").into());
    }
    let window = attr_int(&attrs, "local_window_size", -1)?;
    if attr_float(&attrs, "softcap")?.is_some_and(|c| c != 0.0) {
        return Err("softcap has no Attention form".into());
    }
    if attr_int(&attrs, "smooth_softmax", -1)? == 1 {
        return Err("smooth softmax has no Attention form".into());
    }
    for name in ["k_quant_type", "v_quant_type"] {
        if attrs.str(name).ok().flatten().is_some_and(|s| s != "NONE") {
            return Err("quantised KV caches have no Attention form".into());
        }
    }
    let [q, k, v, past_k, past_v, seqlens] = [0, 1, 2, 3, 4, 5].map(|i| children[i]);
    let rotary = (children.len() >= 9).then(|| (children[7], children[8]));
    let sinks = children.get(11).copied().filter(|&c| !is_absent(egraph, c));
    let window = (window > 0).then_some(window as usize);
    Ok(Gqa { q, k, v, past_k, past_v, seqlens, rotary, do_rotary, attrs, q_heads, kv_heads, sinks, window })
}

/// The layout of `op`'s operands, when the fused op can take them: its presents must be past + S
/// long, since it appends (a shared buffer is written in place).
fn gqa_layout(egraph: &EGraph, eclass: Id, op: &Gqa) -> Result<GqaLayout, Decline> {
    let qt = type_of(egraph, op.q).ok_or_else(no_match)?;
    let [batch, seq, width] = &qt.shape[..] else { return Err("query is not [batch, sequence, hidden]".into()) };
    let width = width.as_known().ok_or("the query width is not known")?;
    let packed = is_absent(egraph, op.k) && is_absent(egraph, op.v);
    let parts = if packed { op.q_heads + 2 * op.kv_heads } else { op.q_heads };
    if width % parts != 0 {
        return Err(format!("query width {width} does not split into {parts} heads").into());
    }
    let head = width / parts;
    let new_kv = [batch.clone(), seq.clone(), Dim::known(op.kv_heads * head)];
    if !packed
        && (dims(egraph, op.k).as_deref() != Some(&new_kv[..]) || dims(egraph, op.v).as_deref() != Some(&new_kv[..]))
    {
        return Err("key/value are not [batch, sequence, kv_heads·head_size]".into());
    }
    let has_past = !is_absent(egraph, op.past_k) && !is_absent(egraph, op.past_v);
    let past_len =
        if has_past { past_length(egraph, (op.past_k, op.past_v), batch, op.kv_heads, head)? } else { Dim::known(0) };
    let total = past_len.add(seq).ok_or_else(no_match)?;
    let presents: Vec<Option<Id>> =
        (1..3).map(|i| egraph.lookup(ENode { head: Head::Proj(i), children: vec![eclass] })).collect();
    for p in presents.iter().flatten() {
        let d = dims(egraph, *p).ok_or_else(no_match)?;
        if d.len() != 4 || d[2] != total {
            return Err(format!(
                "the present cache holds {} rows, not past + sequence = {}: a shared-buffer cache is written in place",
                d.get(2).map(|x| x.to_string()).unwrap_or_default(),
                total
            )
            .into());
        }
    }
    Ok(GqaLayout { qt, packed, parts, head, has_past, total })
}

/// The length of the BNSH past caches `(past_k, past_v)`, when both are `[batch, kv_heads, past,
/// head]`.
fn past_length(
    egraph: &EGraph,
    (past_k, past_v): (Id, Id),
    batch: &Dim,
    kv_heads: i64,
    head: i64,
) -> Result<Dim, Decline> {
    let (a, b) = (dims(egraph, past_k).ok_or_else(no_match)?, dims(egraph, past_v).ok_or_else(no_match)?);
    if a.len() != 4 || a != b || a[0] != *batch || a[1].as_known() != Some(kv_heads) || a[3].as_known() != Some(head) {
        return Err("the past caches are not [batch, kv_heads, past, head_size]".into());
    }
    Ok(a[2].clone())
}

/// Q, K and V of `op` in BNSH: one Slice of the packed query per part, or each reshaped.
fn gqa_bnsh(egraph: &mut EGraph, op: &Gqa, layout: &GqaLayout) -> Result<(Id, Id, Id), Decline> {
    let (q_heads, kv_heads, head) = (op.q_heads, op.kv_heads, layout.head);
    if !layout.packed {
        return Ok((
            to_bnsh(egraph, op.q, q_heads, head)?,
            to_bnsh(egraph, op.k, kv_heads, head)?,
            to_bnsh(egraph, op.v, kv_heads, head)?,
        ));
    }
    let all = to_bnsh(egraph, op.q, layout.parts, head)?;
    let part = |egraph: &mut EGraph, from: i64, n: i64| -> Result<Id, Decline> {
        let mut shape = dims(egraph, all).ok_or_else(no_match)?;
        shape[1] = Dim::known(n);
        let (starts, ends, axes) = (i64s(egraph, &[from]), i64s(egraph, &[from + n]), i64s(egraph, &[1]));
        Ok(add_typed(
            egraph,
            onnx("Slice", Attrs::default(), vec![all, starts, ends, axes]),
            TypeInfo { dtype: layout.qt.dtype, shape },
        ))
    };
    Ok((part(egraph, 0, q_heads)?, part(egraph, q_heads, kv_heads)?, part(egraph, q_heads + kv_heads, kv_heads)?))
}

/// `qb` and `kb` rotated by `op`'s rotary caches at positions P .. P + S, the ones Attention
/// assumes for its queries.
fn gqa_rotary(egraph: &mut EGraph, op: &Gqa, layout: &GqaLayout, qb: Id, kb: Id) -> Result<(Id, Id), Decline> {
    let head = layout.head;
    let (cos, sin) = op.rotary.ok_or("do_rotary without cos/sin caches")?;
    let cache = dims(egraph, cos).ok_or_else(no_match)?;
    if cache.len() != 2 || cache[1].as_known().map(|h| 2 * h) != Some(head) || dims(egraph, sin) != Some(cache.clone())
    {
        let shape = ir::dim::shape_to_string(&cache);
        return Err(format!("rotary caches {shape} do not rotate the full head size {head}").into());
    }
    let interleaved = attr_int(&op.attrs, "rotary_interleaved", 0)? != 0;
    let start = if layout.has_past { dim_value(egraph, op.past_k, 2) } else { i64_scalar(egraph, 0) };
    let len = dim_value(egraph, op.q, 1);
    let end = egraph.add(onnx("Add", Attrs::default(), vec![start, len]));
    let one = i64_scalar(egraph, 1);
    let positions = add_typed(
        egraph,
        onnx("Range", Attrs::default(), vec![start, end, one]),
        TypeInfo { dtype: DType::I64, shape: vec![layout.seq().clone()] },
    );
    let tables = [cos, sin].map(|c| cache_rows(egraph, c, positions).and_then(|r| full_width(egraph, r, interleaved)));
    let [Some(tc), Some(ts)] = tables else { return Err(no_match()) };
    Ok((rope(egraph, qb, tc, ts, interleaved), rope(egraph, kb, tc, ts, interleaved)))
}

/// Lowers ai.onnx Attention (opset 23) with a causal flag to `Attention` in BNSH.
struct FoldOnnx;

/// A matched ai.onnx Attention with nothing the lowering cannot carry.
struct OnnxAttention {
    q: Id,
    k: Id,
    v: Id,
    mask: Id,
    past: Option<(Id, Id)>,
    /// The presents of a cache appended outside the op.
    presents: Option<(Id, Id)>,
    attrs: Attrs,
    causal: bool,
}

/// Q, K and V in BNSH, with the head counts and whether they came 3-D.
struct Bnsh {
    q: Id,
    k: Id,
    v: Id,
    q_heads: i64,
    kv_heads: i64,
    head: i64,
    three_d: bool,
}

impl Fold for FoldOnnx {
    fn fold(&self, egraph: &mut EGraph, eclass: Id, subst: &Subst, rule: Symbol) -> Folded {
        let op = onnx_operands(egraph, eclass, subst)?;
        let qt = type_of(egraph, op.q).ok_or_else(no_match)?;
        let qkv = onnx_bnsh(egraph, &op, &qt)?;
        let (q_heads, kv_heads, head) = (qkv.q_heads, qkv.kv_heads, qkv.head);
        if kv_heads <= 0 || q_heads % kv_heads != 0 {
            return Err(format!("{q_heads} heads do not group over {kv_heads} kv heads").into());
        }
        let (batch, seq) = (qt.shape[0].clone(), if qkv.three_d { qt.shape[1].clone() } else { qt.shape[2].clone() });
        let past_len = match op.past {
            Some(past) => past_length(egraph, past, &batch, kv_heads, head)?,
            None => Dim::known(0),
        };
        let total = past_len.add(&seq).ok_or_else(no_match)?;
        let (mask, window) = onnx_mask(egraph, &op, &batch, &seq, &past_len, &total)?;
        let scale = match attr_float(&op.attrs, "scale")? {
            Some(s) => s,
            None => 1.0 / (head as f32).sqrt(),
        };
        let inputs = AttentionInputs {
            q: qkv.q,
            k: qkv.k,
            v: qkv.v,
            past_k: op.past.map(|p| p.0),
            past_v: op.past.map(|p| p.1),
            mask,
            q_heads,
            kv_heads,
            scale,
            window,
            sinks: None,
        };
        let [y, yk, yv] = add_attention(egraph, &inputs);
        let out = if qkv.three_d { from_bnsh(egraph, y, q_heads * head)? } else { y };
        let mut pairs = outputs_of(egraph, eclass, [out, yk, yv]);
        pairs.extend(op.presents.map(|(pk, pv)| [(pk, yk), (pv, yv)]).into_iter().flatten());
        Ok(union_all(egraph, rule, &pairs))
    }
}

/// The matched ai.onnx Attention, its cache found outside the op when it takes none, or why it
/// has no Attention form.
fn onnx_operands(egraph: &EGraph, eclass: Id, subst: &Subst) -> Result<OnnxAttention, Decline> {
    let names = ["?q", "?k", "?v", "?mask", "?pk", "?pv"];
    let children: Vec<Id> = names.iter().filter_map(|n| subst.get(var(n)).copied()).collect();
    let attrs = node_attrs(egraph, eclass, Domain::Onnx, "Attention", &children).ok_or_else(no_match)?;
    let (q, mut k, mut v, mask) = (children[0], children[1], children[2], children[3]);
    let mut past = (children.len() == 6 && !is_absent(egraph, children[4]) && !is_absent(egraph, children[5]))
        .then(|| (children[4], children[5]));
    // The cache concatenated outside the op and repeated over the query heads (torch's
    // opset-23 export): K = repeat_kv(Concat(past, new)).
    let mut presents = None;
    if past.is_none() {
        if let Some(((pk, kn, present_k), (pv, vn, present_v))) = outside_cache(egraph, k, v) {
            presents = Some((present_k, present_v));
            (past, k, v) = (Some((pk, pv)), kn, vn);
        }
    }
    let causal = attr_int(&attrs, "is_causal", 0)? == 1;
    if !causal && is_absent(egraph, mask) {
        return Err("not causal (is_causal=0) and no mask to prove causal".into());
    }
    if attr_float(&attrs, "softcap")?.is_some_and(|c| c != 0.0) {
        return Err("softcap has no Attention form".into());
    }
    if egraph.lookup(ENode { head: Head::Proj(3), children: vec![eclass] }).is_some() {
        return Err("the scores output is used".into());
    }
    Ok(OnnxAttention { q, k, v, mask, past, presents, attrs, causal })
}

/// `op`'s Q, K and V (of query type `qt`) in BNSH: 3-D `[B, S, H·D]` ones viewed as heads by
/// `q_num_heads`/`kv_num_heads`, 4-D ones as they are.
fn onnx_bnsh(egraph: &mut EGraph, op: &OnnxAttention, qt: &TypeInfo) -> Result<Bnsh, Decline> {
    let (kd, vd) = (dims(egraph, op.k).ok_or_else(no_match)?, dims(egraph, op.v).ok_or_else(no_match)?);
    match qt.shape.len() {
        3 => {
            let q_heads = attr_int(&op.attrs, "q_num_heads", 0)?;
            let kv_heads = attr_int(&op.attrs, "kv_num_heads", 0)?;
            let width = qt.shape[2].as_known().ok_or("the query width is not known")?;
            if q_heads <= 0 || kv_heads <= 0 || width % q_heads != 0 {
                return Err(format!("query width {width} does not split into {q_heads} heads").into());
            }
            let head = width / q_heads;
            let kv = [qt.shape[0].clone(), qt.shape[1].clone(), Dim::known(kv_heads * head)];
            if kd != kv || vd != kv {
                return Err("key/value are not [batch, sequence, kv_heads·head_size] with the query's head size".into());
            }
            let q = to_bnsh(egraph, op.q, q_heads, head)?;
            let k = to_bnsh(egraph, op.k, kv_heads, head)?;
            let v = to_bnsh(egraph, op.v, kv_heads, head)?;
            Ok(Bnsh { q, k, v, q_heads, kv_heads, head, three_d: true })
        }
        4 => {
            let (q_heads, kv_heads, head) = (qt.shape[1].as_known(), kd[1].as_known(), qt.shape[3].as_known());
            let (Some(q_heads), Some(kv_heads), Some(head)) = (q_heads, kv_heads, head) else {
                return Err("head counts are not known".into());
            };
            let kv = [qt.shape[0].clone(), kd[1].clone(), qt.shape[2].clone(), qt.shape[3].clone()];
            if kd != kv || vd != kv {
                return Err("key/value are not [batch, kv_heads, sequence, head_size] like the query".into());
            }
            Ok(Bnsh { q: op.q, k: op.k, v: op.v, q_heads, kv_heads, head, three_d: false })
        }
        _ => Err("Q/K/V are neither 3-D nor 4-D".into()),
    }
}

/// The attention_mask `op`'s mask is made from and the sliding window it proves (none for an
/// absent mask): a boolean padding mask when the op is causal, a mask the probe proves causal
/// otherwise.
fn onnx_mask(
    egraph: &EGraph,
    op: &OnnxAttention,
    batch: &Dim,
    seq: &Dim,
    past_len: &Dim,
    total: &Dim,
) -> Result<(Option<Id>, Option<usize>), Decline> {
    if is_absent(egraph, op.mask) {
        return Ok((None, None));
    }
    if op.causal {
        return Ok((Some(bool_padding_source(egraph, op.mask, batch, seq, total)?), None));
    }
    let proven = crate::causal_mask::padding_source(egraph, op.mask, batch, seq, past_len)
        .map_err(|why| format!("not causal (is_causal=0), and the mask is not proven causal: {why}"))?;
    Ok((Some(proven.padding), proven.window))
}

/// Keys and values that are the KV cache appended outside the op, `repeat_kv(Concat(past, new))`
/// with the same repetition for both and the past a graph input: (past, new, present) of each.
#[allow(clippy::type_complexity)]
fn outside_cache(egraph: &EGraph, k: Id, v: Id) -> Option<((Id, Id, Id), (Id, Id, Id))> {
    let (present_k, k_rep) = repeated_kv(egraph, k)?;
    let (present_v, v_rep) = repeated_kv(egraph, v)?;
    let (pk, kn) = cache_append(egraph, present_k)?;
    let (pv, vn) = cache_append(egraph, present_v)?;
    let input = |c: Id| egraph[c].nodes.iter().any(|n| matches!(n.head, Head::Input(_)));
    (k_rep == v_rep && input(pk) && input(pv)).then_some(((pk, kn, present_k), (pv, vn, present_v)))
}

/// The attention_mask a boolean padding mask is made from: `Cast{to=bool}(Unsqueeze(m, [1,2]))`,
/// possibly `Expand`ed over the query rows, with `m` an integer `[batch, total]` tensor.
fn bool_padding_source(egraph: &EGraph, mask: Id, batch: &Dim, seq: &Dim, total: &Dim) -> Result<Id, Decline> {
    let md = dims(egraph, mask).ok_or_else(no_match)?;
    let broadcast_ok = md.len() == 4
        && (md[0] == *batch || md[0].as_known() == Some(1))
        && md[1].as_known() == Some(1)
        && (md[2] == *seq || md[2].as_known() == Some(1))
        && same_length(&md[3], total);
    if !broadcast_ok || type_of(egraph, mask).map(|t| t.dtype) != Some(DType::Bool) {
        return Err("the mask is not a boolean [batch, 1, sequence, past + sequence] padding mask".into());
    }
    // An Expand of a [B, 1, 1, T] mask only repeats it over the query rows.
    let cast_class = match node_of(egraph, mask, Domain::Onnx, "Expand") {
        Some(e) => {
            let src = e.children[0];
            let sd = dims(egraph, src).ok_or_else(no_match)?;
            if sd.len() != 4
                || sd[0] != md[0]
                || sd[1].as_known() != Some(1)
                || sd[2].as_known() != Some(1)
                || sd[3] != md[3]
            {
                return Err("the expanded mask is not one row per batch entry".into());
            }
            src
        }
        None => mask,
    };
    let cast = node_of(egraph, cast_class, Domain::Onnx, "Cast")
        .filter(|c| int_attr(c, "to") == Some(DType::Bool.onnx_code() as i64))
        .ok_or("the mask is not Cast(attention_mask) to bool")?;
    let unsq = node_of(egraph, cast.children[0], Domain::Onnx, "Unsqueeze")
        .ok_or("the mask is not Unsqueeze(attention_mask, [1, 2])")?;
    if unsq.children.len() != 2 || !is_int(egraph, unsq.children[1], &[1, 2]) {
        return Err("the mask is not Unsqueeze(attention_mask, [1, 2])".into());
    }
    padding_source(egraph, unsq.children[0], batch, total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egraph_ops::add_const;
    use ir::egraph::NpuAnalysis;
    use ir::Tensor;

    fn input(egraph: &mut EGraph, name: &str) -> Id {
        egraph.add(ENode::leaf(Head::Input(name.into())))
    }

    /// transformers' eager padding mask whose sum class holds `candidates` spellings of
    /// `causal + padding`, each with a causal part of its own: the class and its e-graph.
    fn eager_mask_with_candidates(candidates: usize) -> (EGraph, Id) {
        let mut egraph = EGraph::new(NpuAnalysis::default());
        let am = input(&mut egraph, "attention_mask");
        let cast = egraph.add(onnx("Cast", attrs(&[("to", Attr::Int(1))]), vec![am]));
        let axes = i64s(&mut egraph, &[1, 2]);
        let padding = egraph.add(onnx("Unsqueeze", Attrs::default(), vec![cast, axes]));
        let sums: Vec<Id> = (0..candidates)
            .map(|i| {
                let causal = input(&mut egraph, &format!("causal{i}"));
                egraph.add(onnx("Add", Attrs::default(), vec![causal, padding]))
            })
            .collect();
        for &sum in &sums[1..] {
            egraph.union(sums[0], sum);
        }
        egraph.rebuild();
        let zero = add_const(&mut egraph, Tensor::scalar_f32(0.0));
        let equal = egraph.add(onnx("Equal", Attrs::default(), vec![sums[0], zero]));
        let min = add_const(&mut egraph, Tensor::scalar_f32(f32::MIN));
        let causal = input(&mut egraph, "causal0");
        let mask = egraph.add(onnx("Where", Attrs::default(), vec![equal, min, causal]));
        egraph.rebuild();
        (egraph, mask)
    }

    /// Runs the mask search the eager-attention fold runs, recording its caps as the fold does.
    fn search_mask(egraph: &mut EGraph, mask: Id) -> Result<Id, Decline> {
        let one = Dim::known(1);
        let mut caps = vec![];
        let found = MaskPatterns::new().attention_mask(egraph, mask, (&one, &one, &one), &mut caps);
        record_caps(egraph, Symbol::from("attention-sdpa-div"), &caps);
        found
    }

    #[test]
    fn a_mask_search_cut_short_by_the_matcher_cap_is_reported() {
        let (mut egraph, mask) = eager_mask_with_candidates(MAX_MATCHES + 1);
        assert!(search_mask(&mut egraph, mask).is_err());
        let declined: Vec<_> = egraph.analysis.declined.iter().collect();
        assert_eq!(declined.len(), 1, "{declined:?}");
        assert_eq!(declined[0].rule, "attention-sdpa-div");
        assert_eq!(declined[0].class, egraph.find(mask));
        assert!(declined[0].reason.contains("eager padding mask"), "{}", declined[0].reason);
        assert!(declined[0].reason.contains("MAX_MATCHES = 64"), "{}", declined[0].reason);
    }

    #[test]
    fn a_mask_search_within_the_matcher_cap_reports_nothing() {
        let (mut egraph, mask) = eager_mask_with_candidates(MAX_MATCHES);
        assert!(search_mask(&mut egraph, mask).is_err());
        assert!(egraph.analysis.declined.is_empty(), "{:?}", egraph.analysis.declined);
    }
}

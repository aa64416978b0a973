"""Plain numpy reference of the decoder (float64), used to check every graph."""

from __future__ import annotations

import numpy as np

from .config import DecoderConfig
from .weights import layer_key, rope_tables


def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def forward(cfg: DecoderConfig, w: dict, input_ids, attention_mask, position_ids, past):
    """One decoder step.

    past: list of (key, value) arrays [B, kv_heads, P, head_dim].
    Returns (logits [B, S, vocab], presents list of (key, value)).
    """
    f = lambda name: np.asarray(w[name], dtype=np.float64)  # noqa: E731
    b, s = input_ids.shape
    d, h, kvh = cfg.head_dim, cfg.heads, cfg.kv_heads
    cos_t, sin_t = (t.astype(np.float64) for t in rope_tables(cfg))
    cos = cos_t[position_ids][:, None]  # [B,1,S,D]
    sin = sin_t[position_ids][:, None]

    p = past[0][0].shape[2]
    t = p + s
    # key j is visible to query i when j <= p + i and attention_mask[b, j] == 1
    causal = np.arange(t)[None, :] <= (p + np.arange(s))[:, None]
    visible = causal[None, None] & (attention_mask[:, None, None, :] != 0)

    emb = f("model.embed_tokens.weight")
    x = emb[input_ids]
    presents = []
    for i in range(cfg.layers):
        lk = lambda sfx: f(layer_key(i, sfx))  # noqa: E731
        hdn = _rms(x, lk("input_layernorm.weight"), cfg.rms_eps)
        q = (hdn @ lk("self_attn.q_proj.weight").T).reshape(b, s, h, d)
        k = (hdn @ lk("self_attn.k_proj.weight").T).reshape(b, s, kvh, d)
        v = (hdn @ lk("self_attn.v_proj.weight").T).reshape(b, s, kvh, d)
        if cfg.qk_norm:
            q = _rms(q, lk("self_attn.q_norm.weight"), cfg.rms_eps)
            k = _rms(k, lk("self_attn.k_norm.weight"), cfg.rms_eps)
        q, k, v = (a.transpose(0, 2, 1, 3) for a in (q, k, v))
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        k = np.concatenate([past[i][0].astype(np.float64), k], axis=2)
        v = np.concatenate([past[i][1].astype(np.float64), v], axis=2)
        presents.append((k, v))
        kr = np.repeat(k, cfg.n_rep, axis=1)
        vr = np.repeat(v, cfg.n_rep, axis=1)
        scores = q @ kr.transpose(0, 1, 3, 2) / np.sqrt(d)
        scores = np.where(visible, scores, -1e30)  # a fully masked row (padding) stays finite
        scores = scores - scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(axis=-1, keepdims=True)
        ctx = (probs @ vr).transpose(0, 2, 1, 3).reshape(b, s, h * d)
        x = x + ctx @ lk("self_attn.o_proj.weight").T
        hdn = _rms(x, lk("post_attention_layernorm.weight"), cfg.rms_eps)
        g = hdn @ lk("mlp.gate_proj.weight").T
        u = hdn @ lk("mlp.up_proj.weight").T
        x = x + ((g / (1.0 + np.exp(-g))) * u) @ lk("mlp.down_proj.weight").T
    x = _rms(x, f("model.norm.weight"), cfg.rms_eps)
    head = emb if cfg.tied_embeddings else f("lm_head.weight")
    logits = x @ head.T
    return logits, presents


def rel_err(a, ref) -> float:
    """max |a - ref| / max |ref|"""
    a = np.asarray(a, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if ref.size == 0:
        return 0.0
    return float(np.abs(a - ref).max() / max(np.abs(ref).max(), 1e-30))

"""Seeded random weights for the tiny decoders.

Names and layouts follow Hugging Face checkpoints: linear weights are
[out_features, in_features]; norms are 1-D. Scales keep the residual stream
and attention scores O(1) and the tied-embedding logits spread over a few units.
"""

from __future__ import annotations

import numpy as np

from .config import DecoderConfig


def layer_key(i: int, suffix: str) -> str:
    return f"model.layers.{i}.{suffix}"


def random_weights(cfg: DecoderConfig, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def linear(out_f, in_f, gain=1.0):
        return (rng.standard_normal((out_f, in_f)) * (gain / np.sqrt(in_f))).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w: dict[str, np.ndarray] = {}
    w["model.embed_tokens.weight"] = (0.2 * rng.standard_normal((cfg.vocab, cfg.hidden))).astype(np.float32)
    for i in range(cfg.layers):
        w[layer_key(i, "input_layernorm.weight")] = norm(cfg.hidden)
        w[layer_key(i, "self_attn.q_proj.weight")] = linear(cfg.q_size, cfg.hidden)
        w[layer_key(i, "self_attn.k_proj.weight")] = linear(cfg.kv_size, cfg.hidden)
        w[layer_key(i, "self_attn.v_proj.weight")] = linear(cfg.kv_size, cfg.hidden)
        w[layer_key(i, "self_attn.o_proj.weight")] = linear(cfg.hidden, cfg.q_size, gain=0.7)
        if cfg.qk_norm:
            w[layer_key(i, "self_attn.q_norm.weight")] = norm(cfg.head_dim)
            w[layer_key(i, "self_attn.k_norm.weight")] = norm(cfg.head_dim)
        w[layer_key(i, "post_attention_layernorm.weight")] = norm(cfg.hidden)
        w[layer_key(i, "mlp.gate_proj.weight")] = linear(cfg.intermediate, cfg.hidden)
        w[layer_key(i, "mlp.up_proj.weight")] = linear(cfg.intermediate, cfg.hidden)
        w[layer_key(i, "mlp.down_proj.weight")] = linear(cfg.hidden, cfg.intermediate, gain=0.7)
    w["model.norm.weight"] = norm(cfg.hidden)
    if not cfg.tied_embeddings:
        w["lm_head.weight"] = linear(cfg.vocab, cfg.hidden)
    return w


def rope_tables(cfg: DecoderConfig) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin tables [max_pos, head_dim] in the rotate-half layout (freqs repeated twice)."""
    d = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    freqs = np.outer(np.arange(cfg.max_pos, dtype=np.float64), inv_freq)
    emb = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)

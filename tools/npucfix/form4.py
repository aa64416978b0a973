"""Form 4: opset 23 graph with the standard fused ops.

RMSNormalization, RotaryEmbedding (3-D input + num_heads, cos/sin caches
[max_pos, head_dim/2] indexed by position_ids) and Attention (3-D Q/K/V with
q_num_heads/kv_num_heads, past_key/past_value in, present_key/present_value
out). Each fused op is used only if ONNX Runtime runs it and matches the numpy
reference; otherwise that piece falls back to the decomposed form-1 spelling.

Attention masking: ``causal_bool`` passes is_causal=1 plus a boolean padding
mask built from attention_mask, broadcast to [B, 1, S, T]; ``float_mask`` passes the additive
[B, 1, S, T] mask of form 1 with is_causal=0.
"""

from __future__ import annotations

import numpy as np

from .config import DecoderConfig
from .form1 import Form1Builder
from .graph import BOOL
from .weights import layer_key, rope_tables

FUSABLE = ("RMSNormalization", "RotaryEmbedding", "Attention")


class Form4Builder(Form1Builder):
    opset = 23
    ir_version = 11

    def __init__(self, cfg: DecoderConfig, weights, fused=FUSABLE, mask_mode: str = "causal_bool"):
        super().__init__(cfg, weights, style="llama")
        self.fused = set(fused)
        assert self.fused <= set(FUSABLE)
        self.mask_mode = mask_mode

    def prologue(self):
        g = self.g
        need_sizes = "Attention" not in self.fused or self.mask_mode == "float_mask"
        if need_sizes:
            ids_shape = g.op("Shape", ["input_ids"])
            self.batch = self.dim(ids_shape, 0)
            self.seq = self.dim(ids_shape, 1)
            self.past = self.dim(g.op("Shape", ["past_key_values.0.key"]), 2)
            self.total = g.op("Add", [self.seq, self.past])
            self.mask = self.build_mask()
        if "Attention" in self.fused and self.mask_mode == "causal_bool":
            # ORT wants the mask's query axis to match Q, so broadcast [B,1,1,T] to [B,1,S,T]
            seq = g.op("Gather", [g.op("Shape", ["input_ids"]), self.c([1])], axis=0)
            shape = g.op("Concat", [self.c([1, 1]), seq, self.c([1])], axis=0)
            am = g.op("Cast", [g.op("Unsqueeze", ["attention_mask", self.c([1, 2])])], to=BOOL)
            self.attn_mask = g.op("Expand", [am, shape])
        elif "Attention" in self.fused:
            self.attn_mask = self.mask
        if "RotaryEmbedding" in self.fused:
            cos, sin = rope_tables(self.cfg)
            half = self.cfg.head_dim // 2
            self.cos_cache = g.initializer("cos_cache", np.ascontiguousarray(cos[:, :half]))
            self.sin_cache = g.initializer("sin_cache", np.ascontiguousarray(sin[:, :half]))
        else:
            self.rope_prologue()

    def rms_norm(self, x, wname, scope):
        if "RMSNormalization" not in self.fused:
            return super().rms_norm(x, wname, scope)
        with self.g.scope(scope):
            return self.g.op("RMSNormalization", [x, self.weight(wname)], axis=-1,
                             epsilon=float(self.cfg.rms_eps), stash_type=1)

    def heads_norm_3d(self, x, wname, scope):
        """Per-head RMSNorm on a [B, S, n*D] tensor."""
        g = self.g
        x4 = g.op("Reshape", [x, self.c([0, 0, -1, self.cfg.head_dim])])
        y = self.rms_norm(x4, wname, scope)
        return g.op("Reshape", [y, self.c([0, 0, -1])])

    def to_heads(self, x, n_heads, b, s):
        return self.split_heads(x, n_heads, b, s)

    def to_3d(self, x4):
        g = self.g
        x = g.op("Transpose", [x4], perm=[0, 2, 1, 3])
        return g.op("Reshape", [x, self.c([0, 0, -1])])

    def attention(self, i, x):
        g, cfg = self.g, self.cfg
        with g.scope("self_attn"):
            shp = g.op("Shape", [x])
            b = self.dim(shp, 0)
            s = self.dim(shp, 1)
            q = self.linear(x, layer_key(i, "self_attn.q_proj.weight"), "q_proj")
            k = self.linear(x, layer_key(i, "self_attn.k_proj.weight"), "k_proj")
            v = self.linear(x, layer_key(i, "self_attn.v_proj.weight"), "v_proj")
            if cfg.qk_norm:
                q = self.heads_norm_3d(q, layer_key(i, "self_attn.q_norm.weight"), "q_norm")
                k = self.heads_norm_3d(k, layer_key(i, "self_attn.k_norm.weight"), "k_norm")
            if "RotaryEmbedding" in self.fused:
                with g.scope("rotary_emb"):
                    q = g.op("RotaryEmbedding", [q, self.cos_cache, self.sin_cache, "position_ids"],
                             num_heads=cfg.heads, interleaved=0)
                    k = g.op("RotaryEmbedding", [k, self.cos_cache, self.sin_cache, "position_ids"],
                             num_heads=cfg.kv_heads, interleaved=0)
                q4 = k4 = None
            else:
                cos = self.unsq(self.cos, [1])
                sin = self.unsq(self.sin, [1])
                q4 = self.apply_rope(self.to_heads(q, cfg.heads, b, s), cos, sin)
                k4 = self.apply_rope(self.to_heads(k, cfg.kv_heads, b, s), cos, sin)
                if "Attention" in self.fused:
                    q, k = self.to_3d(q4), self.to_3d(k4)
            if "Attention" in self.fused:
                ins = [q, k, v, self.attn_mask, f"past_key_values.{i}.key", f"past_key_values.{i}.value"]
                name = g.node_name("Attention")
                ctx, _, _ = g.op("Attention", ins, name=name,
                                 outputs=[f"{name}_output_0", f"present.{i}.key", f"present.{i}.value"],
                                 q_num_heads=cfg.heads, kv_num_heads=cfg.kv_heads,
                                 is_causal=1 if self.mask_mode == "causal_bool" else 0,
                                 scale=float(1.0 / np.sqrt(cfg.head_dim)))
            else:
                if q4 is None:
                    q4 = self.to_heads(q, cfg.heads, b, s)
                    k4 = self.to_heads(k, cfg.kv_heads, b, s)
                v4 = self.to_heads(v, cfg.kv_heads, b, s)
                kc = g.op("Concat", [f"past_key_values.{i}.key", k4], outputs=[f"present.{i}.key"], axis=2)
                vc = g.op("Concat", [f"past_key_values.{i}.value", v4], outputs=[f"present.{i}.value"], axis=2)
                ctx = self.to_3d(self.sdpa(q4, self.repeat_kv(kc), self.repeat_kv(vc)))
            return self.linear(ctx, layer_key(i, "self_attn.o_proj.weight"), "o_proj")

"""Form 1: float32 graph shaped like a torch/optimum export (opset 18).

Everything a real export computes in-graph is computed in-graph: sizes come
from Shape/Gather/Unsqueeze/Concat, the past length from the first past key,
the additive causal+padding mask from Range/ConstantOfShape/Trilu/Where, RoPE
from cos/sin tables gathered by position_ids, GQA by Unsqueeze/Expand/Reshape.
Scalars and axes are Constant nodes. The two architectures use different but
equivalent spellings of RMSNorm, the mask and the attention scale:

  llama: Pow -> ReduceMean -> Add -> Sqrt -> Div(1, .) -> Mul(x) -> Mul(gamma, .)
         mask from Trilu(ConstantOfShape(min)) * (arange > cache_position),
         padding folded in with Add/Equal/Where; scores Div(sqrt(d)).
  qwen3: Mul(x, x) -> ReduceMean -> Add -> Sqrt -> Reciprocal -> Mul(x) -> Mul(., gamma)
         mask from LessOrEqual/Where plus (1 - mask) * min; scores Mul(1/sqrt(d)).
"""

from __future__ import annotations

import numpy as np
import onnx

from .config import DecoderConfig
from .graph import F32_MIN, FLOAT, INT64, INT64_MAX, GraphBuilder
from .weights import layer_key, rope_tables


def io_spec(cfg: DecoderConfig, with_position_ids: bool):
    """Graph inputs and outputs (optimum names and dim_params), in order."""
    kv = ["batch_size", cfg.kv_heads, "past_sequence_length", cfg.head_dim]
    kv_out = ["batch_size", cfg.kv_heads, "total_sequence_length", cfg.head_dim]
    inputs = [
        ("input_ids", INT64, ["batch_size", "sequence_length"]),
        ("attention_mask", INT64, ["batch_size", "total_sequence_length"]),
    ]
    if with_position_ids:
        inputs.append(("position_ids", INT64, ["batch_size", "sequence_length"]))
    outputs = [("logits", FLOAT, ["batch_size", "sequence_length", cfg.vocab])]
    for i in range(cfg.layers):
        inputs.append((f"past_key_values.{i}.key", FLOAT, kv))
        inputs.append((f"past_key_values.{i}.value", FLOAT, kv))
        outputs.append((f"present.{i}.key", FLOAT, kv_out))
        outputs.append((f"present.{i}.value", FLOAT, kv_out))
    return inputs, outputs


class Form1Builder:
    opset = 18
    ir_version = 10
    producer = "pytorch"

    def __init__(self, cfg: DecoderConfig, weights: dict[str, np.ndarray], style: str | None = None):
        self.cfg = cfg
        self.w = weights
        self.style = style or cfg.arch
        self.g = GraphBuilder("main_graph", output_style="torch")
        self._matmul_ids = iter(range(4000, 1 << 30))

    # ------------------------------------------------------------ helpers
    def c(self, value, dtype=np.int64):
        return self.g.constant(value, dtype)

    def unsq(self, x, axes):
        return self.g.op("Unsqueeze", [x, self.c(axes)])

    def dim(self, shape, index):
        """Gather(shape, index) -> scalar int64."""
        return self.g.op("Gather", [shape, self.c(index)], axis=0)

    def weight(self, name):
        return self.g.initializer(name, self.w[name])

    def linear(self, x, wname, scope):
        """MatMul with the pre-transposed weight, as the torch exporter folds it."""
        with self.g.scope(scope):
            wt = self.g.initializer(f"onnx::MatMul_{next(self._matmul_ids)}", np.ascontiguousarray(self.w[wname].T))
            return self.g.op("MatMul", [x, wt])

    # ------------------------------------------------------------ model
    def build(self) -> onnx.ModelProto:
        g, cfg = self.g, self.cfg
        inputs, outputs = io_spec(cfg, with_position_ids=True)
        for name, t, shape in inputs:
            g.add_input(name, t, shape)
        with g.scope("model"):
            with g.scope("embed_tokens"):
                x = g.op("Gather", [self.weight("model.embed_tokens.weight"), "input_ids"])
            self.prologue()
            for i in range(cfg.layers):
                with g.scope(f"layers.{i}"):
                    x = self.layer(i, x)
            x = self.rms_norm(x, "model.norm.weight", "norm")
        with g.scope("lm_head"):
            if cfg.tied_embeddings:
                head = g.op("Transpose", ["model.embed_tokens.weight"], perm=[1, 0])
            else:
                head = g.initializer("onnx::MatMul_lm_head", np.ascontiguousarray(self.w["lm_head.weight"].T))
            g.op("MatMul", [x, head], outputs=["logits"])
        for name, t, shape in outputs:
            g.add_output(name, t, shape)
        return g.model({"": self.opset}, self.ir_version, self.producer)

    def prologue(self):
        """Sizes, attention mask and rotary tables shared by all layers."""
        g = self.g
        ids_shape = g.op("Shape", ["input_ids"])
        self.batch = self.dim(ids_shape, 0)
        self.seq = self.dim(ids_shape, 1)
        past_shape = g.op("Shape", ["past_key_values.0.key"])
        self.past = self.dim(past_shape, 2)
        self.total = g.op("Add", [self.seq, self.past])
        self.mask = self.build_mask()
        self.rope_prologue()

    def rope_prologue(self):
        g = self.g
        cos_t, sin_t = rope_tables(self.cfg)
        with g.scope("rotary_emb"):
            cos_name = g.initializer("model.rotary_emb.cos_cached", cos_t)
            sin_name = g.initializer("model.rotary_emb.sin_cached", sin_t)
            self.cos = g.op("Gather", [cos_name, "position_ids"], axis=0)  # [B, S, D]
            self.sin = g.op("Gather", [sin_name, "position_ids"], axis=0)

    def build_mask(self):
        """Additive float mask [B, 1, S, T]: 0 where visible, float32 min elsewhere."""
        g = self.g
        if self.style == "llama":
            cache_pos = g.op("Range", [self.past, self.total, self.c(1)])
            full_shape = g.op("Concat", [self.unsq(self.seq, [0]), self.unsq(self.total, [0])], axis=0)
            full = g.op("ConstantOfShape", [full_shape], value=onnx.numpy_helper.from_array(np.array([F32_MIN], np.float32)))
            tri = g.op("Trilu", [full, self.c(1)], upper=1)
            key_pos = g.op("Range", [self.c(0), self.total, self.c(1)])
            cache_col = g.op("Reshape", [cache_pos, self.c([-1, 1])])
            later = g.op("Greater", [key_pos, cache_col])
            causal = g.op("Mul", [tri, g.op("Cast", [later], to=FLOAT)])
            causal = self.unsq(causal, [0, 1])
            shape4 = g.op("Concat", [self.unsq(self.batch, [0]), self.c([1]), self.unsq(self.seq, [0]),
                                     self.unsq(self.total, [0])], axis=0)
            causal = g.op("Expand", [causal, shape4])
            am = g.op("Cast", ["attention_mask"], to=FLOAT)
            am = self.unsq(am, [1, 2])
            padding = g.op("Equal", [g.op("Add", [causal, am]), self.c(0.0, np.float32)])
            return g.op("Where", [padding, self.c(F32_MIN, np.float32), causal])
        # qwen3 spelling: comparison-built causal part plus an inverted padding mask
        q_pos = g.op("Add", [g.op("Range", [self.c(0), self.seq, self.c(1)]), self.past])
        k_pos = g.op("Range", [self.c(0), self.total, self.c(1)])
        allowed = g.op("LessOrEqual", [self.unsq(k_pos, [0]), self.unsq(q_pos, [1])])
        causal = g.op("Where", [allowed, self.c(0.0, np.float32), self.c(F32_MIN, np.float32)])
        causal = self.unsq(causal, [0, 1])
        inverted = g.op("Sub", [self.c(1.0, np.float32), g.op("Cast", ["attention_mask"], to=FLOAT)])
        padding = g.op("Mul", [inverted, self.c(F32_MIN, np.float32)])
        padding = self.unsq(padding, [1, 2])
        mask = g.op("Max", [g.op("Add", [causal, padding]), self.c(F32_MIN, np.float32)])
        shape4 = g.op("Concat", [self.unsq(self.batch, [0]), self.c([1]), self.unsq(self.seq, [0]),
                                 self.unsq(self.total, [0])], axis=0)
        return g.op("Expand", [mask, shape4])

    # ------------------------------------------------------------ blocks
    def rms_norm(self, x, wname, scope):
        g, eps = self.g, self.cfg.rms_eps
        with g.scope(scope):
            xf = g.op("Cast", [x], to=FLOAT)
            if self.style == "llama":
                sq = g.op("Pow", [xf, self.c(2.0, np.float32)])
            else:
                sq = g.op("Mul", [xf, xf])
            var = g.op("ReduceMean", [sq, self.c([-1])], keepdims=1)
            std = g.op("Sqrt", [g.op("Add", [var, self.c(eps, np.float32)])])
            if self.style == "llama":
                inv = g.op("Div", [self.c(1.0, np.float32), std])
            else:
                inv = g.op("Reciprocal", [std])
            y = g.op("Cast", [g.op("Mul", [xf, inv])], to=FLOAT)
            gamma = self.weight(wname)
            return g.op("Mul", [gamma, y]) if self.style == "llama" else g.op("Mul", [y, gamma])

    def rotate_half(self, x):
        g, half = self.g, self.cfg.head_dim // 2
        x1 = g.op("Slice", [x, self.c([0]), self.c([half]), self.c([-1]), self.c([1])])
        x2 = g.op("Slice", [x, self.c([half]), self.c([INT64_MAX]), self.c([-1]), self.c([1])])
        return g.op("Concat", [g.op("Neg", [x2]), x1], axis=-1)

    def apply_rope(self, x, cos, sin):
        g = self.g
        return g.op("Add", [g.op("Mul", [x, cos]), g.op("Mul", [self.rotate_half(x), sin])])

    def split_heads(self, x, n_heads, b, s, norm_w=None, norm_scope=None):
        """[B, S, n*D] -> [B, n, S, D] (optionally with the per-head RMSNorm before the transpose)."""
        g, d = self.g, self.cfg.head_dim
        heads = self.c([n_heads]) if self.style == "llama" else self.c([-1])
        shape = g.op("Concat", [self.unsq(b, [0]), self.unsq(s, [0]), heads, self.c([d])], axis=0)
        x = g.op("Reshape", [x, shape])
        if norm_w is not None:
            x = self.rms_norm(x, norm_w, norm_scope)
        return g.op("Transpose", [x], perm=[0, 2, 1, 3])

    def repeat_kv(self, x):
        """[B, kvh, T, D] -> [B, kvh*n_rep, T, D] the way repeat_kv exports."""
        g, cfg = self.g, self.cfg
        if cfg.n_rep == 1:
            return x
        shp = g.op("Shape", [x])
        b = self.dim(shp, 0)
        t = self.dim(shp, 2)
        xu = self.unsq(x, [2])
        exp_shape = g.op("Concat", [self.unsq(b, [0]), self.c([cfg.kv_heads]), self.c([cfg.n_rep]),
                                    self.unsq(t, [0]), self.c([cfg.head_dim])], axis=0)
        xe = g.op("Expand", [xu, exp_shape])
        new_shape = g.op("Concat", [self.unsq(b, [0]), self.c([cfg.heads]), self.unsq(t, [0]),
                                    self.c([cfg.head_dim])], axis=0)
        return g.op("Reshape", [xe, new_shape])

    def attention(self, i, x):
        g, cfg = self.g, self.cfg
        with g.scope("self_attn"):
            shp = g.op("Shape", [x])
            b = self.dim(shp, 0)
            s = self.dim(shp, 1)
            q = self.linear(x, layer_key(i, "self_attn.q_proj.weight"), "q_proj")
            k = self.linear(x, layer_key(i, "self_attn.k_proj.weight"), "k_proj")
            v = self.linear(x, layer_key(i, "self_attn.v_proj.weight"), "v_proj")
            qn = layer_key(i, "self_attn.q_norm.weight") if cfg.qk_norm else None
            kn = layer_key(i, "self_attn.k_norm.weight") if cfg.qk_norm else None
            q = self.split_heads(q, cfg.heads, b, s, qn, "q_norm")
            k = self.split_heads(k, cfg.kv_heads, b, s, kn, "k_norm")
            v = self.split_heads(v, cfg.kv_heads, b, s)
            cos = self.unsq(self.cos, [1])
            sin = self.unsq(self.sin, [1])
            q = self.apply_rope(q, cos, sin)
            k = self.apply_rope(k, cos, sin)
            k = g.op("Concat", [f"past_key_values.{i}.key", k], outputs=[f"present.{i}.key"], axis=2)
            v = g.op("Concat", [f"past_key_values.{i}.value", v], outputs=[f"present.{i}.value"], axis=2)
            ctx = self.sdpa(q, self.repeat_kv(k), self.repeat_kv(v))
            ctx = g.op("Transpose", [ctx], perm=[0, 2, 1, 3])
            last = self.c([cfg.q_size]) if self.style == "llama" else self.c([-1])
            ctx = g.op("Reshape", [ctx, g.op("Concat", [self.unsq(b, [0]), self.unsq(s, [0]), last], axis=0)])
            return self.linear(ctx, layer_key(i, "self_attn.o_proj.weight"), "o_proj")

    def sdpa(self, q, k, v):
        g, d = self.g, self.cfg.head_dim
        scores = g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 3, 2])])
        if self.style == "llama":
            scores = g.op("Div", [scores, self.c(np.sqrt(d), np.float32)])
        else:
            scores = g.op("Mul", [scores, self.c(1.0 / np.sqrt(d), np.float32)])
        scores = g.op("Add", [scores, self.mask])
        probs = g.op("Softmax", [scores], axis=-1)
        return g.op("MatMul", [probs, v])

    def mlp(self, i, x):
        g = self.g
        with g.scope("mlp"):
            gate = self.linear(x, layer_key(i, "mlp.gate_proj.weight"), "gate_proj")
            with g.scope("act_fn"):
                act = g.op("Mul", [gate, g.op("Sigmoid", [gate])])
            up = self.linear(x, layer_key(i, "mlp.up_proj.weight"), "up_proj")
            return self.linear(g.op("Mul", [act, up]), layer_key(i, "mlp.down_proj.weight"), "down_proj")

    def layer(self, i, x):
        g = self.g
        h = self.rms_norm(x, layer_key(i, "input_layernorm.weight"), "input_layernorm")
        x = g.op("Add", [x, self.attention(i, h)])
        h = self.rms_norm(x, layer_key(i, "post_attention_layernorm.weight"), "post_attention_layernorm")
        return g.op("Add", [x, self.mlp(i, h)])


def build_form1(cfg: DecoderConfig, weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    return Form1Builder(cfg, weights).build()

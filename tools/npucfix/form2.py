"""Form 2: onnxruntime-genai style INT4 graph (opset 21 + com.microsoft).

Layout of the graph (names follow the genai model builder):
  * inputs input_ids, attention_mask, past_key_values.* (no position_ids:
    GroupQueryAttention applies rotary itself and derives each token's
    position from seqlens_k);
  * /model/attn_mask_reformat: seqlens_k = int32(ReduceSum(attention_mask, 1) - 1),
    total_sequence_length = int32(Shape(attention_mask)[1]);
  * embedding = GatherBlockQuantized over a Reshape of the lm_head MatMulNBits
    weight (same initializers for data, scales and zero points);
  * SimplifiedLayerNormalization for the first norm, then
    SkipSimplifiedLayerNormalization (output 0 = normed, output 3 = residual sum)
    for every later residual add + norm;
  * MatMulNBits projections (packed QKV and/or packed gate/up on request);
    per-head q/k norms as Reshape -> SimplifiedLayerNormalization -> Reshape;
  * GroupQueryAttention(do_rotary=1, cos/sin caches [max_pos, head_dim/2]);
  * SiLU as Sigmoid + Mul.
Constants are initializers named /model/constants/<TYPE>/<value>.
"""

from __future__ import annotations

import numpy as np
import onnx

from .config import DecoderConfig
from .form1 import io_spec
from .graph import INT32, GraphBuilder
from .quant import QuantMatrix, concat_rows
from .weights import layer_key, rope_tables

MS = "com.microsoft"


class Form2Builder:
    opset = 21
    ir_version = 10
    producer = "onnxruntime-genai"

    def __init__(self, cfg: DecoderConfig, norms: dict[str, np.ndarray], mats: dict[str, QuantMatrix],
                 packed_qkv: bool, packed_gate_up: bool, accuracy_level: int = 0):
        self.cfg = cfg
        self.norms = norms
        self.mats = mats
        self.packed_qkv = packed_qkv
        self.packed_gate_up = packed_gate_up
        self.accuracy_level = accuracy_level
        self.g = GraphBuilder("main_graph", output_style="genai")

    # ------------------------------------------------------------ helpers
    def quant_inits(self, prefix: str, qm: QuantMatrix):
        g = self.g
        names = [
            g.initializer(f"{prefix}.MatMul.weight_Q{qm.bits}G{qm.block}", qm.packed()),
            g.initializer(f"{prefix}.MatMul.weight_scale", qm.scales.astype(np.float32)),
        ]
        if qm.zp is not None:
            names.append(g.initializer(f"{prefix}.MatMul.weight_zp", qm.packed_zp()))
        return names

    def matmul(self, x, prefix: str, qm: QuantMatrix, name: str):
        inits = self.quant_inits(prefix, qm)
        return self.g.op("MatMulNBits", [x] + inits, domain=MS, name=name, K=qm.k, N=qm.n, bits=qm.bits,
                         block_size=qm.block, accuracy_level=self.accuracy_level)

    def norm_weight(self, key):
        return self.g.initializer(key, self.norms[key].astype(np.float32))

    # ------------------------------------------------------------ model
    def build(self) -> onnx.ModelProto:
        g, cfg = self.g, self.cfg
        inputs, outputs = io_spec(cfg, with_position_ids=False)
        for name, t, shape in inputs:
            g.add_input(name, t, shape)

        self.make_mask_reformat()
        cos, sin = rope_tables(cfg)
        half = cfg.head_dim // 2
        self.cos = g.initializer("cos_cache", np.ascontiguousarray(cos[:, :half]))
        self.sin = g.initializer("sin_cache", np.ascontiguousarray(sin[:, :half]))

        head = self.mats["lm_head"]
        head_inits = self.quant_inits("lm_head", head)
        x = self.make_embedding(head, head_inits)

        residual, normed = None, None
        for i in range(cfg.layers):
            base = f"/model/layers.{i}"
            residual, normed = self.layernorm(f"{base}/input_layernorm", layer_key(i, "input_layernorm.weight"),
                                              x if i == 0 else residual, None if i == 0 else mlp_out)
            attn_out = self.attention(i, normed)
            residual, normed = self.layernorm(f"{base}/post_attention_layernorm",
                                              layer_key(i, "post_attention_layernorm.weight"), residual, attn_out)
            mlp_out = self.mlp(i, normed)
        _, normed = self.layernorm(f"/model/layers.{cfg.layers}/final_norm_layernorm", "model.norm.weight",
                                   residual, mlp_out, last=True)
        g.op("MatMulNBits", [normed] + head_inits, domain=MS, name="/lm_head/MatMulNBits", outputs=["logits"],
             K=head.k, N=head.n, bits=head.bits, block_size=head.block, accuracy_level=self.accuracy_level)
        for name, t, shape in outputs:
            g.add_output(name, t, shape)
        return g.model({"": self.opset, MS: 1}, self.ir_version, self.producer)

    def make_mask_reformat(self):
        g = self.g
        base = "/model/attn_mask_reformat/attn_mask_subgraph"
        rs = g.op("ReduceSum", ["attention_mask", g.const_init([1])], name=f"{base}/ReduceSum", keepdims=0)
        sub = g.op("Sub", [rs, g.const_init([1])], name=f"{base}/Sub")
        self.seqlens_k = g.op("Cast", [sub], name=f"{base}/Sub/Cast", to=INT32)
        shp = g.op("Shape", ["attention_mask"], name=f"{base}/Shape")
        tot = g.op("Gather", [shp, g.const_init(1)], name=f"{base}/Gather", axis=0)
        self.total_len = g.op("Cast", [tot], name=f"{base}/Gather/Cast", to=INT32)

    def make_embedding(self, head: QuantMatrix, head_inits):
        g, cfg = self.g, self.cfg
        if head.float_zp:
            raise ValueError("GatherBlockQuantized needs integer zero points to share the lm_head storage")
        flat = cfg.hidden * head.bits // 8
        data = g.op("Reshape", [head_inits[0], g.const_init([cfg.vocab, flat])], name="/model/embed_tokens/Reshape")
        ins = [data, "input_ids"] + head_inits[1:]
        return g.op("GatherBlockQuantized", ins, domain=MS, name="/model/embed_tokens/GatherBlockQuantized",
                    bits=head.bits, block_size=head.block, gather_axis=0, quantize_axis=1)

    def layernorm(self, base, wkey, root, skip, last=False):
        """Returns (residual_stream, normed)."""
        g, eps = self.g, self.cfg.rms_eps
        w = self.norm_weight(wkey)
        if skip is None:
            y = g.op("SimplifiedLayerNormalization", [root, w], name=f"{base}/LayerNorm",
                     outputs=[f"{base}/output_0"], epsilon=eps, axis=-1, stash_type=1)
            return root, y
        if last:
            y = g.op("SkipSimplifiedLayerNormalization", [root, skip, w], domain=MS, name=f"{base}/SkipLayerNorm",
                     outputs=[f"{base}/output_0"], epsilon=eps)
            return None, y
        y, _, _, s = g.op("SkipSimplifiedLayerNormalization", [root, skip, w], domain=MS,
                          name=f"{base}/SkipLayerNorm",
                          outputs=[f"{base}/output_0", "", "", f"{base}/output_3"], epsilon=eps)
        return s, y

    def qk_norm(self, x, base, wkey, heads):
        """Per-head RMSNorm: [B, S, n*D] -> [B, S*n, D] -> SimplifiedLayerNormalization -> [B, S, n*D]."""
        g, cfg = self.g, self.cfg
        r = g.op("Reshape", [x, g.const_init([0, -1, cfg.head_dim])], name=f"{base}/Reshape_1")
        n = g.op("SimplifiedLayerNormalization", [r, self.norm_weight(wkey)], name=f"{base}/SimplifiedLayerNormalization",
                 epsilon=cfg.rms_eps, axis=-1, stash_type=1)
        return g.op("Reshape", [n, g.const_init([0, -1, heads * cfg.head_dim])], name=f"{base}/Reshape_2")

    def attention(self, i, x):
        g, cfg = self.g, self.cfg
        base = f"/model/layers.{i}/attn"
        m = lambda s: self.mats[layer_key(i, s)]  # noqa: E731
        if self.packed_qkv:
            qkv = concat_rows([m("self_attn.q_proj"), m("self_attn.k_proj"), m("self_attn.v_proj")])
            q = self.matmul(x, f"model.layers.{i}.attn.qkv_proj", qkv, f"{base}/qkv_proj/MatMulNBits")
            k = v = ""
            assert not cfg.qk_norm, "packed QKV with q/k norm would need a Split"
        else:
            q = self.matmul(x, f"model.layers.{i}.attn.q_proj", m("self_attn.q_proj"), f"{base}/q_proj/MatMulNBits")
            k = self.matmul(x, f"model.layers.{i}.attn.k_proj", m("self_attn.k_proj"), f"{base}/k_proj/MatMulNBits")
            v = self.matmul(x, f"model.layers.{i}.attn.v_proj", m("self_attn.v_proj"), f"{base}/v_proj/MatMulNBits")
            if cfg.qk_norm:
                q = self.qk_norm(q, f"{base}/q_norm", layer_key(i, "self_attn.q_norm.weight"), cfg.heads)
                k = self.qk_norm(k, f"{base}/k_norm", layer_key(i, "self_attn.k_norm.weight"), cfg.kv_heads)
        ins = [q, k, v, f"past_key_values.{i}.key", f"past_key_values.{i}.value", self.seqlens_k, self.total_len,
               self.cos, self.sin]
        gqa_name = f"{base}/GroupQueryAttention"
        out, _, _ = g.op("GroupQueryAttention", ins, domain=MS, name=gqa_name,
                         outputs=[f"{gqa_name}/output_0", f"present.{i}.key", f"present.{i}.value"],
                         num_heads=cfg.heads, kv_num_heads=cfg.kv_heads, scale=float(1.0 / np.sqrt(cfg.head_dim)),
                         local_window_size=-1, softcap=0.0, do_rotary=1, rotary_interleaved=0)
        return self.matmul(out, f"model.layers.{i}.attn.o_proj", m("self_attn.o_proj"), f"{base}/o_proj/MatMulNBits")

    def mlp(self, i, x):
        g, cfg = self.g, self.cfg
        base = f"/model/layers.{i}/mlp"
        m = lambda s: self.mats[layer_key(i, s)]  # noqa: E731
        if self.packed_gate_up:
            gu = concat_rows([m("mlp.gate_proj"), m("mlp.up_proj")])
            y = self.matmul(x, f"model.layers.{i}.mlp.gate_up_proj", gu, f"{base}/gate_up_proj/MatMulNBits")
            gate, up = g.op("Split", [y, g.const_init([cfg.intermediate, cfg.intermediate])], outputs=2,
                            name=f"{base}/gate_up_proj/Split", axis=-1)
        else:
            gate = self.matmul(x, f"model.layers.{i}.mlp.gate_proj", m("mlp.gate_proj"), f"{base}/gate_proj/MatMulNBits")
            up = self.matmul(x, f"model.layers.{i}.mlp.up_proj", m("mlp.up_proj"), f"{base}/up_proj/MatMulNBits")
        sig = g.op("Sigmoid", [gate], name=f"{base}/act_fn/Sigmoid")
        act = g.op("Mul", [gate, sig], name=f"{base}/act_fn/Mul")
        prod = g.op("Mul", [act, up], name=f"{base}/Mul")
        return self.matmul(prod, f"model.layers.{i}.mlp.down_proj", m("mlp.down_proj"), f"{base}/down_proj/MatMulNBits")


def dequantized_weights(norms: dict[str, np.ndarray], mats: dict[str, QuantMatrix]) -> dict[str, np.ndarray]:
    """HF-named float weights equal to what the form-2 graph computes with."""
    w = dict(norms)
    for key, qm in mats.items():
        if key == "lm_head":
            w["model.embed_tokens.weight"] = qm.dequant()
        else:
            w[f"{key}.weight"] = qm.dequant()
    return w

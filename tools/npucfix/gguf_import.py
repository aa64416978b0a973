"""Reading a llama-architecture GGUF file into the fixtures' weight conventions.

* Config comes from the ``llama.*`` metadata keys.
* Tensor names map to Hugging Face names; matrices keep the [out, in] layout
  (a GGUF matrix with ne = [K, N] is N rows of K values, blocks run along K).
* llama.cpp's converter permutes the rows of attn_q / attn_k inside every head
  so that its interleaved (GPT-J style) RoPE works; the rows are put back so
  the graphs can use Hugging Face rotate-half RoPE. Within a head of size D,
  GGUF row 2*j + i holds HF row i*D/2 + j (i in {0, 1}, j < D/2). A row
  permutation is exact on quantised data too, because blocks run along K.
* Block formats (32 values a block):
    Q4_1: f16 d, f16 m, 16 bytes of nibbles; value j (< 16) in the low nibble of
          byte j, value j + 16 in the high nibble; w = d * q + m.
    Q8_0: f16 d, 32 int8; w = d * q.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader, quants

from .config import DecoderConfig
from .quant import QuantMatrix

NAME_MAP = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
TOP_MAP = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def hf_name(gguf_name: str) -> str:
    if gguf_name in TOP_MAP:
        return TOP_MAP[gguf_name]
    blk, i, rest = gguf_name.split(".", 2)
    assert blk == "blk", gguf_name
    return f"model.layers.{i}.{NAME_MAP[rest]}"


@dataclass
class GgufTensor:
    name: str  # Hugging Face name
    qtype: QT
    rows: int  # N
    cols: int  # K
    raw: np.ndarray  # as stored: quantised bytes [N, bytes_per_row] or floats [N, K] / [K]
    row_perm: np.ndarray | None = None  # HF row r = GGUF row row_perm[r]


class LlamaGguf:
    def __init__(self, path):
        self.reader = GGUFReader(str(path))
        self.fields = {k: f for k, f in self.reader.fields.items()}
        arch = self.get("general.architecture")
        if arch != "llama":
            raise ValueError(f"expected a llama GGUF, got {arch}")
        heads = int(self.get("llama.attention.head_count"))
        kv_heads = int(self.get("llama.attention.head_count_kv", heads))
        hidden = int(self.get("llama.embedding_length"))
        head_dim = int(self.get("llama.rope.dimension_count", hidden // heads))
        self.tensors: dict[str, GgufTensor] = {}
        for t in self.reader.tensors:
            name = hf_name(t.name)
            shape = [int(x) for x in t.shape]
            cols = shape[0]
            rows = int(np.prod(shape[1:])) if len(shape) > 1 else 1
            gt = GgufTensor(name, QT(t.tensor_type), rows, cols, np.asarray(t.data))
            if name.endswith("q_proj.weight"):
                gt.row_perm = head_unpermutation(rows, heads)
            elif name.endswith("k_proj.weight"):
                gt.row_perm = head_unpermutation(rows, kv_heads)
            self.tensors[name] = gt
        vocab = int(self.get("llama.vocab_size", len(self.get("tokenizer.ggml.tokens"))))
        self.config = DecoderConfig(
            arch="llama",
            layers=int(self.get("llama.block_count")),
            hidden=hidden,
            heads=heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            intermediate=int(self.get("llama.feed_forward_length")),
            vocab=vocab,
            rms_eps=float(np.float32(self.get("llama.attention.layer_norm_rms_epsilon"))),
            rope_theta=float(self.get("llama.rope.freq_base", 10000.0)),
            tied_embeddings="lm_head.weight" not in self.tensors,
            max_pos=int(self.get("llama.context_length")),
        )
        if self.fields.get("llama.rope.scaling.type") is not None:
            raise ValueError("RoPE scaling is not supported by these fixtures")

    def get(self, key, default=None):
        f = self.fields.get(key)
        if f is None:
            if default is None:
                raise KeyError(key)
            return default
        return f.contents()

    def type_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.tensors.values():
            out[t.qtype.name] = out.get(t.qtype.name, 0) + 1
        return out

    # ---------------------------------------------------------- float path
    def float_weight(self, name: str) -> np.ndarray:
        t = self.tensors[name]
        if t.qtype == QT.F32:
            w = t.raw.astype(np.float32)
        else:  # F16, BF16 and every block format gguf knows
            w = quants.dequantize(t.raw, t.qtype).astype(np.float32)
        w = w.reshape(t.rows, t.cols) if t.rows > 1 else w.reshape(t.cols)
        if t.row_perm is not None:
            w = w[t.row_perm]
        return np.ascontiguousarray(w)

    def float_weights(self) -> dict[str, np.ndarray]:
        return {name: self.float_weight(name) for name in self.tensors}

    # ------------------------------------------------------ quantised path
    def quant_matrix(self, name: str) -> tuple[QuantMatrix, str]:
        """Blocks as MatMulNBits inputs, plus a note on how the format was mapped."""
        t = self.tensors[name]
        if t.qtype == QT.Q4_1:
            qm, note = q4_1_matrix(t.raw, t.rows, t.cols), "q4_1"
        elif t.qtype == QT.Q8_0:
            qm, note = q8_0_matrix(t.raw, t.rows, t.cols), "q8_0"
        else:
            # anything else: dequantise and requantise symmetric 8-bit per block of 32
            qm, note = requantize_int8(self.float_weight(name)), f"{t.qtype.name}->int8"
            return qm, note
        if t.row_perm is not None:
            qm = QuantMatrix(qm.bits, qm.block, qm.codes[t.row_perm], qm.scales[t.row_perm],
                             None if qm.zp is None else qm.zp[t.row_perm])
        return qm, note


def head_unpermutation(rows: int, n_heads: int) -> np.ndarray:
    d = rows // n_heads
    return np.arange(rows).reshape(n_heads, d // 2, 2).transpose(0, 2, 1).reshape(-1)


def _f16(col_bytes: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(col_bytes).view(np.float16)[..., 0].astype(np.float32)


def q4_1_matrix(raw: np.ndarray, rows: int, cols: int) -> QuantMatrix:
    """Q4_1 -> MatMulNBits(bits=4, block 32): codes unchanged, scale = d, float zero point = -m / d.

    (q - (-m/d)) * d = d*q + m up to float32 rounding. A block with d == 0 holds
    the single value m; it becomes codes 0, scale m, zero point -1.
    """
    blk = raw.reshape(rows, cols // 32, 20)
    d = _f16(blk[..., 0:2])
    m = _f16(blk[..., 2:4])
    qs = blk[..., 4:]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.uint8)  # [N, kb, 32]
    zero = d == 0
    safe_d = np.where(zero, 1.0, d).astype(np.float32)
    zp = (-m / safe_d).astype(np.float32)
    if zero.any():
        codes[zero] = 0
        zp = np.where(zero, -1.0, zp).astype(np.float32)
        d = np.where(zero, m, d).astype(np.float32)
    return QuantMatrix(4, 32, codes.reshape(rows, cols), d.astype(np.float32), zp)


def q8_0_matrix(raw: np.ndarray, rows: int, cols: int) -> QuantMatrix:
    """Q8_0 -> MatMulNBits(bits=8, block 32): uint8 code = q + 128 with the default zero point 128, scale = d."""
    blk = raw.reshape(rows, cols // 32, 34)
    d = _f16(blk[..., 0:2])
    q = np.ascontiguousarray(blk[..., 2:]).view(np.int8).astype(np.int16)
    codes = (q + 128).astype(np.uint8)
    return QuantMatrix(8, 32, codes.reshape(rows, cols), d, None)


def requantize_int8(w: np.ndarray, block: int = 32) -> QuantMatrix:
    n, k = w.shape
    wb = w.reshape(n, k // block, block)
    absmax = np.abs(wb).max(axis=-1)
    scales = np.where(absmax > 0, absmax / 127.0, 1.0).astype(np.float32)
    q = np.clip(np.rint(wb / scales[..., None]), -127, 127).astype(np.int16) + 128
    return QuantMatrix(8, block, q.reshape(n, k).astype(np.uint8), scales, None)

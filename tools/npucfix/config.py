"""Decoder configuration shared by every builder, the reference and meta.json."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class DecoderConfig:
    arch: str  # "llama" | "qwen3"
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    rms_eps: float
    rope_theta: float
    tied_embeddings: bool = True
    max_pos: int = 256  # rows of the cos/sin tables

    @property
    def qk_norm(self) -> bool:
        return self.arch == "qwen3"

    @property
    def q_size(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def n_rep(self) -> int:
        return self.heads // self.kv_heads

    def replace(self, **kw) -> "DecoderConfig":
        return dataclasses.replace(self, **kw)

    def meta(self) -> dict:
        return {
            "arch": self.arch,
            "layers": self.layers,
            "hidden": self.hidden,
            "heads": self.heads,
            "kv_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "intermediate": self.intermediate,
            "vocab": self.vocab,
            "rms_eps": self.rms_eps,
            "rope_theta": self.rope_theta,
            "tied_embeddings": self.tied_embeddings,
            "max_position_embeddings": self.max_pos,
        }


TINY_LLAMA = DecoderConfig(
    arch="llama", layers=2, hidden=256, heads=4, kv_heads=2, head_dim=64,
    intermediate=512, vocab=512, rms_eps=1e-5, rope_theta=10000.0,
)

TINY_QWEN3 = DecoderConfig(
    arch="qwen3", layers=2, hidden=256, heads=3, kv_heads=1, head_dim=128,
    intermediate=512, vocab=512, rms_eps=1e-6, rope_theta=1000000.0,
)

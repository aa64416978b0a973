"""Block-wise weight quantisation in the MatMulNBits / GatherBlockQuantized layout.

A QuantMatrix holds one [N, K] weight (Hugging Face [out, in] layout) as
unpacked codes plus per-block scales and optional zero points, blocked along K:

    w[n, k] = (codes[n, k] - zp[n, k // block]) * scales[n, k // block]

zp is None (the operator default 2^(bits-1)), a uint8 code array (packed into
nibbles for 4 bits) or a float array (MatMulNBits accepts float zero points).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class QuantMatrix:
    bits: int
    block: int
    codes: np.ndarray  # uint8 [N, K], values in [0, 2^bits)
    scales: np.ndarray  # float32 [N, K/block]
    zp: np.ndarray | None = None  # None | uint8 [N, K/block] | float32 [N, K/block]

    @property
    def n(self) -> int:
        return self.codes.shape[0]

    @property
    def k(self) -> int:
        return self.codes.shape[1]

    @property
    def k_blocks(self) -> int:
        return self.k // self.block

    @property
    def float_zp(self) -> bool:
        return self.zp is not None and self.zp.dtype != np.uint8

    def zp_values(self) -> np.ndarray:
        if self.zp is None:
            return np.full(self.scales.shape, 2 ** (self.bits - 1), dtype=np.float32)
        return self.zp.astype(np.float32)

    def dequant(self) -> np.ndarray:
        c = self.codes.astype(np.float32).reshape(self.n, self.k_blocks, self.block)
        w = (c - self.zp_values()[..., None]) * self.scales[..., None]
        return w.reshape(self.n, self.k).astype(np.float32)

    def packed(self) -> np.ndarray:
        """B input of MatMulNBits: uint8 [N, k_blocks, block*bits/8], low bits first."""
        return pack_bits(self.codes, self.bits).reshape(self.n, self.k_blocks, self.block * self.bits // 8)

    def packed_zp(self) -> np.ndarray:
        """zero_points input: uint8 codes packed along the block axis, or float [N, k_blocks]."""
        assert self.zp is not None
        if self.float_zp:
            return self.zp.astype(np.float32)
        kb = self.k_blocks
        per_byte = 8 // self.bits
        padded = np.zeros((self.n, -(-kb // per_byte) * per_byte), dtype=np.uint8)
        padded[:, :kb] = self.zp
        return pack_bits(padded, self.bits)


def pack_bits(codes: np.ndarray, bits: int) -> np.ndarray:
    """Pack the last axis of uint8 codes, 8/bits values a byte, lowest bits first."""
    if bits == 8:
        return codes.astype(np.uint8)
    per_byte = 8 // bits
    c = codes.astype(np.uint8).reshape(*codes.shape[:-1], codes.shape[-1] // per_byte, per_byte)
    out = np.zeros(c.shape[:-1], dtype=np.uint8)
    for j in range(per_byte):
        out |= (c[..., j] << (bits * j)).astype(np.uint8)
    return out


def concat_rows(mats: list[QuantMatrix]) -> QuantMatrix:
    """Stack matrices along N (packed QKV / gate-up projections)."""
    first = mats[0]
    assert all(m.bits == first.bits and m.block == first.block and m.k == first.k for m in mats)
    assert all((m.zp is None) == (first.zp is None) for m in mats)
    zp = None if first.zp is None else np.concatenate([m.zp for m in mats], axis=0)
    return QuantMatrix(
        first.bits, first.block,
        np.concatenate([m.codes for m in mats], axis=0),
        np.concatenate([m.scales for m in mats], axis=0),
        zp,
    )


def quantize_int4(w: np.ndarray, block: int = 32, symmetric: bool = True) -> QuantMatrix:
    """Round-to-nearest 4-bit block quantisation of an [N, K] float weight."""
    n, k = w.shape
    assert k % block == 0
    wb = w.astype(np.float32).reshape(n, k // block, block)
    if symmetric:
        absmax = np.abs(wb).max(axis=-1)
        scales = np.where(absmax > 0, absmax / 7.0, 1.0).astype(np.float32)
        q = np.clip(np.rint(wb / scales[..., None]) + 8, 0, 15)
        return QuantMatrix(4, block, q.reshape(n, k).astype(np.uint8), scales, None)
    lo = np.minimum(wb.min(axis=-1), 0.0)
    hi = np.maximum(wb.max(axis=-1), 0.0)
    scales = np.where(hi > lo, (hi - lo) / 15.0, 1.0).astype(np.float32)
    zp = np.clip(np.rint(-lo / scales), 0, 15).astype(np.uint8)
    q = np.clip(np.rint(wb / scales[..., None]) + zp[..., None], 0, 15)
    return QuantMatrix(4, block, q.reshape(n, k).astype(np.uint8), scales, zp)

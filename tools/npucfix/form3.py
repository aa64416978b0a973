"""Form 3: A8W8 QDQ graphs made by onnxruntime.quantization.quantize_static from form 1."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

from . import runner
from .config import DecoderConfig

VARIANTS = {
    # per-tensor int8 weights, asymmetric uint8 activations
    "a": dict(per_channel=False, weight_type=QuantType.QInt8, activation_type=QuantType.QUInt8,
              extra_options={}, meta={"weights": "per_tensor", "activations": "u8_asym"}),
    # per-channel int8 weights, symmetric int8 activations
    "b": dict(per_channel=True, weight_type=QuantType.QInt8, activation_type=QuantType.QInt8,
              extra_options={"ActivationSymmetric": True}, meta={"weights": "per_channel", "activations": "s8_sym"}),
}


class FeedReader(CalibrationDataReader):
    def __init__(self, feeds: list[dict]):
        self._it = iter(feeds)

    def get_next(self):
        return next(self._it, None)


def calibration_feeds(cfg: DecoderConfig, f1_session, seed: int, rounds: int = 4) -> list[dict]:
    """A few prefill steps of random tokens and a decode step on each of their caches."""
    rng = np.random.default_rng(seed)
    in_names, _ = runner.io_of(f1_session)
    feeds = []
    for _ in range(rounds):
        n = int(rng.integers(4, 9))
        ids = rng.integers(0, cfg.vocab, size=(1, n))
        pre = runner.make_feeds(cfg, in_names, ids)
        out = runner.run(f1_session, pre)
        dec = runner.make_feeds(cfg, in_names, rng.integers(0, cfg.vocab, size=(1, 1)), out, n)
        feeds += [pre, dec]
    return feeds


def build_form3(f1_model: onnx.ModelProto, feeds: list[dict], variant: str) -> onnx.ModelProto:
    v = VARIANTS[variant]
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "f1.onnx"
        dst = Path(tmp) / "f3.onnx"
        onnx.save_model(f1_model, str(src))
        quantize_static(
            str(src), str(dst), FeedReader(feeds),
            quant_format=QuantFormat.QDQ,
            op_types_to_quantize=["MatMul", "Gemm"],
            per_channel=v["per_channel"],
            weight_type=v["weight_type"],
            activation_type=v["activation_type"],
            extra_options=dict(v["extra_options"]),
        )
        return onnx.load_model(str(dst))

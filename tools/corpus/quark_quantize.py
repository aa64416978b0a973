"""AMD Quark's ONNX quantizer on an optimum export: Quark's A8W8 configuration with per-channel
weights, MatMul only. Run by exporters.quark() with the Quark overlay first on PYTHONPATH (Quark
needs an older onnx than the exporter venv's) and its ninja on PATH.

    quark_quantize.py SRC_MODEL OUT_MODEL CALIBRATION_NPZ

The calibration file holds feed i's input `name` as the array `<i>/<name>`. Prints the
configuration it ran as one JSON line (provenance).
"""

from __future__ import annotations

import copy
import json
import sys

import numpy as np


def read_feeds(path: str) -> list[dict]:
    arrays = np.load(path)
    count = 1 + max(int(key.split("/", 1)[0]) for key in arrays.files)
    feeds = [{} for _ in range(count)]
    for key in arrays.files:
        i, name = key.split("/", 1)
        feeds[int(i)][name] = arrays[key]
    return feeds


def a8w8_per_channel():
    """Quark's A8W8 (int8 symmetric activations per tensor with float scales and percentile
    calibration, int8 symmetric weights) with the weights' scales per output channel, quantizing
    MatMul only: Quark's stock A8W8 quantizes every op type, and on a decoder the additive mask's
    -inf gives the attention scores' quantizer a scale of about 1e36 (every score codes to 0), so
    the file no longer computes the model (logits 0.86 of max|logit| from the float export's)."""
    from quark.onnx import A8W8_QCONFIG, QConfig, QLayerConfig, QuantGranularity

    stock = A8W8_QCONFIG.global_config
    activations = copy.deepcopy(stock.input_tensors or stock.activation)
    weights = copy.deepcopy(stock.weight)
    weights.quant_granularity = QuantGranularity.Channel
    extra = dict(A8W8_QCONFIG.extra_options.get("extra_options", A8W8_QCONFIG.extra_options))
    extra["OpTypesToQuantize"] = ["MatMul"]
    config = QConfig(global_config=QLayerConfig(input_tensors=activations, weight=weights), extra_options=extra)
    summary = {"base": "A8W8_QCONFIG", "input_tensors": spec_summary(activations), "weight": spec_summary(weights),
               "extra_options": extra}
    return config, summary


def spec_summary(spec) -> dict:
    return {k: getattr(v, "name", getattr(v, "__name__", v)) for k, v in vars(spec).items()}


def main():
    src, out, calibration = sys.argv[1:4]
    from onnxruntime.quantization import CalibrationDataReader
    from quark.onnx import ModelQuantizer

    feeds = read_feeds(calibration)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(feeds)

        def get_next(self):
            return next(self.it, None)

    config, summary = a8w8_per_channel()
    ModelQuantizer(config).quantize_model(src, out, Reader())
    print("QUARK-CONFIG " + json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""How far OpenVINO's CPU int8 GEMM is from exact on this machine.

A QDQ program in OpenVINO IR (FakeQuantize -> MatMul with int8 weights) runs on the CPU plugin in
int8 after its low-precision transformations. On x86 without VNNI, the u8 x i8 kernel adds pairs
of products in saturating 16-bit lanes, so sums of large codes are clipped. This script builds one
such GEMM with extreme activation codes, runs it with the transformations on and off
(`LP_TRANSFORMS_MODE`), and prints the largest error of each against the exact integer result.

Usage: .venv/bin/python tools/ov_int8_saturation.py [--k 256] [--n 64] [--m 16]
"""
import argparse

import numpy as np
import openvino as ov
import openvino.opset13 as ops


def run(lpt: str, k: int, n: int, m: int) -> tuple[float, float]:
    rng = np.random.default_rng(1)
    core = ov.Core()
    core.set_property("CPU", {"INFERENCE_PRECISION_HINT": "f32", "LP_TRANSFORMS_MODE": lpt})
    s, z, sw = 0.01, 128, 0.02
    x = ops.parameter([m, k], np.float32, name="x")
    low, high = np.float32(-z * s), np.float32((255 - z) * s)
    fq = ops.fake_quantize(x, low, high, low, high, 256)
    w = rng.integers(-127, 128, (n, k)).astype(np.int8)
    wf = ops.multiply(ops.convert(ops.constant(w), np.float32), ops.constant(np.float32(sw)))
    compiled = core.compile_model(ov.Model([ops.matmul(fq, wf, False, True)], [x]), "CPU")
    codes = np.where(rng.random((m, k)) < 0.5, 0, 255)
    got = compiled.infer_new_request({"x": ((codes - z) * s).astype(np.float32)})[0]
    want = ((codes - z) @ w.astype(np.int64).T) * (s * sw)
    return float(np.abs(got - want).max()), float(np.abs(want).max())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--k", type=int, default=256)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--m", type=int, default=16)
    a = ap.parse_args()
    print(f"OpenVINO {ov.__version__}, CPU: {ov.Core().get_property('CPU', 'FULL_DEVICE_NAME')}")
    for lpt in ("YES", "NO"):
        err, largest = run(lpt, a.k, a.n, a.m)
        print(f"LP_TRANSFORMS_MODE={lpt}: max |error| {err:.3g} of max |result| {largest:.3g}")


if __name__ == "__main__":
    main()

"""The exporters, run as their users run them. Each returns the command line it ran (provenance)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

VENV_BIN = Path(sys.executable).parent
BUILDER_OVERLAY = Path(sys.prefix) / "builder-overlay"
QUARK_OVERLAY = Path(sys.prefix) / "quark-overlay"


def run(cmd: list[str], log: Path, env: dict | None = None, cwd: Path | None = None):
    with open(log, "w") as f:
        p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    if p.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        raise RuntimeError(f"`{' '.join(cmd)}` failed ({p.returncode}):\n" + "\n".join(tail))


# Checkpoints past protobuf's 2 GB limit: optimum's post-processing (which removes the tied
# lm_head's copy) serializes the whole model in memory to check it and fails on them; its error
# message names `--no-post-process` as the way to export them, which keeps the copy.
PROTOBUF_LIMIT_BYTES = 2 << 30


def optimum(hf: Path, out: Path) -> list[str]:
    """optimum-onnx's `text-generation-with-past` export (torch's TorchScript exporter)."""
    cmd = [str(VENV_BIN / "optimum-cli"), "export", "onnx", "--model", str(hf), "--task",
           "text-generation-with-past", str(out)]
    if sum(p.stat().st_size for p in hf.glob("*.safetensors")) > PROTOBUF_LIMIT_BYTES:
        cmd.insert(-1, "--no-post-process")
    run(cmd, out.parent / f"{out.name}.log")
    return cmd


def dynamo(hf: Path, out: Path, opset23: bool = False) -> list[str]:
    """`torch.onnx.export(..., dynamo=True)` (the torch.export-based exporter) with the KV cache
    as flat inputs and outputs, at opset 18 or 23 (fused RMSNormalization, RotaryEmbedding,
    Attention); see dynamo_export.py."""
    cmd = [sys.executable, str(Path(__file__).with_name("dynamo_export.py")), str(hf), str(out)]
    cmd += ["--opset23"] * opset23
    run(cmd, out.parent / f"{out.name}.log")
    return cmd


def builder(hf: Path, out: Path, precision: str, extra: dict[str, str]) -> list[str]:
    """onnxruntime-genai's model builder for the CPU provider."""
    if not (BUILDER_OVERLAY / "transformers").is_dir():
        raise RuntimeError(f"{BUILDER_OVERLAY} is missing: install tools/requirements-builder.txt there")
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", str(out), "-p",
           precision, "-e", "cpu", "-c", str(out.parent / f"{out.name}.cache")]
    if extra:
        cmd += ["--extra_options"] + [f"{k}={v}" for k, v in extra.items()]
    env = dict(os.environ, PYTHONPATH=str(BUILDER_OVERLAY))
    run(cmd, out.parent / f"{out.name}.log", env)
    shutil.rmtree(out.parent / f"{out.name}.cache", ignore_errors=True)
    return cmd


def quantize_qdq(src: Path, out: Path, feeds: list[dict], per_channel: bool, symmetric_activations: bool) -> list[str]:
    """onnxruntime.quantization.quantize_static, QDQ format, MatMul weights and activations."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(feeds)

        def get_next(self):
            return next(self.it, None)

    out.mkdir(parents=True, exist_ok=True)
    options = dict(quant_format=QuantFormat.QDQ, per_channel=per_channel, op_types_to_quantize=["MatMul", "Gemm"],
                   activation_type=QuantType.QInt8 if symmetric_activations else QuantType.QUInt8,
                   weight_type=QuantType.QInt8,
                   extra_options={"ActivationSymmetric": symmetric_activations, "WeightSymmetric": True})
    quantize_static(str(src), str(out / "model.onnx"), Reader(), **options)
    return ["onnxruntime.quantization.quantize_static", str(src), f"{options}"]


def quark(src: Path, out: Path, feeds: list[dict]) -> list[str]:
    """AMD Quark's `quark.onnx.ModelQuantizer` (A8W8, per-channel weights, MatMul only; see
    quark_quantize.py), in its overlay. Quark JIT-compiles its custom-op library with ninja at
    import (the build goes into the overlay, not the user's cache) and writes a summary CSV into
    its working folder (a scratch folder here)."""
    import numpy as np

    if not (QUARK_OVERLAY / "quark").is_dir():
        raise RuntimeError(f"{QUARK_OVERLAY} is missing: install tools/requirements-quark.txt there")
    out.mkdir(parents=True, exist_ok=True)
    log = out.parent / f"{out.name}.log"
    env = dict(os.environ, PYTHONPATH=str(QUARK_OVERLAY), PATH=f"{QUARK_OVERLAY / 'bin'}{os.pathsep}{os.environ['PATH']}",
               TORCH_EXTENSIONS_DIR=str(QUARK_OVERLAY / "torch-extensions"))
    with tempfile.TemporaryDirectory() as scratch:
        calibration = Path(scratch) / "calibration.npz"
        np.savez(calibration, **{f"{i}/{name}": a for i, feed in enumerate(feeds) for name, a in feed.items()})
        cmd = [sys.executable, str(Path(__file__).with_name("quark_quantize.py")), str(src.resolve()),
               str((out / "model.onnx").resolve()), str(calibration)]
        run(cmd, log, env, cwd=Path(scratch))
    config = next(line for line in log.read_text().splitlines() if line.startswith("QUARK-CONFIG "))
    return ["quark.onnx.ModelQuantizer", str(src), config[len("QUARK-CONFIG "):]]

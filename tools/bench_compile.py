#!/usr/bin/env python3
"""Compile time and memory against OpenVINO converting the same file.

    python tools/bench_compile.py MODEL.onnx [MODEL.onnx ...] [--npuc target/release/npuc] [--reps 3]

For each model, alternately in fresh processes: `npuc compile MODEL --target cpu` (import, every
pass, the bundle written and its digests computed; not fsynced, which OpenVINO does not do
either) and OpenVINO's `read_model` + `save_model` of the same file (its IR written, weights kept
f32). Prints the median wall time of each, their ratio, and each
one's peak resident memory against the model's weight bytes (the .onnx and its external data).
Both read the file through the page cache; a first unmeasured run of each warms it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OPENVINO_CONVERT = (
    "import sys, openvino as ov\n"
    "ov.save_model(ov.Core().read_model(sys.argv[1]), sys.argv[2], compress_to_fp16=False)\n"
)


def timed(cmd: list[str]) -> tuple[float, int]:
    """Wall seconds and peak RSS bytes of one fresh process running `cmd`."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - start
    if status != 0:
        raise SystemExit(f"{cmd[0]} failed: {proc.stderr.read().decode().strip()}")
    return wall, usage.ru_maxrss * 1024


def weight_bytes(model: Path) -> int:
    return sum(p.stat().st_size for p in model.parent.iterdir() if p.name.startswith(model.name))


def measure(model: Path, npuc: str, reps: int, work: Path) -> dict:
    bundle, ir = work / "model.npub", work / "model.xml"
    runs = {
        "npuc": [npuc, "compile", str(model), "--target", "cpu", "-o", str(bundle), "--overwrite"],
        "openvino": [sys.executable, "-c", OPENVINO_CONVERT, str(model), str(ir)],
    }
    results = {name: {"wall": [], "rss": []} for name in runs}
    for rep in range(reps + 1):
        for name, cmd in runs.items():
            wall, rss = timed(cmd)
            if rep > 0:
                results[name]["wall"].append(wall)
                results[name]["rss"].append(rss)
    return {name: {"wall": statistics.median(r["wall"]), "rss": max(r["rss"])} for name, r in results.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", type=Path)
    ap.add_argument("--npuc", default=str(Path(__file__).resolve().parent.parent / "target/release/npuc"))
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    print(f"{'model':<36} {'weights MB':>10} {'npuc s':>7} {'OpenVINO s':>10} {'time ratio':>10} "
          f"{'npuc RSS/w':>10} {'OV RSS/w':>9}")
    for model in args.models:
        with tempfile.TemporaryDirectory(dir=model.parent.parent) as work:
            r = measure(model, args.npuc, args.reps, Path(work))
        w = weight_bytes(model)
        ratio = r["npuc"]["wall"] / r["openvino"]["wall"]
        name = f"{model.parent.name}/{model.name}"
        print(f"{name:<36} {w / 1e6:>10.1f} {r['npuc']['wall']:>7.2f} {r['openvino']['wall']:>10.2f} "
              f"{ratio:>9.2f}× {r['npuc']['rss'] / w:>10.2f} {r['openvino']['rss'] / w:>9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

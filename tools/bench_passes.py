#!/usr/bin/env python3
"""Benchmark the compiler pipeline: wall time, peak memory and e-graph sizes per model.

    python tools/bench_passes.py [--npuc target/release/npuc] [--target cpu] MODEL.onnx ...

Runs `npuc passes MODEL --json` for each model (a fresh process each, so peak RSS is per model)
and prints one line per model: total wall time, peak RSS and its ratio to the weights' bytes,
and for `saturate` the e-graph size and stop reasons. Weights are memory-mapped: RSS below the
weights' size means the compiler never touched most of them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", type=Path)
    ap.add_argument("--npuc", default=str(Path(__file__).resolve().parent.parent / "target/release/npuc"))
    ap.add_argument("--target", default="cpu")
    args = ap.parse_args()
    print(f"{'model':<28} {'wall s':>7} {'peak RSS MiB':>13} {'RSS/weights':>11} {'nodes in→out':>14}  saturate")
    for m in args.models:
        t0 = time.monotonic()
        out = subprocess.run([args.npuc, "passes", str(m), "--target", args.target, "--json"],
                             capture_output=True, text=True)
        wall = time.monotonic() - t0
        if out.returncode != 0:
            print(f"{m}: npuc failed: {out.stderr.strip()}", file=sys.stderr)
            return 1
        r = json.loads(out.stdout)
        rss = r.get("peak_rss_bytes") or 0
        ratio = rss / r["weight_bytes"] if r["weight_bytes"] else float("nan")
        passes = r["passes"]
        sat = next((p for p in passes if p["name"] == "saturate"), None)
        sat_text = sat["detail"]["summary"] if sat else "-"
        nodes = f"{passes[0]['nodes_before']}→{passes[-1]['nodes_after']}"
        print(f"{m.parent.name:<28} {wall:>7.2f} {rss / 2**20:>13.1f} {ratio:>11.3f} {nodes:>14}  {sat_text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Write the Qwen3-0.6B-shaped benchmark model: form 1 (optimum-style float32) with random weights.

    python tools/gen_bench_model.py [--out DIR] [--layers N]

28 layers, hidden 1024, 16 query / 8 KV heads of 128, intermediate 3072, vocab 151936, tied
embeddings, per-head q/k norms: Qwen3-0.6B's shapes, with seeded random weights (about 2.4 GB
of float32, stored as external data). It exists to measure the compiler (pipeline wall time,
peak memory, e-graph sizes), not to generate text. Written to <out>/qwen3_0p6b_f1/.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS))

from npucfix import runner  # noqa: E402
from npucfix.config import DecoderConfig  # noqa: E402
from npucfix.form1 import build_form1  # noqa: E402
from npucfix.graph import op_histogram  # noqa: E402
from npucfix.weights import random_weights  # noqa: E402

QWEN3_0P6B = DecoderConfig(
    arch="qwen3", layers=28, hidden=1024, heads=16, kv_heads=8, head_dim=128, intermediate=3072,
    vocab=151936, rms_eps=1e-6, rope_theta=1_000_000.0, tied_embeddings=True, max_pos=4096,
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=TOOLS.parent / "fixtures", help="fixtures directory")
    ap.add_argument("--layers", type=int, default=QWEN3_0P6B.layers, help="decoder layers (default 28)")
    args = ap.parse_args()
    cfg = QWEN3_0P6B.replace(layers=args.layers)
    name = "qwen3_0p6b_f1" if args.layers == QWEN3_0P6B.layers else f"qwen3_0p6b_{args.layers}l_f1"
    out = args.out / name
    if (out / "meta.json").exists():
        print(f"{out} exists; delete it to regenerate")
        return
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    weights = random_weights(cfg, seed=606)
    model = build_form1(cfg, weights)
    del weights
    runner.save_model(model, out / "model.onnx", external=True)
    meta = {"name": name, "form": "f1", **cfg.meta(), "op_histogram": op_histogram(model),
            "external_data": "model.onnx.data", "purpose": "compiler benchmark (random weights)"}
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"{name}: {len(model.graph.node)} nodes written to {out} in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()

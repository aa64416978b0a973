#!/usr/bin/env python3
"""Side by side in one run: ONNX Runtime on an ONNX decoder and `npuc bench` on its bundle.

    python tools/bench_compare.py MODEL_DIR [--threads 1 2] [--prompt-len 64] [--gen-len 64] [--reps 3]

MODEL_DIR is a fixture folder (model.onnx + meta.json, e.g. fixtures/smollm2_f2). The script
compiles the model with `npuc compile` (into MODEL_DIR/bench.npub), then for each thread count
times ONNX Runtime (CPU provider, all graph optimisations on, the given intra-op threads, a greedy
KV-cache loop feeding each step's presents back as the next past) and `npuc bench` with the same
prompt length, generation length and threads, and prints decode and prefill tok/s and the ratio
npuc / ONNX Runtime. Both sides use a synthetic prompt of token ids cycled from 1. For the
MatMulNBits form this measures plain onnxruntime on the same graph; onnxruntime-genai is not
installed by the project. Caveat for smollm2_f2: its Q4_1 weights map onto MatMulNBits with FLOAT
zero points, for which onnxruntime's CPU kernel takes a slow path (about 0.3 s per decode step
here, with or without graph optimisations), so that ratio says nothing about onnxruntime's
uint8-zero-point kernels; compare on a graph with uint8 zero points for a fair number.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

ROOT = Path(__file__).resolve().parent.parent


def ort_rates(model: Path, meta: dict, threads: int, prompt_len: int, gen_len: int, reps: int) -> tuple[float, float]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
    in_names = [i.name for i in sess.get_inputs()]
    out_names = [o.name for o in sess.get_outputs()]
    kv, hd = meta["kv_heads"], meta["head_dim"]

    def feeds(ids: np.ndarray, past: dict | None, past_len: int) -> dict:
        f = {}
        s = ids.shape[1]
        for name in in_names:
            if name == "input_ids":
                f[name] = ids
            elif name == "attention_mask":
                f[name] = np.ones((1, past_len + s), dtype=np.int64)
            elif name == "position_ids":
                f[name] = np.arange(past_len, past_len + s, dtype=np.int64)[None, :]
            elif name.startswith("past_key_values."):
                _, layer, kind = name.split(".")
                f[name] = past[f"present.{layer}.{kind}"] if past else np.zeros((1, kv, 0, hd), dtype=np.float32)
        return f

    prompt = (1 + np.arange(prompt_len) % (meta["vocab"] - 1)).astype(np.int64)[None, :]
    prefill, decode = [], []
    for rep in range(reps + 1):  # the first run warms up and is not counted
        t0 = time.perf_counter()
        out = dict(zip(out_names, sess.run(out_names, feeds(prompt, None, 0))))
        t1 = time.perf_counter()
        past_len = prompt_len
        token = np.array([[int(out["logits"][0, -1].argmax())]], dtype=np.int64)
        for _ in range(gen_len - 1):
            out = dict(zip(out_names, sess.run(out_names, feeds(token, out, past_len))))
            past_len += 1
            token = np.array([[int(out["logits"][0, -1].argmax())]], dtype=np.int64)
        t2 = time.perf_counter()
        if rep:
            prefill.append(prompt_len / (t1 - t0))
            decode.append((gen_len - 1) / (t2 - t1))
    return statistics.median(prefill), statistics.median(decode)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--npuc", default=str(ROOT / "target/release/npuc"))
    args = ap.parse_args()
    meta = json.loads((args.model_dir / "meta.json").read_text())
    model = args.model_dir / "model.onnx"
    bundle = args.model_dir / "bench.npub"
    subprocess.run([args.npuc, "compile", str(model), "-o", str(bundle), "--overwrite"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(f"{args.model_dir.name}: prompt {args.prompt_len} + {args.gen_len} generated, median of {args.reps}")
    print(f"{'threads':>7} {'ORT decode':>11} {'npuc decode':>12} {'ratio':>6} {'ORT prefill':>12} {'npuc prefill':>13} {'ratio':>6}")
    for t in args.threads:
        o_pre, o_dec = ort_rates(model, meta, t, args.prompt_len, args.gen_len, args.reps)
        out = subprocess.run([args.npuc, "bench", str(bundle), "--threads", str(t), "--prompt-len", str(args.prompt_len),
                              "--gen-len", str(args.gen_len), "--repetitions", str(args.reps), "--json"],
                             check=True, capture_output=True, text=True)
        r = json.loads(out.stdout)
        n_pre, n_dec = r["prefill_tok_s"]["median"], r["decode_tok_s"]["median"]
        print(f"{t:>7} {o_dec:>11.1f} {n_dec:>12.1f} {n_dec / o_dec:>6.2f} {o_pre:>12.1f} {n_pre:>13.1f} {n_pre / o_pre:>6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

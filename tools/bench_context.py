#!/usr/bin/env python3
"""Prefill and decode against context length, side by side in one run: `npuc bench` on a
bundle of an exporter's folder and onnxruntime-genai on the unmodified file (the builder's).

    python tools/bench_context.py MODEL_DIR [--threads 2] [--prompts 32 512]
                                  [--contexts 128 1024 4096] [--decode-tokens 32] [--reps 1]
                                  [--no-genai] [--kv-dtype f32|f16|int8]

The matrix is the one a CPU plan for Qwen3 sets first: prefill rates for each prompt length,
and decode rates at each context. A decode row at context C prefills C − D synthetic tokens and
times the D decode steps that take the context to C (D = --decode-tokens), so what it measures
is a step's cost with C tokens of KV behind it; its prefill of C − D tokens is printed too.

Each npuc run reports where its resident memory went (`npuc bench --json`'s `memory`: the
process's peak, the weights file it maps, weights packed at load, the KV pages in use at the end,
recurrent state, and the rest: activations, scratch, code and the allocator's slack); the
table prints it per row, and the KV pages against what the KV arithmetic predicts for the
context (layers × 2 × KV heads × head size × rows × bytes per value).

The last line is the long-context target: the time of a decode step at the largest context over
the time at the smallest (npuc's and onnxruntime-genai's); paged attention that reads only the
rows in use keeps it near 1 when the weights dominate a step.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_compare import ROOT, genai_rates, load_meta  # noqa: E402

KV_VALUE_BYTES = {"f32": 4, "f16": 2, "int8": 1}


def npuc_run(npuc: str, bundle: Path, threads: int, prompt: int, gen: int, reps: int, kv: str) -> dict:
    out = subprocess.run([npuc, "bench", str(bundle), "--threads", str(threads), "--prompt-len", str(prompt),
                          "--gen-len", str(gen), "--repetitions", str(reps), "--kv-dtype", kv, "--json"],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def kv_predicted(meta: dict, rows: int, kv: str) -> int:
    """Bytes of K and V for `rows` cached positions, scales of int8 rows left out."""
    return meta["layers"] * 2 * meta["kv_heads"] * meta["head_dim"] * rows * KV_VALUE_BYTES[kv]


def memory_cell(r: dict) -> str:
    m, mb = r["memory"], lambda b: f"{(b or 0) / 1e6:.0f}"
    return (f"{mb(m['peak_rss_bytes'])} MB = weights {mb(m['weights_file_bytes'])} + packed "
            f"{mb(m['packed_at_load_bytes'])} + KV {mb(m['kv_in_use_bytes'])} + rest {mb(m['rest_bytes'])}")


def prefill_rows(args, meta, bundle, model, use_genai, t):
    if args.prompts:
        print(f"{'prefill':>8} {'prompt':>7} {'npuc tok/s':>11} {'genai tok/s':>12} {'ratio':>6}")
    for p in args.prompts:
        r = npuc_run(args.npuc, bundle, t, p, 2, args.reps, args.kv_dtype)
        n = r["prefill_tok_s"]["median"]
        g = genai_rates(model, meta, t, p, 2, args.reps)[0] if use_genai else None
        cells = f"{g:>12.1f} {n / g:>6.2f}" if g else f"{'-':>12} {'-':>6}"
        print(f"{'':>8} {p:>7} {n:>11.1f} {cells}", flush=True)


def decode_rows(args, meta, bundle, model, use_genai, t) -> dict[int, tuple[float, float | None]]:
    print(f"{'decode':>8} {'context':>7} {'npuc tok/s':>11} {'genai tok/s':>12} {'ratio':>6} "
          f"{'npuc pre':>9} {'genai pre':>10}  npuc memory; KV predicted")
    rates = {}
    for c in args.contexts:
        d = args.decode_tokens
        prompt = c - d
        r = npuc_run(args.npuc, bundle, t, prompt, d + 1, args.reps, args.kv_dtype)
        n, n_pre = r["decode_tok_s"]["median"], r["prefill_tok_s"]["median"]
        g_pre, g = genai_rates(model, meta, t, prompt, d + 1, args.reps) if use_genai else (None, None)
        cells = f"{g:>12.1f} {n / g:>6.2f}" if g else f"{'-':>12} {'-':>6}"
        pre = f"{n_pre:>9.1f} " + (f"{g_pre:>10.1f}" if g_pre else f"{'-':>10}")
        kv = kv_predicted(meta, c, args.kv_dtype) / 1e6
        print(f"{'':>8} {c:>7} {n:>11.1f} {cells} {pre}  {memory_cell(r)}; {kv:.0f} MB", flush=True)
        rates[c] = (n, g)
    return rates


def print_long_context(rates: dict[int, tuple[float, float | None]]):
    lo, hi = min(rates), max(rates)
    if lo == hi:
        return
    line = f"decode step time at context {hi} over {lo}: npuc {rates[lo][0] / rates[hi][0]:.2f}×"
    if rates[lo][1] and rates[hi][1]:
        line += f", onnxruntime-genai {rates[lo][1] / rates[hi][1]:.2f}×"
    print(line + " (target ≤ 1.3×)", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("--threads", type=int, nargs="+", default=[2])
    ap.add_argument("--prompts", type=int, nargs="*", default=[32, 512])
    ap.add_argument("--contexts", type=int, nargs="+", default=[128, 1024, 4096])
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--kv-dtype", choices=sorted(KV_VALUE_BYTES), default="f32")
    ap.add_argument("--no-genai", action="store_true", help="skip onnxruntime-genai")
    ap.add_argument("--npuc", default=str(ROOT / "target/release/npuc"))
    args = ap.parse_args()
    if min(args.contexts) <= args.decode_tokens:
        ap.error("every context must be longer than --decode-tokens")
    meta = load_meta(args.model_dir)
    use_genai = not args.no_genai and meta.get("form") == "builder"
    model = args.model_dir / "model.onnx"
    work = Path(tempfile.mkdtemp(prefix="bench_context_"))
    try:
        bundle = work / "bench.npub"
        subprocess.run([args.npuc, "compile", str(model), "-o", str(bundle), "--overwrite"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for t in args.threads:
            print(f"{args.model_dir.name}: {t} thread(s), KV {args.kv_dtype}, median of {args.reps}, "
                  f"decode over the last {args.decode_tokens} positions of each context", flush=True)
            prefill_rows(args, meta, bundle, model, use_genai, t)
            print_long_context(decode_rows(args, meta, bundle, model, use_genai, t))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

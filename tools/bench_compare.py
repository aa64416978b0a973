#!/usr/bin/env python3
"""Side by side in one run: ONNX Runtime (and onnxruntime-genai) on an ONNX decoder and
`npuc bench` on its bundle.

    python tools/bench_compare.py MODEL_DIR [--threads 1 2] [--prompt-len 64] [--gen-len 64] [--reps 3]
                                  [--no-ort] [--no-genai]

MODEL_DIR is an exporter's folder as it wrote it (the model builder's, with its genai_config.json,
or optimum-onnx's, with the model's config.json; e.g. fixtures/corpus/smollm2-builder-int4); every
side runs the file unmodified. The script compiles the model with `npuc compile`, then for each
thread count times

- ONNX Runtime (CPU provider, all graph optimisations on, the given intra-op threads, a greedy
  KV-cache loop feeding each step's presents back as the next past);
- onnxruntime-genai when it is importable and the graph is the builder's: its own
  genai_config.json next to a link to the model, greedy search,
  the given intra-op threads; prefill is `append_tokens`, decode every `generate_next_token`
  after the first (which only picks from the prefill's logits);
- `npuc bench` with the same prompt length, generation length and threads;

and prints decode and prefill tok/s and the ratios npuc / each. Every side uses a synthetic
prompt of token ids cycled from 1 and never stops early.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def synthetic_prompt(prompt_len: int, vocab: int) -> np.ndarray:
    return (1 + np.arange(prompt_len) % (vocab - 1)).astype(np.int64)


def ort_rates(model: Path, meta: dict, threads: int, prompt_len: int, gen_len: int, reps: int) -> tuple[float, float]:
    import onnxruntime as ort

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

    prompt = synthetic_prompt(prompt_len, meta["vocab"])[None, :]
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


def genai_config(meta: dict, model_file: str, threads: int, max_length: int) -> dict:
    """The genai_config.json of a decoder with the MatMulNBits/GQA form's input and output names."""
    tok = meta.get("tokenizer", {})
    return {
        "model": {
            "bos_token_id": tok.get("bos_token_id", 1),
            "eos_token_id": tok.get("eos_token_id", 2),
            "pad_token_id": tok.get("pad_token_id", tok.get("eos_token_id", 2)),
            "context_length": max(max_length, meta.get("max_position_embeddings", max_length)),
            "vocab_size": meta["vocab"],
            "type": meta.get("arch", "llama"),
            "decoder": {
                "session_options": {
                    "log_id": "onnxruntime-genai",
                    "provider_options": [],
                    "intra_op_num_threads": threads,
                    "inter_op_num_threads": 1,
                },
                "filename": model_file,
                "head_size": meta["head_dim"],
                "hidden_size": meta["hidden"],
                "num_attention_heads": meta["heads"],
                "num_hidden_layers": meta["layers"],
                "num_key_value_heads": meta["kv_heads"],
                "inputs": {
                    "input_ids": "input_ids",
                    "attention_mask": "attention_mask",
                    "past_key_names": "past_key_values.%d.key",
                    "past_value_names": "past_key_values.%d.value",
                },
                "outputs": {
                    "logits": "logits",
                    "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value",
                },
            },
        },
        "search": {
            "do_sample": False,
            "num_beams": 1,
            "num_return_sequences": 1,
            "max_length": max_length,
            "min_length": 0,
            "past_present_share_buffer": True,
            "top_k": 1,
            "top_p": 1.0,
            "temperature": 1.0,
            "repetition_penalty": 1.0,
            "early_stopping": True,
            "length_penalty": 1.0,
            "no_repeat_ngram_size": 0,
            "diversity_penalty": 0.0,
        },
    }


def exporters_genai_config(model: Path, threads: int, max_length: int) -> dict | None:
    """The genai_config.json the builder wrote beside `model`, with the thread count and length
    set; None when there is none."""
    path = model.parent / "genai_config.json"
    if not path.exists():
        return None
    cfg = json.loads(path.read_text())
    opts = cfg["model"]["decoder"].setdefault("session_options", {})
    opts.update({"intra_op_num_threads": threads, "inter_op_num_threads": 1})
    cfg["model"]["context_length"] = max(cfg["model"].get("context_length", 0), max_length)
    cfg["search"].update({"max_length": max_length, "min_length": 0, "do_sample": False, "top_k": 1})
    return cfg


def genai_rates(model: Path, meta: dict, threads: int, prompt_len: int, gen_len: int, reps: int) -> tuple[float, float]:
    import onnxruntime_genai as og

    total = prompt_len + gen_len
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for f in model.parent.iterdir():
            if f.name == model.name or f.name.startswith(model.name + ".") or f.name.startswith("tokenizer"):
                os.symlink(f.resolve(), d / f.name)
        cfg = exporters_genai_config(model, threads, total) or genai_config(meta, model.name, threads, total)
        (d / "genai_config.json").write_text(json.dumps(cfg, indent=2))
        m = og.Model(str(d))
        prompt = synthetic_prompt(prompt_len, meta["vocab"]).astype(np.int32)
        prefill, decode = [], []
        for rep in range(reps + 1):
            params = og.GeneratorParams(m)
            params.set_search_options(max_length=total, min_length=total, do_sample=False)
            g = og.Generator(m, params)
            t0 = time.perf_counter()
            g.append_tokens(prompt)
            t1 = time.perf_counter()
            g.generate_next_token()  # picks the first token from the prefill's logits
            t2 = time.perf_counter()
            steps = 0
            while not g.is_done():
                g.generate_next_token()
                steps += 1
            t3 = time.perf_counter()
            if len(g.get_sequence(0)) != total:
                raise RuntimeError(f"onnxruntime-genai generated {len(g.get_sequence(0)) - prompt_len} tokens, not {gen_len}")
            if rep:
                prefill.append(prompt_len / (t2 - t0))
                decode.append(steps / (t3 - t2))
            del g
    return statistics.median(prefill), statistics.median(decode)


def load_meta(model_dir: Path) -> dict:
    """The sizes the ONNX Runtime loop needs, from the exporter's own files (the builder's
    genai_config.json, optimum's config.json)."""
    if (model_dir / "genai_config.json").exists():
        m = json.loads((model_dir / "genai_config.json").read_text())["model"]
        d = m["decoder"]
        return {"form": "builder", "vocab": m["vocab_size"], "heads": d["num_attention_heads"],
                "kv_heads": d["num_key_value_heads"], "head_dim": d["head_size"], "layers": d["num_hidden_layers"],
                "hidden": d["hidden_size"]}
    if (model_dir / "config.json").exists():
        c = json.loads((model_dir / "config.json").read_text())
        heads = c["num_attention_heads"]
        return {"form": "optimum", "vocab": c["vocab_size"], "heads": heads,
                "kv_heads": c.get("num_key_value_heads", heads), "head_dim": c.get("head_dim") or c["hidden_size"] // heads,
                "layers": c["num_hidden_layers"], "hidden": c["hidden_size"]}
    raise SystemExit(f"{model_dir}: no genai_config.json or config.json to read the model's sizes from")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-ort", action="store_true", help="skip plain ONNX Runtime")
    ap.add_argument("--no-genai", action="store_true", help="skip onnxruntime-genai")
    ap.add_argument("--npuc", default=str(ROOT / "target/release/npuc"))
    args = ap.parse_args()
    meta = load_meta(args.model_dir)
    work = Path(tempfile.mkdtemp(prefix="bench_compare_"))
    try:
        return compare(args, meta, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def compare(args: argparse.Namespace, meta: dict, work: Path) -> int:
    model = args.model_dir / "model.onnx"
    bundle = work / "bench.npub"
    subprocess.run([args.npuc, "compile", str(model), "-o", str(bundle), "--overwrite"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    use_genai = False
    if not args.no_genai and meta.get("form") == "builder":
        try:
            import onnxruntime_genai  # noqa: F401
            use_genai = True
        except ImportError:
            print("onnxruntime-genai is not installed (pip install onnxruntime-genai): its columns are left out")
    sides = (["ORT"] if not args.no_ort else []) + (["genai"] if use_genai else [])
    print(f"{args.model_dir.name}: prompt {args.prompt_len} + {args.gen_len} generated, median of {args.reps}")
    head = f"{'threads':>7} {'npuc dec':>9}" + "".join(f" {s + ' dec':>10} {'ratio':>6}" for s in sides)
    head += f" {'npuc pre':>9}" + "".join(f" {s + ' pre':>10} {'ratio':>6}" for s in sides)
    print(head, flush=True)
    for t in args.threads:
        rates = {}
        if "ORT" in sides:
            rates["ORT"] = ort_rates(model, meta, t, args.prompt_len, args.gen_len, args.reps)
        if "genai" in sides:
            rates["genai"] = genai_rates(model, meta, t, args.prompt_len, args.gen_len, args.reps)
        out = subprocess.run([args.npuc, "bench", str(bundle), "--threads", str(t), "--prompt-len", str(args.prompt_len),
                              "--gen-len", str(args.gen_len), "--repetitions", str(args.reps), "--json"],
                             check=True, capture_output=True, text=True)
        r = json.loads(out.stdout)
        n_pre, n_dec = r["prefill_tok_s"]["median"], r["decode_tok_s"]["median"]
        line = f"{t:>7} {n_dec:>9.1f}" + "".join(f" {rates[s][1]:>10.1f} {n_dec / rates[s][1]:>6.2f}" for s in sides)
        line += f" {n_pre:>9.1f}" + "".join(f" {rates[s][0]:>10.1f} {n_pre / rates[s][0]:>6.2f}" for s in sides)
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

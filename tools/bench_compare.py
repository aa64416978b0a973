#!/usr/bin/env python3
"""Side by side in one run: ONNX Runtime (and onnxruntime-genai, and llama.cpp) on an ONNX
decoder and `npuc bench` on its bundle, against this machine's read bandwidth.

    python tools/bench_compare.py MODEL_DIR [--threads 1 2] [--prompt-len 64] [--gen-len 64] [--reps 3]
                                  [--no-ort] [--no-genai] [--gguf FILE --llama-bench BIN]

MODEL_DIR is an exporter's folder as it wrote it (the model builder's, with its genai_config.json,
or optimum-onnx's, with the model's config.json; e.g. fixtures/corpus/smollm2-builder-int4); every
side runs the file unmodified. The script compiles the model with `npuc compile`, then for each
thread count times

- ONNX Runtime (CPU provider, all graph optimisations on, the given intra-op threads, a greedy
  KV-cache loop feeding each step's presents back as the next past; a hybrid model's recurrent and
  conv states `past.<layer>.<kind>` start at zero and are carried the same way, and MRoPE's
  [3, batch, seq] position_ids get the text position on each axis);
- onnxruntime-genai when it is importable and the graph is the builder's: its own
  genai_config.json next to a link to the model, greedy search,
  the given intra-op threads; prefill is `append_tokens`, decode every `generate_next_token`
  after the first (which only picks from the prefill's logits);
- with --gguf and --llama-bench (tools/build_llama_bench.py builds it), llama.cpp's
  `llama-bench -m FILE -p <prompt-len> -n <gen-len> -t <threads> -r <reps> -o json` on a GGUF of
  the same weights (for SmolLM2, the Q4_1 file the corpus entries were exported from: llama.cpp's
  own 4-bit format, not the builder's int4): its prefill (pp) and decode (tg) tok/s, the median of
  its samples. llama-bench decodes from an empty context and its prompt is its own;
- `npuc bench` with the same prompt length, generation length and threads;

and prints decode and prefill tok/s and the ratios npuc / each. ONNX Runtime, onnxruntime-genai
and npuc use a synthetic prompt of token ids cycled from 1 and never stop early.

Decoding a small model is bound by reading its weights, so the run then measures this machine's
read bandwidth (numpy sums a 1 GiB array on 1..T threads, best of 5) and prints, per side, the
GEMM weight bytes one decoded token reads (npuc: `gemm_weight_bytes_per_token` of `npuc bench
--json`, the codes, scales and zero points of every projection and the lm_head as npuc packed
them; ONNX Runtime and onnxruntime-genai: the same weights as the file stores them; llama.cpp:
every 2-D tensor of the GGUF, its token embedding once as the tied lm_head; an MoE model's routed
experts as npuc measured them read, and for the file k of every MoE/QMoE node's experts) and the
fraction of
the bandwidth limit its decode rate reaches: bytes/token × tok/s / bandwidth. The embedding row,
the KV cache and activations are left out, so a fraction near 1 means the weights alone fill the
memory bus. For an MoE model npuc's `moe` section is printed too: the expert bytes one decode
token read beside k experts' and all experts' bytes and what a dense model of the same active size
reads. The probe measures what one streaming read per core reaches, not the memory's rated
peak: a runtime that prefetches harder can pass 1.
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
# Prompt tokens of each side's untimed warm-up run at most (npuc bench's WARM_UP_TOKENS): a long
# context's bench would otherwise pay its prefill twice.
WARM_UP_TOKENS = 256


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
    shapes = {i.name: i.shape for i in sess.get_inputs()}
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
                positions = np.arange(past_len, past_len + s, dtype=np.int64)[None, :]
                # MRoPE's [3, batch, seq]: a text prompt has the same position on each of the 3 axes.
                f[name] = np.broadcast_to(positions, (3, 1, s)).copy() if len(shapes[name]) == 3 else positions
            elif name.startswith("past_key_values."):
                _, layer, kind = name.split(".")
                f[name] = past[f"present.{layer}.{kind}"] if past else np.zeros((1, kv, 0, hd), dtype=np.float32)
            elif name.startswith("past."):
                # A hybrid layer's recurrent or conv state: zeros of its fixed size, then carried by name.
                _, layer, kind = name.split(".")
                f[name] = past[f"present.{layer}.{kind}"] if past else np.zeros((1, *shapes[name][1:]), dtype=np.float32)
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
            if not rep:  # untimed warm-up, as npuc bench's: at most WARM_UP_TOKENS of the prompt
                g.append_tokens(prompt[:WARM_UP_TOKENS])
                g.generate_next_token()
                del g
                continue
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
            prefill.append(prompt_len / (t2 - t0))
            decode.append(steps / (t3 - t2))
            del g
    return statistics.median(prefill), statistics.median(decode)


def llama_rates(binary: Path, gguf: Path, threads: int, prompt_len: int, gen_len: int,
                reps: int) -> tuple[float, float, str]:
    """llama.cpp's own benchmark on the GGUF: (prefill, decode) tok/s, each the median of
    llama-bench's samples (it runs one untimed warm-up first), and its build commit."""
    cmd = [str(binary), "-m", str(gguf), "-p", str(prompt_len), "-n", str(gen_len), "-t", str(threads),
           "-r", str(reps), "-o", "json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    results = json.loads(out.stdout)
    pp = next(r for r in results if r["n_prompt"] == prompt_len and r["n_gen"] == 0)
    tg = next(r for r in results if r["n_prompt"] == 0 and r["n_gen"] == gen_len)
    rate = lambda r: statistics.median(r["samples_ts"]) if r.get("samples_ts") else r["avg_ts"]
    return rate(pp), rate(tg), str(tg.get("build_commit", "unknown"))


def gguf_weights(gguf: Path) -> tuple[int, dict[str, list[str]]]:
    """GEMM weight bytes one llama.cpp decode step reads from the GGUF (every 2-D tensor once,
    the token embedding only as the lm_head when there is no output.weight: the lookup reads a
    row), and the 2-D tensors' names per storage type."""
    from gguf import GGUFReader

    tensors = [t for t in GGUFReader(str(gguf)).tensors if len(t.shape) >= 2]
    names = {t.name for t in tensors}
    read = [t for t in tensors if t.name != "token_embd.weight" or "output.weight" not in names]
    types: dict[str, list[str]] = {}
    for t in tensors:
        types.setdefault(t.tensor_type.name, []).append(t.name)
    return sum(int(t.n_bytes) for t in read), types


def onnx_weight_bytes(model: Path) -> int:
    """GEMM weight bytes the ONNX file stores, each read once per decoded token: MatMul's and
    Gemm's initializer operand (through a Transpose, as torch writes a tied lm_head),
    MatMulNBits' codes, scales and zero points, and of an MoE or QMoE node's expert tensors
    (every initializer input after the router's, each [experts, ...]) the routed share, k of the
    experts. What ONNX Runtime and onnxruntime-genai read in the file's own format; an
    embedding's gather reads a row and is left out."""
    import onnx
    from onnx import helper

    graph = onnx.load(str(model), load_external_data=False).graph
    inits = {t.name: t for t in graph.initializer}
    producers = {out: n for n in graph.node for out in n.output}

    def size(name: str) -> int:
        while name not in inits and name in producers and producers[name].op_type in ("Transpose", "Identity"):
            name = producers[name].input[0]
        t = inits.get(name)
        if t is None:
            return 0
        return int(np.prod(t.dims, dtype=np.int64)) * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize

    total = 0
    for n in graph.node:
        if n.op_type in ("MatMul", "Gemm"):
            total += size(n.input[1])
        elif n.op_type == "MatMulNBits":
            total += sum(size(i) for i in n.input[1:4] if i)
        elif n.op_type in ("MoE", "QMoE"):
            k = next(helper.get_attribute_value(a) for a in n.attribute if a.name == "k")
            experts = inits[n.input[2]].dims[0]
            total += sum(size(i) for i in n.input[2:] if i) * k // experts
    return total


def read_bandwidths(threads: list[int], gib: int = 1, reps: int = 5) -> dict[int, float]:
    """This machine's read bandwidth in GB/s on each thread count: numpy sums a `gib` GiB array
    (a slice per thread; numpy's reductions release the GIL), best of `reps`. Every numpy
    reduction tried (sum, max, count_nonzero) ran at the same rate, so it is the memory that
    limits it, not the adds."""
    data = np.ones(gib * 2**30 // 8)
    best = {}
    for t in threads:
        slices = np.array_split(data, t)
        with ThreadPoolExecutor(max_workers=t) as pool:
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                list(pool.map(np.sum, slices))
                times.append(time.perf_counter() - t0)
        best[t] = data.nbytes / min(times) / 1e9
    return best


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
    ap.add_argument("--gguf", type=Path, help="a GGUF of the same weights for llama.cpp (with --llama-bench)")
    ap.add_argument("--llama-bench", type=Path, help="llama.cpp's llama-bench (tools/build_llama_bench.py)")
    args = ap.parse_args()
    if (args.gguf is None) != (args.llama_bench is None):
        ap.error("--gguf and --llama-bench go together")
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
    sides = (["ORT"] if not args.no_ort else []) + (["genai"] if use_genai else []) + (["llama"] if args.gguf else [])
    print(f"{args.model_dir.name}: prompt {args.prompt_len} + {args.gen_len} generated, median of {args.reps}")
    head = f"{'threads':>7} {'npuc dec':>9}" + "".join(f" {s + ' dec':>10} {'ratio':>6}" for s in sides)
    head += f" {'npuc pre':>9}" + "".join(f" {s + ' pre':>10} {'ratio':>6}" for s in sides)
    print(head, flush=True)
    decode, commit = {}, "unknown"
    for t in args.threads:
        rates = {}
        if "ORT" in sides:
            rates["ORT"] = ort_rates(model, meta, t, args.prompt_len, args.gen_len, args.reps)
        if "genai" in sides:
            rates["genai"] = genai_rates(model, meta, t, args.prompt_len, args.gen_len, args.reps)
        if "llama" in sides:
            pre, dec, commit = llama_rates(args.llama_bench, args.gguf, t, args.prompt_len, args.gen_len, args.reps)
            rates["llama"] = (pre, dec)
        out = subprocess.run([args.npuc, "bench", str(bundle), "--threads", str(t), "--prompt-len", str(args.prompt_len),
                              "--gen-len", str(args.gen_len), "--repetitions", str(args.reps), "--json"],
                             check=True, capture_output=True, text=True)
        r = json.loads(out.stdout)
        n_pre, n_dec = r["prefill_tok_s"]["median"], r["decode_tok_s"]["median"]
        line = f"{t:>7} {n_dec:>9.1f}" + "".join(f" {rates[s][1]:>10.1f} {n_dec / rates[s][1]:>6.2f}" for s in sides)
        line += f" {n_pre:>9.1f}" + "".join(f" {rates[s][0]:>10.1f} {n_pre / rates[s][0]:>6.2f}" for s in sides)
        print(line, flush=True)
        decode[t] = {"npuc": n_dec, **{s: rates[s][1] for s in sides}}
        moe = r.get("moe")
        # The routed experts a decode token read (measured) on top of the dense projections'.
        npuc_bytes = r["gemm_weight_bytes_per_token"] + (moe["expert_bytes_per_decode_token"] if moe else 0)
    if moe:
        print_moe(moe, r["gemm_weight_bytes_per_token"])
    if args.gguf:
        describe_llama(args.gguf, commit)
    file_bytes = onnx_weight_bytes(model)
    weight_bytes = {"npuc": npuc_bytes, "ORT": file_bytes, "genai": file_bytes}
    if args.gguf:
        weight_bytes["llama"] = gguf_weights(args.gguf)[0]
    print_bandwidth_limit(decode, {s: weight_bytes[s] for s in ["npuc"] + sides}, read_bandwidths(args.threads))
    return 0


def print_moe(moe: dict, gemm_bytes: int):
    """npuc's MoE section of `npuc bench --json`: the routed experts' bytes one decode token read
    (measured over its first decode steps), k experts' and all experts' bytes per token, and the
    weights a dense model of the same active size reads (the other GEMMs plus k experts)."""
    print(f"npuc MoE experts read per decode token: {moe['expert_bytes_per_decode_token'] / 1e6:.1f} MB measured "
          f"({moe['active_expert_bytes'] / 1e6:.1f} MB for k experts per layer, {moe['all_expert_bytes'] / 1e6:.1f} MB "
          f"all experts); weights read per token {(gemm_bytes + moe['expert_bytes_per_decode_token']) / 1e6:.1f} MB "
          f"against {moe['dense_same_active_bytes_per_token'] / 1e6:.1f} MB for a dense model of the same active size "
          f"and {(gemm_bytes + moe['all_expert_bytes']) / 1e6:.1f} MB reading every expert")


def describe_llama(gguf: Path, commit: str):
    """What the llama column ran: its weights are another format than the ONNX file's."""
    _, types = gguf_weights(gguf)
    kinds = ", ".join(f"{len(n)} {k}" + (f" ({', '.join(n)})" if len(n) <= 2 else "")
                      for k, n in sorted(types.items(), key=lambda kv: -len(kv[1])))
    print(f"llama: llama.cpp {commit}'s llama-bench (CPU) on {gguf.name}; its 2-D tensors: {kinds}.")
    print("  Q4_1 is llama.cpp's 4-bit format (an f16 scale and an f16 minimum per 32 weights), not the builder's "
          "int4 (symmetric, an f32 scale per 32 weights); llama-bench's prompt is its own and its decode (tg) starts "
          "from an empty context.")


def print_bandwidth_limit(decode: dict[int, dict[str, float]], weight_bytes: dict[str, int],
                          bandwidth: dict[int, float]):
    """Per side, the GEMM weight bytes a decoded token reads, and per thread count the fraction
    of the measured read bandwidth that those bytes at the side's decode rate take."""
    sources = {"npuc": "npuc: as it packed them, routed experts as read", "ORT": "ORT/genai: as the ONNX file stores them",
               "llama": "llama: the GGUF's"}
    print("GEMM weight bytes per decoded token: " + ", ".join(f"{s} {b / 1e6:.1f} MB" for s, b in weight_bytes.items())
          + " (" + "; ".join(text for s, text in sources.items() if s in weight_bytes) + ")")
    print("read bandwidth (numpy sum of a 1 GiB array, best of 5) and the fraction of it each decode rate "
          "reaches (bytes/token x tok/s / bandwidth):")
    print(f"{'threads':>7} {'GB/s':>7}" + "".join(f" {s:>7}" for s in weight_bytes))
    for t, rates in decode.items():
        print(f"{t:>7} {bandwidth[t]:>7.1f}"
              + "".join(f" {weight_bytes[s] * rates[s] / 1e9 / bandwidth[t]:>7.2f}" for s in weight_bytes), flush=True)


if __name__ == "__main__":
    sys.exit(main())

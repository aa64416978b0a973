#!/usr/bin/env python3
"""Speculative decoding side by side in one run: npuc's prompt-lookup speculation against its own
plain decoding and against llama.cpp's prompt-lookup example on the same prompts.

    python tools/bench_speculation.py BUNDLE.npub --gguf FILE --llama-lookup BIN --llama-bench BIN
        [--prompts tools/bench_prompts/*.txt] [--threads 1 2] [--gen-len 128] [--draft-len 4] [--reps 3]

Each prompt file is one user message, rendered through the bundle's chat template (the text npuc
tokenises with `--chat`; llama.cpp tokenises the same text, special tokens parsed). For each prompt
and thread count:

- `npuc bench BUNDLE --prompt-file P --chat --speculate lookup --draft-len K --json`: plain and
  speculative greedy decoding back to back per repetition (the same tokens, asserted by npuc),
  decode tok/s of both, drafts kept and tokens per weight pass;
- llama.cpp's `llama-lookup` (its n-gram prompt-lookup speculative decoding, greedy: `--temp 0`,
  `--spec-draft-n-max K`) on the GGUF, the median decode rate of `--reps` runs and its drafts accepted. It
  stops at the model's end-of-generation token, npuc's bench never stops: the tokens each decoded
  are printed;
- llama.cpp's plain decoding at the same depth: `llama-bench -d <prompt tokens> -n <gen-len>`.

Ratios are npuc's speculative decode rate over each anchor. For SmolLM2 the GGUF is the Q4_1 file
the bundle's ONNX graph was exported from (tools/fetch_smollm2.py); the two runtimes' weights are
the same model in two 4-bit formats, so their greedy texts, and so their acceptance, can differ.
tools/build_llama_bench.py builds both llama.cpp programs (`--target llama-lookup`).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import jinja2

ROOT = Path(__file__).resolve().parent.parent


def render_chat(bundle: Path, message: str) -> str:
    """`message` as one user turn of the bundle's chat template, with the generation prompt."""
    template = (bundle / "chat_template.jinja").read_text()
    env = jinja2.Environment()
    return env.from_string(template).render(messages=[{"role": "user", "content": message}],
                                            add_generation_prompt=True)


def npuc_rates(args, prompt: Path, threads: int) -> dict:
    cmd = [args.npuc, "bench", str(args.bundle), "--prompt-file", str(prompt), "--chat", "--gen-len",
           str(args.gen_len), "--threads", str(threads), "--repetitions", str(args.reps), "--speculate", "lookup",
           "--draft-len", str(args.draft_len), "--json"]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def lookup_rates(args, rendered: Path, threads: int) -> dict:
    """llama-lookup's decode rate (median over --reps runs), and the last run's counters."""
    cmd = [str(args.llama_lookup), "-m", str(args.gguf), "-f", str(rendered), "-n", str(args.gen_len), "-t",
           str(threads), "--temp", "0", "--spec-draft-n-max", str(args.draft_len), "-c", "4096"]
    rates, last = [], {}
    for _ in range(args.reps):
        out = subprocess.run(cmd, check=True, capture_output=True, text=True)
        log = out.stdout + out.stderr
        decoded = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s", log)
        if decoded is None:
            sys.exit(f"llama-lookup printed no decode rate:\n{log[-2000:]}")
        rates.append(float(decoded.group(3)))
        counters = {k: int(v) for k, v in re.findall(r"(n_drafted|n_accept|n_predict)\s+=\s+(\d+)", log)}
        last = {"tokens": int(decoded.group(1)), **counters}
    return {"decode": statistics.median(rates), **last}


def llama_plain_decode(args, depth: int, threads: int) -> float:
    """llama-bench's decode rate at a context already `depth` tokens deep (median of its samples)."""
    cmd = [str(args.llama_bench), "-m", str(args.gguf), "-p", "0", "-n", str(args.gen_len), "-d", str(depth), "-t",
           str(threads), "-r", str(args.reps), "-o", "json"]
    results = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    tg = next(r for r in results if r["n_gen"] == args.gen_len)
    return statistics.median(tg["samples_ts"]) if tg.get("samples_ts") else tg["avg_ts"]


def bench_prompt(args, prompt: Path, threads: int, scratch: Path):
    rendered = scratch / f"{prompt.stem}.rendered.txt"
    rendered.write_text(render_chat(args.bundle, prompt.read_text().rstrip()))
    r = npuc_rates(args, prompt, threads)
    s = r["speculation"]
    plain, spec = r["decode_tok_s"]["median"], s["decode_tok_s"]["median"]
    look = lookup_rates(args, rendered, threads)
    llama_plain = llama_plain_decode(args, r["prompt_len"], threads)
    kept = f"{s['accepted']}/{s['drafted']}"
    llama_kept = f"{look.get('n_accept', 0)}/{look.get('n_drafted', 0)}"
    print(f"{prompt.stem:>14} {r['prompt_len']:>6} {threads:>3} | {plain:>7.1f} {spec:>7.1f} {spec / plain:>5.2f} "
          f"{kept:>8} {s['tokens_per_weight_pass']:>5.2f} | {llama_plain:>7.1f} {look['decode']:>7.1f} "
          f"{llama_kept:>8} {look['tokens']:>5} | {spec / look['decode']:>6.2f} {spec / llama_plain:>6.2f}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--gguf", type=Path, required=True)
    ap.add_argument("--llama-lookup", type=Path, required=True)
    ap.add_argument("--llama-bench", type=Path, required=True)
    ap.add_argument("--prompts", type=Path, nargs="+", default=sorted((ROOT / "tools/bench_prompts").glob("*.txt")))
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--gen-len", type=int, default=128)
    ap.add_argument("--draft-len", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--npuc", default=str(ROOT / "target/release/npuc"))
    args = ap.parse_args()
    print(f"{args.bundle.name} vs llama.cpp on {args.gguf.name}: {args.gen_len} generated, draft {args.draft_len}, "
          f"median of {args.reps}; decode tok/s")
    print(f"{'prompt':>14} {'tokens':>6} {'thr':>3} | {'npuc':>7} {'spec':>7} {'ratio':>5} {'kept':>8} {'t/pass':>5} | "
          f"{'llama':>7} {'lookup':>7} {'kept':>8} {'toks':>5} | {'/look':>6} {'/llama':>6}")
    with tempfile.TemporaryDirectory() as scratch:
        for prompt in args.prompts:
            for t in args.threads:
                bench_prompt(args, prompt, t, Path(scratch))
    return 0


if __name__ == "__main__":
    sys.exit(main())

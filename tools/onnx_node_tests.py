#!/usr/bin/env python3
"""Unpack ONNX's own backend node tests (a model and input/output .pb files per case) from the
onnx 1.20.0 source distribution on PyPI: the last release that ships them.

    python tools/onnx_node_tests.py [--out fixtures/onnx-node-tests]

The sdist is looked up on the package index pip uses (PIP_INDEX_URL, else PyPI's simple index),
checked against the sha256 the index lists, cached in fixtures/cache/, and only
onnx/backend/test/data/node/<case>/ is unpacked. Does nothing when the folder is complete.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys
import tarfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SDIST = "onnx-1.20.0.tar.gz"
NODE_PREFIX = "onnx-1.20.0/onnx/backend/test/data/node/"
STAMP = ".complete"


def sdist_link() -> tuple[str, str]:
    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
    page = urllib.request.urlopen(f"{index}/onnx/", timeout=60).read().decode()
    for href in re.findall(r'href="([^"]+)"', page):
        url, _, frag = href.partition("#")
        if url.rsplit("/", 1)[-1] == SDIST and frag.startswith("sha256="):
            return url, frag[len("sha256="):]
    sys.exit(f"onnx_node_tests: {SDIST} is not on {index}/onnx/")


def fetch(cache: Path) -> Path:
    path = cache / SDIST
    if path.exists():
        return path
    url, sha = sdist_link()
    data = urllib.request.urlopen(url, timeout=300).read()
    if hashlib.sha256(data).hexdigest() != sha:
        sys.exit(f"onnx_node_tests: {SDIST} does not match the index's sha256")
    cache.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "fixtures" / "onnx-node-tests")
    args = ap.parse_args()
    if (args.out / STAMP).exists():
        return
    sdist = fetch(args.out.parent / "cache")
    count = 0
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            if not member.name.startswith(NODE_PREFIX) or not member.isfile():
                continue
            rel = Path(member.name[len(NODE_PREFIX):])
            if ".." in rel.parts:
                continue
            dest = args.out / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(tar.extractfile(member).read())
            count += rel.name == "model.onnx"
    (args.out / STAMP).write_text(f"{count} cases from {SDIST}\n")
    print(f"onnx node tests: {count} cases in {args.out}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Write frontend/data/onnx_since.txt: for each ai.onnx op of npuc's vocabulary, the opset
versions where its definition changed (since_version), from the installed onnx package's
schemas. A version is marked `*` when its signature differs from the version before it:
attribute names or defaults, input or output names or optionality, or type-constraint names
(a change of allowed types alone is not marked). The frontend accepts an op at a since-version
when it has the signature of a version npuc implements.

    .venv/bin/python tools/gen_onnx_since.py
"""

import re
from pathlib import Path

import onnx
from onnx import defs

ROOT = Path(__file__).resolve().parent.parent


def vocabulary() -> list[str]:
    text = (ROOT / "ir" / "src" / "op.rs").read_text()
    return sorted(set(re.findall(r'spec\(ON, "([A-Za-z][A-Za-z0-9]*)"', text)))


def signature(s) -> tuple:
    attrs = tuple(sorted((a.name, a.required, str(a.default_value)) for a in s.attributes.values()))
    params = lambda ps: tuple((p.name, int(p.option), p.type_str) for p in ps)
    return attrs, params(s.inputs), params(s.outputs)


def history(op: str) -> list[tuple[int, bool]]:
    versions, v = [], defs.onnx_opset_version()
    while v > 0:
        try:
            s = defs.get_schema(op, v, "")
        except Exception:
            break
        versions.append(s)
        v = s.since_version - 1
    versions.reverse()
    out = []
    for i, s in enumerate(versions):
        changed = i > 0 and signature(s) != signature(versions[i - 1])
        out.append((s.since_version, changed))
    return out


def main():
    lines = [f"# ai.onnx since-versions from onnx {onnx.__version__} (opsets up to {defs.onnx_opset_version()}),",
             "# `*`: the signature changed there. Written by tools/gen_onnx_since.py."]
    for op in vocabulary():
        if op in ("SimplifiedLayerNormalization",):
            continue
        h = history(op)
        if h:
            lines.append(op + " " + " ".join(f"{v}{'*' if c else ''}" for v, c in h))
    (ROOT / "frontend" / "data" / "onnx_since.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

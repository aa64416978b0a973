#!/usr/bin/env python3
"""A corpus entry with each layer's gated-MLP product rounded to a narrower float.

    .venv/bin/python tools/gate_precision.py fixtures/corpus/smollm2-optimum OUT_DIR \
        --dtype float16|bfloat16
    .venv/bin/python tools/xdna_kl_prompts.py OUT_DIR --cases fixtures/kl_prompts/smollm2-optimum

How many bits does the gate's output need before the down projection quantises it? The first
command copies the entry (config, tokenizer) and writes its `model.onnx` with a Cast to `--dtype`
and back after every `.../mlp/Mul` node (SiLU(gate)·up, the product `npuc::SwiGlu` fuses): float16
keeps 11 significant bits, bfloat16 8. The second measures the xdna program of that file against
the unmodified file's recorded cases (`--cases` of the original entry, so ONNX Runtime's
references stay the float file's). DESIGN.md ("The gate's precision") records the result.
"""

import argparse
import shutil
from pathlib import Path

import onnx
from onnx import TensorProto, helper

DTYPES = {"float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}


def round_gates(model: onnx.ModelProto, dtype: int) -> int:
    """Inserts the Cast pair after every gated-MLP product; returns how many."""
    nodes, count = [], 0
    for n in model.graph.node:
        nodes.append(n)
        if n.op_type == "Mul" and n.name.endswith("/mlp/Mul"):
            out = n.output[0]
            n.output[0] = out + "/unrounded"
            nodes.append(helper.make_node("Cast", [out + "/unrounded"], [out + "/narrow"], to=dtype, name=n.name + "/narrow"))
            nodes.append(helper.make_node("Cast", [out + "/narrow"], [out], to=TensorProto.FLOAT, name=n.name + "/wide"))
            count += 1
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("entry", type=Path, help="a corpus entry folder: model.onnx, config.json, tokenizer.json")
    ap.add_argument("out", type=Path, help="the folder to write")
    ap.add_argument("--dtype", choices=sorted(DTYPES), required=True)
    args = ap.parse_args()
    if not (args.entry / "model.onnx").is_file():
        raise SystemExit(f"{args.entry}: no model.onnx")
    args.out.mkdir(parents=True, exist_ok=True)
    for f in args.entry.iterdir():
        if f.is_file() and f.name != "model.onnx":
            shutil.copy(f, args.out / f.name)
    model = onnx.load(args.entry / "model.onnx")
    count = round_gates(model, DTYPES[args.dtype])
    if count == 0:
        raise SystemExit(f"{args.entry}: no `.../mlp/Mul` gate product found")
    onnx.save(model, args.out / "model.onnx")
    print(f"{count} gate products rounded to {args.dtype}: {args.out / 'model.onnx'}")


if __name__ == "__main__":
    main()

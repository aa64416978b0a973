#!/usr/bin/env python3
"""A corpus entry with each layer's gated-MLP product rounded to a narrower float.

    .venv/bin/python tools/gate_precision.py fixtures/corpus/smollm2-optimum OUT_DIR \
        --dtype float16|bfloat16
    .venv/bin/python tools/xdna_kl_prompts.py OUT_DIR --cases fixtures/kl_prompts/smollm2-optimum

How many bits does the gate's output need before the down projection quantises it? The first
command copies the entry (config, tokenizer) and writes its `model.onnx` with a Cast to `--dtype`
and back after every `.../mlp/Mul` node (SiLU(gate)·up, the product `npuc::SwiGlu` fuses): float16
keeps 11 significant bits, bfloat16 8; `--at inputs` rounds the gate's inputs g and u instead
(the gate and up projections' outputs), `--at both` all three. The second measures the xdna program of that file against
the unmodified file's recorded cases (`--cases` of the original entry, so ONNX Runtime's
references stay the float file's). DESIGN.md ("The gate's precision") records the result.
"""

import argparse
import shutil
from pathlib import Path

import onnx
from onnx import TensorProto, helper

DTYPES = {"float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}


def cast_pair(value: str, dtype: int) -> list:
    """`value` → `value/narrow` → `value/rounded`: the Cast to `dtype` and back."""
    return [
        helper.make_node("Cast", [value], [value + "/narrow"], to=dtype, name=value + "/to_narrow"),
        helper.make_node("Cast", [value + "/narrow"], [value + "/rounded"], to=TensorProto.FLOAT, name=value + "/to_f32"),
    ]


def gate_inputs(graph: onnx.GraphProto) -> set:
    """The gate's and the up projection's outputs: the inputs of each `.../mlp/act_fn/Mul`
    (g, σ(g)) but σ, and the up operand of each `.../mlp/Mul`."""
    values = set()
    for n in graph.node:
        if n.op_type == "Mul" and n.name.endswith("/mlp/act_fn/Mul"):
            values.add(n.input[0])
        elif n.op_type == "Mul" and n.name.endswith("/mlp/Mul"):
            values.add(n.input[1])
    return values


def round_gates(model: onnx.ModelProto, dtype: int, at: str) -> int:
    """Rounds the gated-MLP products (`at` output), their inputs g and u (`inputs`) or both;
    returns how many values."""
    graph = model.graph
    targets = set()
    if at in ("inputs", "both"):
        targets |= gate_inputs(graph)
    if at in ("output", "both"):
        targets |= {n.output[0] for n in graph.node if n.op_type == "Mul" and n.name.endswith("/mlp/Mul")}
    nodes = []
    for n in graph.node:
        for i, v in enumerate(n.input):
            if v in targets:
                n.input[i] = v + "/rounded"
        nodes.append(n)
        nodes += [c for out in n.output if out in targets for c in cast_pair(out, dtype)]
    outputs = {o.name for o in graph.output}
    if targets & outputs:
        raise SystemExit("a gate value is a graph output: not rounding it")
    del graph.node[:]
    graph.node.extend(nodes)
    return len(targets)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("entry", type=Path, help="a corpus entry folder: model.onnx, config.json, tokenizer.json")
    ap.add_argument("out", type=Path, help="the folder to write")
    ap.add_argument("--dtype", choices=sorted(DTYPES), required=True)
    ap.add_argument("--at", choices=["output", "inputs", "both"], default="output",
                    help="round the products (default), their inputs g and u, or both")
    args = ap.parse_args()
    if not (args.entry / "model.onnx").is_file():
        raise SystemExit(f"{args.entry}: no model.onnx")
    args.out.mkdir(parents=True, exist_ok=True)
    for f in args.entry.iterdir():
        if f.is_file() and f.name != "model.onnx":
            shutil.copy(f, args.out / f.name)
    model = onnx.load(args.entry / "model.onnx")
    count = round_gates(model, DTYPES[args.dtype], args.at)
    if count == 0:
        raise SystemExit(f"{args.entry}: no `.../mlp/Mul` gate product found")
    onnx.save(model, args.out / "model.onnx")
    print(f"{count} gate values ({args.at}) rounded to {args.dtype}: {args.out / 'model.onnx'}")


if __name__ == "__main__":
    main()

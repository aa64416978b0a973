"""The attention-internal Q/DQ pairs of a QDQ decoder, found from the graph's structure, and a copy
of the graph with them bypassed: the graph npuc's fused Attention computes (npuc drops those pairs
and keeps every other one; see rewrites/src/attention.rs).

The attention core of a layer is its two products of run-time values: the scores `QK = q·kᵀ` and
the output `PV = p·v`, where `QK`'s result reaches `PV`'s left operand without passing another
MatMul (a projection or the rotary embedding's `inv_freq × positions` has a compile-time operand,
so it is never a core). The pairs bypassed are, per layer:

* the pair nearest to each operand of `QK` and `PV` (looking back through layout-only ops): q and
  kᵀ (scaled, in optimum's SDPA export), the probabilities and v;
* every pair on a path from `QK`'s result to `PV`'s left operand: the scores (and the
  probabilities again).

Not bypassed: the projections' input and output quantisation (npuc's QGemm and its requantising
epilogue), the pair on `PV`'s result (npuc keeps it after the fused Attention), and the rotary
embedding's pairs.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import onnx

LAYOUT_OPS = {"Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten"}
SIZE_OPS = {"Shape", "Size"}


class Graph:
    """Producer and consumer maps of an ONNX graph."""

    def __init__(self, graph: onnx.GraphProto):
        self.graph = graph
        self.producer = {o: n for n in graph.node for o in n.output}
        self.consumers = defaultdict(list)
        for n in graph.node:
            for i in n.input:
                self.consumers[i].append(n)

    def op(self, value: str) -> str | None:
        n = self.producer.get(value)
        return n.op_type if n is not None else None


def runtime_values(g: Graph) -> set[str]:
    """Values computed from the graph inputs' data (a Shape or Size reads only their sizes).
    ONNX lists nodes in topological order."""
    live = {i.name for i in g.graph.input} - {t.name for t in g.graph.initializer}
    for n in g.graph.node:
        if n.op_type not in SIZE_OPS and any(i in live for i in n.input):
            live.update(n.output)
    return live


def attention_cores(g: Graph) -> list[tuple[onnx.NodeProto, onnx.NodeProto]]:
    """(QK, PV) per layer, in graph order: the MatMuls of two run-time operands, QK being the one
    whose result reaches the other's left operand with no MatMul in between."""
    live = runtime_values(g)
    cores = {n.name: n for n in g.graph.node if n.op_type == "MatMul" and all(i in live for i in n.input)}
    couples = []
    for qk in cores.values():
        reached = matmuls_reached(g, qk.output[0])
        pv = [n for n in reached if n.name in cores and reachable(g, qk.output[0], n.input[0])]
        if pv:
            assert len(pv) == 1, f"{qk.name}: scores reach {len(pv)} attention products"
            couples.append((qk, pv[0]))
    paired = sorted(n.name for c in couples for n in c)
    assert paired == sorted(cores), f"products of run-time values {sorted(cores)}, paired {paired}"
    return couples


def matmuls_reached(g: Graph, value: str) -> list[onnx.NodeProto]:
    """The MatMuls the value reaches forward without passing through another MatMul."""
    seen, stack, found = set(), [value], []
    while stack:
        for n in g.consumers[stack.pop()]:
            if n.name in seen:
                continue
            seen.add(n.name)
            if n.op_type == "MatMul":
                found.append(n)
            else:
                stack.extend(n.output)
    return found


def reachable(g: Graph, src: str, dst: str) -> bool:
    return dst in forward_values(g, src)


def forward_values(g: Graph, value: str) -> set[str]:
    """Every value computed from `value`, stopping at MatMuls (their results are not followed)."""
    seen, stack = {value}, [value]
    while stack:
        for n in g.consumers[stack.pop()]:
            if n.op_type == "MatMul":
                continue
            for o in n.output:
                if o not in seen:
                    seen.add(o)
                    stack.append(o)
    return seen


def nearest_pair(g: Graph, value: str) -> onnx.NodeProto | None:
    """The QuantizeLinear of the Q→DQ pair that produces `value`, looking back through
    layout-only ops; None when there is none."""
    while g.op(value) in LAYOUT_OPS:
        value = g.producer[value].input[0]
    if g.op(value) != "DequantizeLinear":
        return None
    q = g.producer.get(g.producer[value].input[0])
    return q if q is not None and q.op_type == "QuantizeLinear" else None


def pairs_between(g: Graph, qk: onnx.NodeProto, pv: onnx.NodeProto) -> list[onnx.NodeProto]:
    """QuantizeLinears on a path from QK's result to PV's left operand whose DQ is on it too."""
    after = forward_values(g, qk.output[0])
    on_path = {v for v in after if reachable(g, v, pv.input[0])}
    qs = [n for v in on_path if (n := g.producer.get(v)) is not None and n.op_type == "QuantizeLinear"]
    return [q for q in qs if any(d.op_type == "DequantizeLinear" and d.output[0] in on_path
                                 for d in g.consumers[q.output[0]])]


def layer_pairs(g: Graph, qk: onnx.NodeProto, pv: onnx.NodeProto) -> list[onnx.NodeProto]:
    """One layer's attention-internal QuantizeLinears, in graph order."""
    near = [nearest_pair(g, v) for v in (*qk.input, *pv.input)]
    chosen = {q.name for q in near if q is not None} | {q.name for q in pairs_between(g, qk, pv)}
    return [n for n in g.graph.node if n.name in chosen]


def bypass(g: Graph, q: onnx.NodeProto):
    """Replaces Q→DQ by a wire from Q's input to every DQ consumer; Q goes too when nothing else
    reads it."""
    outputs = {o.name for o in g.graph.output}
    for dq in [d for d in g.consumers[q.output[0]] if d.op_type == "DequantizeLinear"]:
        assert dq.output[0] not in outputs, f"{dq.name} is a graph output"
        for n in g.consumers[dq.output[0]]:
            wired = [q.input[0] if i == dq.output[0] else i for i in n.input]
            del n.input[:]
            n.input.extend(wired)
        g.graph.node.remove(dq)
    if all(d.op_type == "DequantizeLinear" for d in g.consumers[q.output[0]]):
        g.graph.node.remove(q)


def bypass_attention_pairs(model_path: Path, layers: int) -> tuple[onnx.ModelProto, list[list[str]]]:
    """The model with every layer's attention-internal Q/DQ pairs bypassed, and per layer the
    names of the values those pairs quantised. Every layer must have the same number of pairs."""
    model = onnx.load(str(model_path))
    g = Graph(model.graph)
    couples = attention_cores(g)
    assert len(couples) == layers, f"{len(couples)} attention cores for {layers} layers"
    per_layer = [layer_pairs(g, qk, pv) for qk, pv in couples]
    counts = [len(p) for p in per_layer]
    assert counts[0] > 0 and len(set(counts)) == 1, f"attention Q/DQ pairs per layer: {counts}"
    quantised = [[q.input[0] for q in pairs] for pairs in per_layer]
    for pairs in per_layer:
        for q in pairs:
            bypass(g, q)
    onnx.checker.check_model(model)
    return model, quantised

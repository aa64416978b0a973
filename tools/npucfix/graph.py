"""A small ONNX graph builder on top of onnx.helper.

Node and value names follow the exporter being imitated: the torch exporter
names nodes after the module scope (``/model/layers.0/self_attn/Reshape_1``)
with outputs ``<node>_output_<i>``; onnxruntime-genai uses ``<node>/output_<i>``.
"""

from __future__ import annotations

import contextlib
from collections import Counter

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

FLOAT = TensorProto.FLOAT
INT64 = TensorProto.INT64
INT32 = TensorProto.INT32
BOOL = TensorProto.BOOL

F32_MIN = float(np.finfo(np.float32).min)
INT64_MAX = int(np.iinfo(np.int64).max)


class GraphBuilder:
    def __init__(self, name: str, output_style: str = "torch"):
        assert output_style in ("torch", "genai")
        self.name = name
        self.output_style = output_style
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._init_names: set[str] = set()
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._scopes: list[str] = []
        self._used: Counter = Counter()

    # ---------------------------------------------------------------- naming
    @contextlib.contextmanager
    def scope(self, *parts: str):
        self._scopes.extend(parts)
        try:
            yield
        finally:
            del self._scopes[len(self._scopes) - len(parts):]

    def node_name(self, op_type: str) -> str:
        base = "/" + "/".join(self._scopes + [op_type]) if self._scopes else f"/{op_type}"
        n = self._used[base]
        self._used[base] += 1
        return base if n == 0 else f"{base}_{n}"

    def _out_name(self, node: str, i: int) -> str:
        return f"{node}_output_{i}" if self.output_style == "torch" else f"{node}/output_{i}"

    # ----------------------------------------------------------------- nodes
    def op(self, op_type: str, inputs, outputs=1, domain: str | None = None, name: str | None = None, **attrs):
        """Append a node; returns its output name (or list of names when it has several)."""
        name = name or self.node_name(op_type)
        if isinstance(outputs, int):
            outs = [self._out_name(name, i) for i in range(outputs)]
        else:
            outs = list(outputs)
        node = helper.make_node(op_type, list(inputs), outs, name=name, domain=domain or "", **attrs)
        self.nodes.append(node)
        return outs[0] if len(outs) == 1 else outs

    def constant(self, value, dtype=np.int64) -> str:
        """A Constant node (torch exports emit one per use)."""
        arr = np.asarray(value, dtype=dtype)
        return self.op("Constant", [], value=numpy_helper.from_array(arr, ""))

    def initializer(self, name: str, arr: np.ndarray) -> str:
        if name not in self._init_names:
            self._init_names.add(name)
            self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name

    def const_init(self, value, dtype=np.int64) -> str:
        """A named constant initializer the way onnxruntime-genai spells them."""
        arr = np.asarray(value, dtype=dtype)
        tname = {np.dtype(np.int64): "INT64", np.dtype(np.int32): "INT32", np.dtype(np.float32): "FLOAT"}[arr.dtype]
        if arr.ndim == 0:
            text = repr(arr.item())
        else:
            text = "[" + ", ".join(repr(v) for v in arr.tolist()) + "]"
        return self.initializer(f"/model/constants/{tname}/{text}", arr)

    # ------------------------------------------------------------- graph I/O
    def add_input(self, name: str, elem_type: int, shape) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, shape))
        return name

    def add_output(self, name: str, elem_type: int, shape) -> str:
        self.outputs.append(helper.make_tensor_value_info(name, elem_type, shape))
        return name

    def model(self, opsets: dict[str, int], ir_version: int, producer: str) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.initializers)
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()],
            ir_version=ir_version,
            producer_name=producer,
        )
        return model


# ---------------------------------------------------------------- utilities
def op_histogram(model: onnx.ModelProto) -> dict[str, int]:
    c = Counter(n.op_type if not n.domain or n.domain == "ai.onnx" else f"{n.domain}.{n.op_type}" for n in model.graph.node)
    return dict(sorted(c.items(), key=lambda kv: (-kv[1], kv[0])))


def io_names(model: onnx.ModelProto) -> tuple[list[str], list[str]]:
    inits = {t.name for t in model.graph.initializer}
    ins = [v.name for v in model.graph.input if v.name not in inits]
    outs = [v.name for v in model.graph.output]
    return ins, outs

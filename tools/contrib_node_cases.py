#!/usr/bin/env python3
"""One-node conformance cases for the ops of the onnxruntime-genai builder's hybrid and
mixture-of-experts graphs, with ONNX Runtime's outputs as the expected values.

    .venv/bin/python tools/contrib_node_cases.py [--out fixtures/contrib-node-cases]

Each case is a folder in ONNX's node-test layout: model.onnx (one node; activations are graph
inputs, expert weights initializers) and test_data_set_0/ with input_*.pb and output_*.pb, every
output (recurrent and convolution states too) as ONNX Runtime's CPU provider computes it.

Ops: com.microsoft LinearAttention (the four update rules, grouped and inverse-grouped heads,
per-head and per-key-dimension decay), LinearAttentionGate,
CausalConvWithState (dilation, channels-last), GatedRMSNorm, GatedAdd, MRotaryEmbedding, MoE and
QMoE (int4/int8, per-channel or blocked scales, zero points); ai.onnx opset 27 LinearAttention
and CausalConvWithState. The ai.onnx cases are also run through onnx's Python reference
implementation (`onnx.reference`), and its agreement with ONNX Runtime is written to
reference_agreement.txt. Random data comes from fixed seeds: reruns write the same files.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent
STAMP = ".complete"
VERSION = "3"
MS = "com.microsoft"


class Case:
    """One node: its op, domain, attributes, inputs (None = omitted) and output count."""

    def __init__(self, name, op, domain, inputs, attrs, outputs, initializers=()):
        self.name, self.op, self.domain = name, op, domain
        self.inputs, self.attrs, self.outputs = inputs, attrs, outputs
        self.initializers = set(initializers)

    def model(self) -> onnx.ModelProto:
        names = [f"in{i}" if v is not None else "" for i, v in enumerate(self.inputs)]
        while names and not names[-1]:
            names.pop()
        outs = [f"out{i}" for i in range(self.outputs)]
        node = helper.make_node(self.op, names, outs, name=self.name, domain=self.domain, **self.attrs)
        graph_inputs, inits = [], []
        for i, (n, v) in enumerate(zip(names, self.inputs)):
            if v is None:
                continue
            if i in self.initializers:
                inits.append(numpy_helper.from_array(v, n))
            else:
                dt = helper.np_dtype_to_tensor_dtype(v.dtype)
                graph_inputs.append(helper.make_tensor_value_info(n, dt, list(v.shape)))
        graph_outputs = [helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, None) for o in outs]
        graph = helper.make_graph([node], self.name, graph_inputs, graph_outputs, initializer=inits)
        opsets = [helper.make_opsetid("", 27 if self.domain == "" else 21)]
        if self.domain:
            opsets.append(helper.make_opsetid(self.domain, 1))
        return helper.make_model(graph, opset_imports=opsets, ir_version=11)

    def feeds(self) -> dict:
        return {
            f"in{i}": v for i, v in enumerate(self.inputs) if v is not None and i not in self.initializers
        }


def rng(seed):
    return np.random.default_rng(seed)


def normal(r, shape, scale=1.0):
    return (r.standard_normal(shape) * scale).astype(np.float32)


def l2_rows(x, d):
    shape = x.shape
    h = x.reshape(*shape[:-1], -1, d)
    return (h / np.linalg.norm(h, axis=-1, keepdims=True)).reshape(shape).astype(np.float32)


def linear_attention(name, domain, rule, *, b=1, t=5, hq=4, hkv=2, hk=None, dk=8, dv=6, past=True,
                     per_dim=False, beta_one=False, scale=None, window=0, seed=0):
    """LinearAttention with keys of `hk` heads (default: kv heads, or query heads when those are
    fewer: the builder's Qwen3.5 layout)."""
    r = rng(seed)
    hk = hk or min(hq, hkv) if hq < hkv else hk or hkv
    q = normal(r, (b, t, hq * dk))
    k = l2_rows(normal(r, (b, t, hk * dk)), dk)
    v = normal(r, (b, t, hkv * dv))
    state_shape = (b, hkv, dk, dv) if not window else (window, b, hkv, dk, dv)
    state = normal(r, state_shape, 0.5) if past else None
    gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    decay = (-r.random((b, t, hkv * (dk if per_dim else 1))) * 0.7).astype(np.float32) if gated else None
    beta = r.random((b, t, 1 if beta_one else hkv)).astype(np.float32) if delta else None
    attrs = dict(q_num_heads=hq, kv_num_heads=hkv, update_rule=rule)
    if scale is not None:
        attrs["scale"] = scale
    if window:
        attrs["state_window"] = window
    return Case(name, "LinearAttention", domain, [q, k, v, state, decay, beta], attrs, 2)


def causal_conv(name, domain, *, b=1, c=6, t=5, k=4, past=True, bias=True, activation="silu",
                dilation=1, channels_last=0, window=0, seed=1):
    r = rng(seed)
    state_len = (k - 1) * dilation
    x = normal(r, (b, t, c) if channels_last else (b, c, t))
    w = normal(r, (c, 1, k), 0.5)
    bs = normal(r, (c,), 0.1) if bias else None
    slot = (b, state_len, c) if channels_last else (b, c, state_len)
    state = normal(r, ((window,) + slot) if window else slot) if past else None
    attrs = {"activation": activation}
    if dilation != 1:
        attrs["dilation"] = dilation
    if channels_last:
        attrs["channels_last"] = 1
    if window:
        attrs["state_window"] = window
    return Case(name, "CausalConvWithState", domain, [x, w, bs, state], attrs, 2)


def gate_case(name, *, with_b=True, seed=2):
    r = rng(seed)
    a, b = normal(r, (2, 3, 4)), normal(r, (2, 3, 4))
    dt_bias, scale = normal(r, (4,)), -np.exp(normal(r, (4,), 0.5))
    return Case(name, "LinearAttentionGate", MS, [a, dt_bias, scale, b if with_b else None], {}, 2 if with_b else 1)


def gated_rms_norm(name, activation=None, *, heads=3, c=8, seed=3):
    r = rng(seed)
    x, gate, scale = normal(r, (2, 3, heads * c)), normal(r, (2, 3, heads * c)), normal(r, (c,))
    attrs = {"epsilon": 1e-6}
    if activation:
        attrs["activation"] = activation
    return Case(name, "GatedRMSNorm", MS, [x, scale, gate], attrs, 1)


def gated_add(name, seed=4):
    r = rng(seed)
    x, y, gate = normal(r, (2, 3, 8)), normal(r, (2, 3, 8)), normal(r, (2, 3, 1))
    return Case(name, "GatedAdd", MS, [x, y, gate], {}, 1)


def lp_norm(name, axis, p, seed=4):
    """LpNormalization, the builder's per-head L2 norm of Qwen3.5's queries and keys (opset 22:
    the definition opset 27 models select); one row is zeros."""
    r = rng(seed)
    x = normal(r, (2, 3, 4, 8))
    x[0, 1, 2] = 0.0
    return Case(name, "LpNormalization", "", [x], dict(axis=axis, p=p), 1)


def mrope(name, layout, *, rank=3, heads=2, head=16, rot=0, sections=(3, 2, 3), interleaved=0, seed=7):
    """MRotaryEmbedding with distinct temporal, height and width positions (text tokens have them
    equal; distinct ones show which frequency reads which)."""
    r = rng(seed)
    b, s = 2, 4
    half = (rot or head) // 2
    x = normal(r, (b, heads, s, head) if rank == 4 else (b, s, heads * head))
    ids = r.integers(0, 10, (3, b, s)).astype(np.int64)
    angles = np.arange(10)[:, None] * (1.0 / 10000 ** (np.arange(half) / half))[None, :]
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    attrs = dict(mrope_section=list(sections), mrope_layout=layout, interleaved=interleaved)
    if rank == 3:
        attrs["num_heads"] = heads
    if rot:
        attrs["rotary_embedding_dim"] = rot
    return Case(name, "MRotaryEmbedding", MS, [x, ids, cos, sin], attrs, 1)


def moe_attrs(activation, k, normalize, limit, alpha, beta):
    attrs = dict(k=k, normalize_routing_weights=int(normalize), activation_type=activation,
                 swiglu_fusion=1 if activation == "swiglu" else 0)
    if activation == "swiglu":
        attrs.update(activation_alpha=alpha, activation_beta=beta)
    if limit is not None:
        attrs["swiglu_limit"] = limit
    return attrs


def moe(name, activation, *, k=2, normalize=True, tokens=(1, 5), experts=4, hidden=16, inter=12,
        limit=None, alpha=1.0, beta=0.0, bias=True, seed=5):
    r = rng(seed)
    fuse = 2 if activation == "swiglu" else 1
    x = normal(r, (*tokens, hidden))
    logits = normal(r, (int(np.prod(tokens)), experts))
    w1, w2 = normal(r, (experts, fuse * inter, hidden), 0.3), normal(r, (experts, hidden, inter), 0.3)
    b1 = normal(r, (experts, fuse * inter), 0.1) if bias else None
    b2 = normal(r, (experts, hidden), 0.1) if bias else None
    attrs = moe_attrs(activation, k, normalize, limit, alpha, beta)
    return Case(name, "MoE", MS, [x, logits, w1, b1, w2, b2], attrs, 1, initializers=(2, 3, 4, 5))


def quantized(r, experts, n, k, bits, block, zero_points):
    """Random codes packed along K (low nibble first), scales per row or per block, and packed
    zero points when asked for."""
    blocks = k // block if block else 1
    codes = r.integers(0, 1 << bits, (experts, n, k))
    scales = (r.random((experts, n, blocks)) * 0.04 + 0.01).astype(np.float32)
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)) if bits == 4 else codes
    zp = None
    if zero_points:
        z = r.integers(0, 1 << bits, (experts, n, blocks))
        if not block:
            z = z.reshape(experts, n)
        if bits == 4:
            if z.shape[-1] % 2:
                z = np.concatenate([z, np.zeros((*z.shape[:-1], 1), z.dtype)], -1)
            z = z[..., 0::2] | (z[..., 1::2] << 4)
        zp = z.astype(np.uint8)
    return packed.astype(np.uint8), scales if block else scales[..., 0], zp


def qmoe(name, bits, block, activation="swiglu", *, k=2, normalize=True, zero_points=False, tokens=(1, 5),
         experts=4, hidden=64, inter=32, limit=None, alpha=1.0, beta=0.0, accuracy_level=0, seed=6):
    r = rng(seed)
    fuse = 2 if activation == "swiglu" else 1
    x = normal(r, (*tokens, hidden))
    logits = normal(r, (int(np.prod(tokens)), experts))
    q1, s1, z1 = quantized(r, experts, fuse * inter, hidden, bits, block, zero_points)
    q2, s2, z2 = quantized(r, experts, hidden, inter, bits, block, zero_points)
    b1, b2 = normal(r, (experts, fuse * inter), 0.1), normal(r, (experts, hidden), 0.1)
    attrs = moe_attrs(activation, k, normalize, limit, alpha, beta)
    attrs["expert_weight_bits"] = bits
    if block:
        attrs["block_size"] = block
    if accuracy_level:
        attrs["accuracy_level"] = accuracy_level
    inputs = [x, logits, q1, s1, b1, q2, s2, b2, None, None, None, z1, z2]
    return Case(name, "QMoE", MS, inputs, attrs, 1, initializers=(2, 3, 4, 5, 6, 7, 11, 12))


def cases() -> list[Case]:
    la = [linear_attention(f"la_{rule}_prefill", MS, rule, seed=10 + i)
          for i, rule in enumerate(("linear", "gated", "delta", "gated_delta"))]
    la += [
        linear_attention("la_gated_delta_decode", MS, "gated_delta", t=1, seed=20),
        linear_attention("la_gated_delta_no_past_batch2", MS, "gated_delta", b=2, past=False, scale=0.0, seed=21),
        linear_attention("la_gated_delta_inverse_gqa_prefill", MS, "gated_delta", hq=2, hkv=4, scale=1.0, seed=22),
        linear_attention("la_gated_delta_inverse_gqa_decode", MS, "gated_delta", t=1, hq=2, hkv=4, seed=23),
        linear_attention("la_gated_delta_inverse_full_keys", MS, "gated_delta", hq=2, hkv=4, hk=4, seed=24),
        linear_attention("la_gated_per_key_decay", MS, "gated", per_dim=True, seed=25),
        linear_attention("la_gated_delta_per_key_decay", MS, "gated_delta", per_dim=True, seed=26),
        linear_attention("la_delta_shared_beta", MS, "delta", beta_one=True, seed=27),
        linear_attention("la_gated_delta_long_prefill", MS, "gated_delta", t=70, hq=2, hkv=2, dk=4, dv=4, seed=28),
        linear_attention("la_gated_delta_mha", MS, "gated_delta", hq=3, hkv=3, seed=31),
    ]
    la += [linear_attention(f"onnx_la_{rule}_prefill", "", rule, seed=40 + i)
           for i, rule in enumerate(("linear", "gated", "delta", "gated_delta"))]
    la += [
        linear_attention("onnx_la_gated_delta_decode", "", "gated_delta", t=1, seed=44),
        linear_attention("onnx_la_gated_per_key_decay_no_past", "", "gated", per_dim=True, past=False, seed=45),
        linear_attention("onnx_la_gated_delta_mqa", "", "gated_delta", hq=4, hkv=1, scale=0.25, seed=46),
    ]
    conv = [
        causal_conv("conv_silu_prefill", MS),
        causal_conv("conv_silu_decode", MS, t=1, seed=2),
        causal_conv("conv_none_no_bias_prefill", MS, activation="none", bias=False, seed=3),
        causal_conv("conv_short_input_keeps_past", MS, t=2, seed=4),
        causal_conv("conv_no_past_batch2", MS, b=2, past=False, seed=5),
        causal_conv("conv_dilation2", MS, dilation=2, t=7, seed=6),
        causal_conv("conv_channels_last", MS, channels_last=1, seed=7),
        causal_conv("conv_swish_k3", MS, k=3, activation="swish", seed=10),
        causal_conv("onnx_conv_silu_prefill", "", seed=11),
        causal_conv("onnx_conv_silu_decode", "", t=1, seed=12),
        causal_conv("onnx_conv_none_no_past", "", activation="none", past=False, seed=13),
        causal_conv("onnx_conv_short_input", "", t=2, bias=False, seed=14),
    ]
    small = [
        gate_case("gate_decay_and_beta"),
        gate_case("gate_decay_only", with_b=False, seed=3),
        gated_rms_norm("gated_rms_norm_silu"),
        gated_rms_norm("gated_rms_norm_sigmoid", "sigmoid", seed=4),
        gated_rms_norm("gated_rms_norm_one_group", "swish", heads=1, seed=5),
        gated_add("gated_add"),
        mrope("mrope_sectioned", 0),
        mrope("mrope_interleaved_layout", 1, seed=8),
        mrope("mrope_interleaved_partial_qwen35", 1, head=32, rot=16, sections=(3, 3, 2), seed=9),
        mrope("mrope_bnsh_interleaved_pairs", 0, rank=4, interleaved=1, seed=10),
        lp_norm("onnx_lp_norm_p2_last_axis_zero_row", -1, 2),
        lp_norm("onnx_lp_norm_p1_axis1", 1, 1, seed=5),
    ]
    experts = [
        moe("moe_relu_top2_softmax", "relu", normalize=False),
        moe("moe_relu_top2_renormalised", "relu", seed=6),
        moe("moe_gelu_top1", "gelu", k=1, normalize=False, seed=7),
        moe("moe_silu_top2_2d", "silu", tokens=(5,), seed=8),
        moe("moe_identity_top3_no_bias", "identity", k=3, normalize=False, bias=False, seed=9),
        moe("moe_swiglu_gptoss_prefill", "swiglu", limit=0.8, alpha=1.702, beta=1.0, seed=10),
        moe("moe_swiglu_gptoss_decode", "swiglu", tokens=(1, 1), limit=0.8, alpha=1.702, beta=1.0, seed=11),
        moe("moe_swiglu_qwen_top2_softmax", "swiglu", normalize=False, seed=12),
        qmoe("qmoe_int4_block32", 4, 32),
        qmoe("qmoe_int4_block16_zero_points", 4, 16, zero_points=True, seed=7),
        qmoe("qmoe_int4_per_channel", 4, 0, seed=8),
        qmoe("qmoe_int4_per_channel_zero_points_decode", 4, 0, zero_points=True, tokens=(1, 1), seed=9),
        qmoe("qmoe_int8_block32", 8, 32, seed=10),
        qmoe("qmoe_int8_per_channel_zero_points", 8, 0, zero_points=True, seed=11),
        qmoe("qmoe_int8_block32_zero_points_relu", 8, 32, "relu", zero_points=True, seed=12),
        qmoe("qmoe_int4_top2_unnormalised", 4, 32, normalize=False, seed=13),
        qmoe("qmoe_int4_gptoss_limit", 4, 32, limit=0.8, alpha=1.702, beta=1.0, seed=14),
        qmoe("qmoe_int4_block32_accuracy4", 4, 32, accuracy_level=4, seed=15),
        qmoe("qmoe_int8_silu_top1_2d", 8, 0, "silu", k=1, tokens=(4,), seed=16),
    ]
    return la + conv + small + experts


def write_case(case: Case, out: Path) -> list[np.ndarray]:
    model = case.model()
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    feeds = case.feeds()
    results = session.run(None, feeds)
    # The outputs' declared types are ONNX Runtime's.
    for value, result in zip(model.graph.output, results):
        value.type.tensor_type.elem_type = helper.np_dtype_to_tensor_dtype(result.dtype)
    folder = out / case.name
    data = folder / "test_data_set_0"
    data.mkdir(parents=True, exist_ok=True)
    onnx.save(model, folder / "model.onnx")
    for i, (name, value) in enumerate(feeds.items()):
        (data / f"input_{i}.pb").write_bytes(numpy_helper.from_array(value, name).SerializeToString())
    for i, (value, result) in enumerate(zip(model.graph.output, results)):
        (data / f"output_{i}.pb").write_bytes(numpy_helper.from_array(result, value.name).SerializeToString())
    return results


def reference_agreement(case: Case, expected: list[np.ndarray]) -> str:
    """onnx.reference's outputs against ONNX Runtime's, relative to the largest |expected|."""
    from onnx.reference import ReferenceEvaluator

    try:
        # onnx.reference divides by a zero norm before masking it out.
        with np.errstate(invalid="ignore"):
            got = ReferenceEvaluator(case.model()).run(None, case.feeds())
    except Exception as e:  # noqa: BLE001 - the reason is what the record says
        return f"{case.name}: onnx.reference failed: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
    errors = [
        float(np.abs(g.astype(np.float64) - w).max() / max(np.abs(w).max(), 1e-30)) for g, w in zip(got, expected)
    ]
    return f"{case.name}: max relative error per output {', '.join(f'{e:.2e}' for e in errors)}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "fixtures" / "contrib-node-cases")
    args = ap.parse_args()
    stamp = args.out / STAMP
    if stamp.exists() and stamp.read_text().strip() == f"{VERSION} onnxruntime {ort.__version__}":
        return
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    agreement = []
    all_cases = cases()
    for case in all_cases:
        expected = write_case(case, args.out)
        if case.domain == "":
            agreement.append(reference_agreement(case, expected))
    (args.out / "reference_agreement.txt").write_text("\n".join(agreement) + "\n")
    print(f"contrib_node_cases: {len(all_cases)} cases in {args.out}")
    print("\n".join(agreement))
    stamp.write_text(f"{VERSION} onnxruntime {ort.__version__}\n")


if __name__ == "__main__":
    main()

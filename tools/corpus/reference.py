"""ONNX Runtime's answers for an exported decoder: a prefill case, a decode case, greedy ids.

Feeds follow the graph's own inputs (optimum writes position_ids, the builder does not); past
caches start empty, shaped [batch, kv_heads, 0, head_dim] in the dtype the graph declares. The
hybrid models' recurrent and convolution states (`past.<layer>.<kind>`, fixed sizes but the batch)
start as zeros of the declared shape; every `past*` input takes the `present*` output of the same
name from the step before. Qwen3.5's position_ids are [3, batch, sequence] (MRoPE's temporal,
height and width positions, all the text position).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import numpy_helper

ORT_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


def session(model: Path | bytes) -> ort.InferenceSession:
    """A one-thread CPU session on a model file, or on a serialized model (weights inline)."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    source = model if isinstance(model, bytes) else str(model)
    return ort.InferenceSession(source, so, providers=["CPUExecutionProvider"])


class Decoder:
    """One exported graph run step by step in ONNX Runtime with its KV cache."""

    def __init__(self, model: Path | bytes, kv_heads: int, head_dim: int):
        self.sess = session(model)
        self.inputs = [i.name for i in self.sess.get_inputs()]
        self.outputs = [o.name for o in self.sess.get_outputs()]
        self.kv_heads, self.head_dim = kv_heads, head_dim
        self.cache_dtype = {i.name: ORT_DTYPES[i.type] for i in self.sess.get_inputs() if i.name.startswith("past")}
        self.shapes = {i.name: i.shape for i in self.sess.get_inputs()}

    def feeds(self, ids: list[int], past: dict | None, past_len: int, extra: dict | None = None) -> dict:
        """The inputs of one step; `extra` holds inputs a decoder step does not make (the MTP
        head's `hidden_states`)."""
        n = len(ids)
        f = {}
        for name in self.inputs:
            if extra and name in extra:
                f[name] = extra[name]
            elif name == "input_ids":
                f[name] = np.asarray([ids], dtype=np.int64)
            elif name == "attention_mask":
                f[name] = np.ones((1, past_len + n), dtype=np.int64)
            elif name == "position_ids":
                positions = np.arange(past_len, past_len + n, dtype=np.int64)[None, :]
                f[name] = np.broadcast_to(positions, (3, 1, n)).copy() if len(self.shapes[name]) == 3 else positions
            elif name.startswith("past"):
                f[name] = self.initial_state(name) if past is None else past[present_name(name)]
            else:
                raise ValueError(f"graph input `{name}` is not one a decoder step feeds")
        return f

    def initial_state(self, name: str) -> np.ndarray:
        """An empty KV cache, or a zero state of the declared shape (batch 1): every other dim of
        a state input must be a number."""
        if name.startswith("past_key_values."):
            return np.zeros((1, self.kv_heads, 0, self.head_dim), dtype=self.cache_dtype[name])
        shape = self.shapes[name]
        if not all(isinstance(d, int) for d in shape[1:]):
            raise ValueError(f"state input `{name}` has a symbolic size past the batch: {shape}")
        return np.zeros((1, *shape[1:]), dtype=self.cache_dtype[name])

    def step(self, ids: list[int], past: dict | None, past_len: int, extra: dict | None = None) -> tuple[dict, dict]:
        feeds = self.feeds(ids, past, past_len, extra)
        outs = dict(zip(self.outputs, self.sess.run(self.outputs, feeds)))
        return feeds, outs

    def greedy(self, prompt: list[int], steps: int) -> tuple[list[int], list[float]]:
        """Greedy ids, and at each step the gap between the best and second-best logit as a
        fraction of max|logit| (a small gap is a near tie that f32 rounding can decide)."""
        _, outs = self.step(prompt, None, 0)
        ids, margins, length = [], [], len(prompt)
        for _ in range(steps):
            row = outs["logits"][0, -1].astype(np.float64)
            top2 = np.sort(row)[-2:]
            margins.append(float((top2[1] - top2[0]) / np.abs(row).max()))
            nxt = int(np.argmax(row))
            ids.append(nxt)
            _, outs = self.step([nxt], outs, length)
            length += 1
        return ids, margins


def present_name(past: str) -> str:
    """The output that carries input `past` to the next step: `past_key_values.0.key` ->
    `present.0.key`, `past.0.conv` -> `present.0.conv`."""
    for prefix in ("past_key_values.", "past."):
        if past.startswith(prefix):
            return "present." + past[len(prefix):]
    raise ValueError(f"`{past}` is not a cache or state input")


def write_case(case_dir: Path, dec: Decoder, feeds: dict, outs: dict):
    case_dir.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(dec.inputs):
        write_tensor(case_dir / f"input_{i}.pb", feeds[name], name)
    for j, name in enumerate(dec.outputs):
        write_tensor(case_dir / f"output_{j}.pb", outs[name], name)


def write_tensor(path: Path, arr: np.ndarray, name: str):
    path.write_bytes(numpy_helper.from_array(np.ascontiguousarray(arr), name).SerializeToString())


def record(model: Path | bytes, out: Path, kv_heads: int, head_dim: int, prompts: list[list[int]],
           decode_id: int, greedy_steps: int, suffix: str = "") -> dict:
    """Writes the prefill and decode cases (of the first prompt) into `out/prefill<suffix>` and
    `out/decode<suffix>`; returns what the index keeps: per prompt, its ids and ONNX Runtime's
    greedy ids with their top-2 gaps. `model` is a file or a serialized model."""
    dec = Decoder(model, kv_heads, head_dim)
    pre_feeds, pre_outs = dec.step(prompts[0], None, 0)
    write_case(out / f"prefill{suffix}", dec, pre_feeds, pre_outs)
    dec_feeds, dec_outs = dec.step([decode_id], pre_outs, len(prompts[0]))
    write_case(out / f"decode{suffix}", dec, dec_feeds, dec_outs)
    logits = pre_outs["logits"]
    if not np.isfinite(logits).all() or float(logits.std(axis=-1).min()) < 1e-3:
        raise AssertionError(f"{out}{suffix}: degenerate logits")
    cases = []
    for prompt in prompts:
        greedy_ids, margins = dec.greedy(prompt, greedy_steps)
        cases.append({"prompt_ids": prompt, "greedy_ids": greedy_ids,
                      "greedy_margins": [round(m, 6) for m in margins]})
    return {
        "inputs": dec.inputs,
        "outputs": dec.outputs,
        "decode_id": decode_id,
        "cases": cases,
        "max_abs_logit": float(np.abs(logits).max()),
    }


def record_mtp(model: Path, mtp: Path, out: Path, kv_heads: int, head_dim: int, prompt: list[int],
               steps: int) -> dict:
    """The MTP head (`mtp`, the builder's mtp.onnx) beside its decoder (`model`), as a drafter runs
    it: row t takes the decoder's final hidden state at position t (its `hidden_states` output,
    after the final norm) and the token at t + 1, at position t, and its logits draft the token at
    t + 2. The `mtp/` case is the prompt's rows: `prompt[1:]` and the decoder's first greedy id
    over the prefill's hidden states; `mtp_decode/` the next row, over the head's own KV cache.
    Then greedy decoding of the decoder with the head drafting beside it: draft i is the head's
    argmax for greedy id i + 2 (the first greedy id is the prefill's, which the head takes as
    input), so `steps` greedy ids give steps - 1 drafts."""
    main, head = Decoder(model, kv_heads, head_dim), Decoder(mtp, kv_heads, head_dim)
    _, outs = main.step(prompt, None, 0)
    greedy = [int(np.argmax(outs["logits"][0, -1]))]
    feeds, drafted = head.step(prompt[1:] + greedy, None, 0, {"hidden_states": outs["hidden_states"]})
    write_case(out / "mtp", head, feeds, drafted)
    drafts, length, head_length = [], len(prompt), len(prompt)
    while len(greedy) < steps:
        drafts.append(int(np.argmax(drafted["logits"][0, -1])))
        _, outs = main.step(greedy[-1:], outs, length)
        greedy.append(int(np.argmax(outs["logits"][0, -1])))
        length += 1
        feeds, drafted = head.step(greedy[-1:], drafted, head_length, {"hidden_states": outs["hidden_states"]})
        if head_length == len(prompt):
            write_case(out / "mtp_decode", head, feeds, drafted)
        head_length += 1
    equal = sum(d == g for d, g in zip(drafts, greedy[1:]))
    return {"inputs": head.inputs, "outputs": head.outputs, "cases": ["mtp", "mtp_decode"],
            "greedy_ids": greedy, "drafts": drafts, "drafts_equal": equal}


def record_matmulnbits(model: Path, out: Path, rows: int = 4, seed: int = 5) -> list[dict]:
    """Each distinct MatMulNBits configuration of `model` (K, N, bits, block, zero points,
    accuracy level) as a one-node graph over the node's own weights, run by ONNX Runtime on random
    activations: `out/<i>/model.onnx` with `case/input_0.pb` and `case/output_0.pb`. At
    `accuracy_level` 4 a whole model's result moves with every f32 rounding that flips an int8
    activation code, so these cases are where the level's semantics is compared exactly."""
    import onnx
    from onnx import helper

    m = onnx.load(str(model))
    inits = {t.name: t for t in m.graph.initializer}
    rng = np.random.default_rng(seed)
    seen, written = set(), []
    for n in m.graph.node:
        if n.op_type != "MatMulNBits":
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        ins = list(n.input)
        key = (tuple(sorted(attrs.items())), len([i for i in ins if i]))
        if key in seen:
            continue
        seen.add(key)
        k, nn = attrs["K"], attrs["N"]
        a = (rng.standard_normal((rows, k)) * 2).astype(np.float32)
        node = helper.make_node("MatMulNBits", ["A"] + ins[1:], ["Y"], domain="com.microsoft", **attrs)
        weights = [inits[i] for i in ins[1:] if i]
        graph = helper.make_graph([node], "matmulnbits", [helper.make_tensor_value_info("A", 1, [rows, k])],
                                  [helper.make_tensor_value_info("Y", 1, [rows, nn])], weights)
        one = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
        one.ir_version = m.ir_version
        d = out / str(len(written))
        (d / "case").mkdir(parents=True, exist_ok=True)
        onnx.save(one, str(d / "model.onnx"))
        y = session(d / "model.onnx").run(["Y"], {"A": a})[0]
        write_tensor(d / "case" / "input_0.pb", a, "A")
        write_tensor(d / "case" / "output_0.pb", y, "Y")
        written.append({"node": n.name, "dir": f"{out.name}/{len(written)}", **{k: v for k, v in attrs.items()}})
    return written

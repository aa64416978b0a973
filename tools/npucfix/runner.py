"""Running graphs in ONNX Runtime and writing fixture directories."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from .config import DecoderConfig

STAMP = ".stamp"


# ------------------------------------------------------------------ ORT
def session(model: onnx.ModelProto | str | os.PathLike, threads: int = 1) -> ort.InferenceSession:
    """CPU session that runs the graph as written (no graph optimisations)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    src = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


def io_of(sess: ort.InferenceSession) -> tuple[list[str], list[str]]:
    return [i.name for i in sess.get_inputs()], [o.name for o in sess.get_outputs()]


def make_feeds(cfg: DecoderConfig, in_names, input_ids, past=None, past_len=0):
    """Feeds for one step: attention mask all ones over past+new, positions continue the past."""
    b, s = input_ids.shape
    feeds = {}
    for name in in_names:
        if name == "input_ids":
            feeds[name] = input_ids.astype(np.int64)
        elif name == "attention_mask":
            feeds[name] = np.ones((b, past_len + s), dtype=np.int64)
        elif name == "position_ids":
            feeds[name] = np.tile(np.arange(past_len, past_len + s, dtype=np.int64), (b, 1))
        elif name.startswith("past_key_values."):
            _, layer, kind = name.split(".")
            if past is None:
                feeds[name] = np.zeros((b, cfg.kv_heads, 0, cfg.head_dim), dtype=np.float32)
            else:
                feeds[name] = past[f"present.{layer}.{kind}"]
        else:
            raise ValueError(f"unexpected graph input {name}")
    return feeds


def run(sess: ort.InferenceSession, feeds: dict) -> dict[str, np.ndarray]:
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def prefill_decode(cfg: DecoderConfig, sess, prompt_ids, decode_id):
    """The two standard cases: prefill of prompt_ids, then one decode step on its cache."""
    in_names, _ = io_of(sess)
    ids = np.asarray(prompt_ids, dtype=np.int64)[None, :]
    pre_in = make_feeds(cfg, in_names, ids)
    pre_out = run(sess, pre_in)
    dec_in = make_feeds(cfg, in_names, np.array([[decode_id]], dtype=np.int64), pre_out, ids.shape[1])
    dec_out = run(sess, dec_in)
    return {"prefill": (pre_in, pre_out), "decode": (dec_in, dec_out)}


def reference_cases(cfg, weights, cases, forward):
    """Run the numpy reference on the same feeds; returns {case: (logits, presents-dict)}."""
    out = {}
    for case, (feeds, _) in cases.items():
        ids = feeds["input_ids"]
        mask = feeds["attention_mask"]
        p = mask.shape[1] - ids.shape[1]
        pos = feeds.get("position_ids", np.tile(np.arange(p, p + ids.shape[1]), (ids.shape[0], 1)))
        past = [(feeds[f"past_key_values.{i}.key"], feeds[f"past_key_values.{i}.value"]) for i in range(cfg.layers)]
        logits, presents = forward(cfg, weights, ids, mask, pos, past)
        pres = {}
        for i, (k, v) in enumerate(presents):
            pres[f"present.{i}.key"] = k
            pres[f"present.{i}.value"] = v
        out[case] = (logits, pres)
    return out


def compare(cases, ref, rel_err) -> dict[str, float]:
    """Max relative error (max|a-b|/max|b|) of logits and of all presents, per case."""
    res = {}
    for case, (_, outs) in cases.items():
        logits, pres = ref[case]
        res[f"{case}.logits"] = rel_err(outs["logits"], logits)
        res[f"{case}.present"] = max(rel_err(outs[k], v) for k, v in pres.items())
    return res


def check_logits(outs: dict, what: str):
    logits = outs["logits"]
    if not np.isfinite(logits).all():
        raise AssertionError(f"{what}: non-finite logits")
    spread = float(logits.std(axis=-1).min())
    if spread < 1e-3:
        raise AssertionError(f"{what}: degenerate logits (std {spread})")
    return spread


# --------------------------------------------------------------- writing
def write_tensor(path: Path, arr: np.ndarray, name: str):
    t = numpy_helper.from_array(np.ascontiguousarray(arr), name)
    path.write_bytes(t.SerializeToString())


def write_cases(fixture_dir: Path, in_names, out_names, cases: dict):
    for case, (feeds, outs) in cases.items():
        d = fixture_dir / case
        d.mkdir(parents=True, exist_ok=True)
        for i, name in enumerate(in_names):
            write_tensor(d / f"input_{i}.pb", feeds[name], name)
        for j, name in enumerate(out_names):
            write_tensor(d / f"output_{j}.pb", outs[name], name)


def write_json(path: Path, obj):
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def save_model(model: onnx.ModelProto, path: Path, external: bool = False):
    path.parent.mkdir(parents=True, exist_ok=True)
    if external:
        data = path.with_name(path.name + ".data")
        if data.exists():
            data.unlink()
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data.name, size_threshold=1024, convert_attribute=False)
        data.chmod(0o644)
    else:
        onnx.save_model(model, str(path))


# ---------------------------------------------------------------- stamps
def file_digest(paths, extra: str = "") -> str:
    h = hashlib.sha256()
    for p in sorted(str(p) for p in paths):
        h.update(Path(p).name.encode())
        h.update(Path(p).read_bytes())
    h.update(extra.encode())
    h.update(f"onnx={onnx.__version__};ort={ort.__version__};numpy={np.__version__}".encode())
    return h.hexdigest()


def is_fresh(fixture_dir: Path, digest: str) -> bool:
    stamp = fixture_dir / STAMP
    if not stamp.exists():
        return False
    try:
        info = json.loads(stamp.read_text())
    except ValueError:
        return False
    if info.get("digest") != digest:
        return False
    return all((fixture_dir / f).exists() for f in info.get("files", []))


def write_stamp(fixture_dir: Path, digest: str):
    files = sorted(str(p.relative_to(fixture_dir)) for p in fixture_dir.rglob("*") if p.is_file() and p.name != STAMP)
    write_json(fixture_dir / STAMP, {"digest": digest, "files": files})


def fresh_dir(fixture_dir: Path):
    if fixture_dir.exists():
        shutil.rmtree(fixture_dir)
    fixture_dir.mkdir(parents=True)


# ----------------------------------------------------- extra verification
def extra_checks(cfg: DecoderConfig, sess, weights, forward, rel_err, prompt_ids, padded: bool) -> dict[str, float]:
    """Steps that are checked against the reference but not written as cases.

    chunk: three new tokens on top of the prefill cache (causal mask with an offset).
    padded: batch of two, the first left-padded by two (padding mask, custom positions);
            only unpadded positions are compared.
    """
    in_names, _ = io_of(sess)
    res = {}
    ids = np.asarray(prompt_ids, dtype=np.int64)[None, :]
    pre_out = run(sess, make_feeds(cfg, in_names, ids))
    chunk = (ids[:, :3] * 7 + 11) % cfg.vocab
    ch_in = make_feeds(cfg, in_names, chunk, pre_out, ids.shape[1])
    ch_out = run(sess, ch_in)
    ref = reference_cases(cfg, weights, {"chunk": (ch_in, ch_out)}, forward)
    res.update(compare({"chunk": (ch_in, ch_out)}, ref, rel_err))
    if padded:
        n = ids.shape[1]
        ids2 = np.concatenate([ids, (ids[:, ::-1] * 3 + 5) % cfg.vocab], axis=0)
        feeds = make_feeds(cfg, in_names, ids2)
        mask = np.ones((2, n), dtype=np.int64)
        mask[0, :2] = 0
        feeds["attention_mask"] = mask
        if "position_ids" in feeds:
            feeds["position_ids"] = np.clip(np.cumsum(mask, axis=-1) - 1, 0, None).astype(np.int64)
        out = run(sess, feeds)
        pos = feeds.get("position_ids")
        logits, presents = forward(cfg, weights, ids2, mask, pos,
                                   [(feeds[f"past_key_values.{i}.key"], feeds[f"past_key_values.{i}.value"])
                                    for i in range(cfg.layers)])
        valid = mask.astype(bool)
        res["padded.logits"] = rel_err(out["logits"][valid], logits[valid])
        worst = 0.0
        for i, (k, v) in enumerate(presents):
            for name, r in ((f"present.{i}.key", k), (f"present.{i}.value", v)):
                a = out[name].transpose(0, 2, 1, 3)[valid]
                worst = max(worst, rel_err(a, r.transpose(0, 2, 1, 3)[valid]))
        res["padded.present"] = worst
    return res

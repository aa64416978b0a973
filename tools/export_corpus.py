#!/usr/bin/env python3
"""Make the exporter corpus: tiny random-weight decoders exported by the real tools, with ONNX
Runtime's references.

    .venv-export/bin/python tools/export_corpus.py [--out fixtures/corpus] [--only NAME ...] [--force]
        [--smollm2-gguf fixtures/cache/SmolLM2-135M-Instruct.Q4_1.gguf] [--jobs 2]
    .venv-export/bin/python tools/export_corpus.py --bench [--out fixtures/bench] [--only NAME ...]
        [--no-reference]
    .venv-export/bin/python tools/export_corpus.py --hybrid [--out fixtures/hybrid] [--only NAME ...]

For each architecture in corpus/models.py, a Hugging Face model folder (<out>/<arch>-hf/) made
with transformers' own classes, then one folder per exporter (<out>/<arch>-<exporter>/) with the
file the exporter wrote, untouched, `prefill/` and `decode/` cases (input_<i>.pb, output_<j>.pb as
in fixtures/README), and `provenance.json` (exporter, versions, command). QDQ entries also get
`prefill_bypassed/`, `decode_bypassed/` and `cases_bypassed`: ONNX Runtime on the same file with
the attention-internal Q/DQ pairs bypassed (corpus/qdq_bypass.py). With --smollm2-gguf,
SmolLM2-135M too, its real weights loaded by transformers' GGUF loader, through optimum and the
builder's fp32 and int4, greedy over three prompts. <out>/index.json lists every entry with its
greedy ids, or the reason the exporter could not make it. An entry whose provenance digest
matches the tools' sources is kept as it is. --jobs architectures are exported at once (each
architecture's exporters in order: the QDQ entries read its optimum export).

--bench exports the bench-only architectures instead (corpus/models.py BENCH_ARCHS: a
Qwen3-0.6B-shaped model with random weights; BENCH_HYBRID_ARCHS: a Qwen3.5-MoE-shaped one, its
folder made as the hybrid corpus's) with BENCH_EXPORTERS, into fixtures/bench/ with an index of its
own, so the corpus the tests read never holds them. Their references are ONNX Runtime's greedy ids
for one prompt and the prefill/decode cases (no MatMulNBits cases: the matrices would be copied once
more; the hybrid ones also list their state inputs and contrib ops' signatures, not transformers'
greedy ids); --no-reference skips even those. Hybrid bench entries record `parameters`: the
decoder's total and the active per token (routed experts at top-k of all).

--hybrid exports the recurrent and mixture-of-experts architectures (corpus/models.py
HYBRID_ARCHS: Qwen3.5 and Qwen3.5-MoE with Gated DeltaNet layers, LFM2 and LFM2-MoE with short
convolutions, gpt-oss) through the builder's fp32 and int4 (HYBRID_EXPORTERS) into
fixtures/hybrid/ with an index of its own, so the corpus test, which compiles every entry, never
reads them. Their folders are made under the builder's transformers (corpus/hybrid_hf.py). Cases
and greedy ids as the corpus's, the recurrent and conv states (`past.<layer>.<kind>`) starting at
zero; each entry also lists its state inputs, its contrib ops' signatures and, for fp32,
transformers' own greedy ids on the same folder and whether ONNX Runtime's equal them. Where the
checkpoint has an MTP head (Qwen3.5's), the builder writes mtp.onnx too: its cases go to `mtp/`
and `mtp_decode/`, its signature and drafts to the entry's `mtp`.
"""

from __future__ import annotations

import argparse
from concurrent.futures import ThreadPoolExecutor
import hashlib
import json
import shutil
import sys
import threading
import time
import traceback
from importlib import metadata
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS))

from corpus import exporters, models, qdq_bypass, reference  # noqa: E402

PROMPT = [1, 17, 250, 33, 402, 98, 5, 311]
# Plain text, tokenised as transformers does by default (with the special tokens the tokenizer
# adds: SmolLM2's GGUF tokenizer prepends <|im_start|>), and a chat turn rendered by the
# tokenizer's own template (with the system prompt it adds), as `npuc run [--chat]` does.
SMOLLM2_PROMPTS = [{"text": "The capital of France is"}, {"text": "Once upon a time, there was a little robot who"},
                   {"messages": [{"role": "user", "content": "What is the capital of France?"}]}]
SMOLLM2_EXPORTERS = ["optimum", "builder-fp32", "builder-int4", "builder-int4-acc1"]
DECODE_ID = 77
# Bench entries: one prompt, the ids `npuc run --prompt-ids 1,2,3` takes.
BENCH_PROMPT = [1, 2, 3]
BENCH_EXPORTERS = ["builder-int4", "builder-fp32"]
GREEDY_STEPS = 16
HYBRID_EXPORTERS = ["builder-fp32", "builder-int4"]
# The contrib ops whose node signatures the hybrid index records (the evaluator's contract).
HYBRID_OPS = ("LinearAttention", "LinearAttentionGate", "CausalConvWithState", "GatedRMSNorm", "GatedAdd",
              "MRotaryEmbedding", "GroupQueryAttention", "MoE", "QMoE")
PACKAGES = ["torch", "transformers", "optimum-onnx", "onnxruntime", "onnxruntime-genai", "onnx"]

# exporter name -> how to make it from the HF folder (and the optimum export, for QDQ).
EXPORTERS = {
    "optimum": lambda hf, out, ctx: exporters.optimum(hf, out),
    "torch-dynamo": lambda hf, out, ctx: exporters.dynamo(hf, out),
    # opset 23: the exporter writes RMSNormalization, RotaryEmbedding and Attention.
    "torch-dynamo-opset23": lambda hf, out, ctx: exporters.dynamo(hf, out, opset23=True),
    "builder-fp32": lambda hf, out, ctx: exporters.builder(hf, out, "fp32", ctx.get("builder_options", {})),
    "builder-int4": lambda hf, out, ctx: exporters.builder(hf, out, "int4", ctx.get("builder_options", {})),
    "builder-int4-b128-asym": lambda hf, out, ctx: exporters.builder(
        hf, out, "int4", {"block_size": "128", "is_symmetric": "false", "accuracy_level": "4",
                          "shared_embeddings": "false"}),
    # accuracy_level 1: float activations, so the whole model is comparable token for token.
    "builder-int4-acc1": lambda hf, out, ctx: exporters.builder(hf, out, "int4", {"accuracy_level": "1"}),
    "qdq-per-channel-u8": lambda hf, out, ctx: exporters.quantize_qdq(
        ctx["optimum"], out, ctx["calibration"], per_channel=True, symmetric_activations=False),
    "qdq-per-tensor-s8": lambda hf, out, ctx: exporters.quantize_qdq(
        ctx["optimum"], out, ctx["calibration"], per_channel=False, symmetric_activations=True),
    "quark-a8w8": lambda hf, out, ctx: exporters.quark(ctx["optimum"], out, ctx["calibration"]),
}


def sources_digest() -> str:
    h = hashlib.sha256()
    files = [TOOLS / f for f in ("export_corpus.py", "requirements-exporters.txt", "requirements-builder.txt",
                                 "requirements-quark.txt")]
    files += sorted((TOOLS / "corpus").glob("*.py"))
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def versions(exporter: str) -> dict:
    v = {}
    for p in PACKAGES:
        try:
            v[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            v[p] = None
    v["transformers (builder)"] = overlay_version(exporters.BUILDER_OVERLAY, "transformers")
    if exporter.startswith("quark"):
        v["amd-quark"] = overlay_version(exporters.QUARK_OVERLAY, "amd_quark")
        v["onnx (quark)"] = overlay_version(exporters.QUARK_OVERLAY, "onnx")
    return v


def overlay_version(overlay: Path, dist: str) -> str | None:
    """The version of `dist` installed in an overlay (--target folder), from its dist-info name."""
    info = next(overlay.glob(f"{dist}-*.dist-info"), None)
    return info.name[len(dist) + 1:-len(".dist-info")] if info else None


def calibration_feeds(optimum_model: Path, config: dict) -> list[dict]:
    import numpy as np

    layers, kv_heads, head_dim = models.dims(config)
    dec = reference.Decoder(optimum_model, kv_heads, head_dim)
    rng = np.random.default_rng(7)
    return [dec.feeds([int(t) for t in rng.integers(3, models.VOCAB, size=12)], None, 0) for _ in range(8)]


def make_entry(arch: models.Arch, exporter: str, out: Path, ctx: dict, digest: str) -> dict:
    entry_dir = out / f"{arch.name}-{exporter}"
    prov_path = entry_dir / "provenance.json"
    if prov_path.exists():
        prov = json.loads(prov_path.read_text())
        if prov.get("digest") == digest and (entry_dir / "model.onnx").exists():
            return prov
    if entry_dir.exists():
        shutil.rmtree(entry_dir)
    t0 = time.time()
    entry = {"name": entry_dir.name, "arch": arch.name, "exporter": exporter, "digest": digest}
    try:
        entry["command"] = EXPORTERS[exporter](ctx["hf"], entry_dir, ctx)
    except Exception as e:  # an exporter that refuses an architecture is a corpus fact, not a crash
        entry["refused"] = str(e).strip().splitlines()[-1][:400]
        entry_dir.mkdir(parents=True, exist_ok=True)
        prov_path.write_text(json.dumps(entry, indent=2) + "\n")
        return entry
    layers, kv_heads, head_dim = models.dims(ctx["config"])
    entry.update({"layers": layers, "kv_heads": kv_heads, "head_dim": head_dim, "versions": versions(exporter)})
    if ctx.get("references", True):
        entry.update(reference.record(entry_dir / "model.onnx", entry_dir, kv_heads, head_dim, ctx["prompts"],
                                      DECODE_ID, GREEDY_STEPS))
        for case, source in zip(entry["cases"], ctx.get("prompt_sources", [])):
            case.update(source)
    entry["op_histogram"] = op_histogram(entry_dir / "model.onnx")
    if exporter.startswith(("qdq", "quark")):
        entry.update(bypassed_references(entry_dir, layers, kv_heads, head_dim, ctx["prompts"]))
    if exporter.startswith("builder-int4") and not ctx.get("bench"):
        entry["matmulnbits_cases"] = reference.record_matmulnbits(entry_dir / "model.onnx", entry_dir / "matmulnbits")
    if ctx.get("hybrid"):
        entry.update(hybrid_facts(entry_dir, entry, ctx))
    entry["seconds"] = round(time.time() - t0, 1)
    prov_path.write_text(json.dumps(entry, indent=2) + "\n")
    return entry


def op_histogram(model: Path) -> dict:
    """Node count per `domain::op` of the file as the exporter wrote it (`ai.onnx` for the default
    domain), for the tests to compare what npuc reads with what onnx reads."""
    import onnx

    counts: dict[str, int] = {}
    for node in onnx.load(str(model), load_external_data=False).graph.node:
        key = f"{node.domain or 'ai.onnx'}::{node.op_type}"
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


def hybrid_facts(entry_dir: Path, entry: dict, ctx: dict) -> dict:
    """What a hybrid entry adds: its state inputs, its contrib ops' signatures, the MTP graph the
    builder writes beside some (kept untouched) with ONNX Runtime's references for it, and for fp32
    transformers' greedy ids."""
    facts = {"state_inputs": state_inputs(entry_dir / "model.onnx"),
             "contrib_signatures": contrib_signatures(entry_dir / "model.onnx")}
    extra = sorted(p.name for p in entry_dir.glob("*.onnx") if p.name != "model.onnx")
    if extra:
        facts["other_graphs"] = extra
    if (entry_dir / "mtp.onnx").exists():
        facts["mtp"] = mtp_facts(entry_dir, entry)
    if ctx.get("bench"):
        facts["parameters"] = parameter_counts(ctx["hf"])
    elif entry_dir.name.endswith("-fp32"):
        facts["transformers"] = transformers_agreement(entry_dir, entry["cases"][0]["greedy_ids"], ctx)
    return facts


def parameter_counts(hf: Path) -> dict:
    """The decoder's parameters in the checkpoint (the vision tower and any MTP head left out: the
    builder exports neither into model.onnx): all of them, the routed experts' (`mlp.experts.*`,
    the shared expert not among them), and those one token computes with, the routed experts at
    num_experts_per_tok of num_experts; the embedding counted once (a token reads one row of it,
    `active_without_embedding` leaves it out)."""
    import numpy as np
    from safetensors import safe_open

    text = json.loads((hf / "config.json").read_text()).get("text_config")
    total = experts = embedding = 0
    with safe_open(str(hf / "model.safetensors"), "np") as f:
        for name in f.keys():
            if ".visual." in f".{name}" or name.startswith("mtp."):
                continue
            n = int(np.prod(f.get_slice(name).get_shape(), dtype=np.int64))
            total += n
            experts += n if ".mlp.experts." in name else 0
            embedding += n if name.endswith("embed_tokens.weight") else 0
    active = total - experts + experts * text["num_experts_per_tok"] // text["num_experts"]
    return {"total": total, "routed_experts": experts, "active_per_token": active,
            "active_without_embedding": active - embedding, "embedding": embedding}


def mtp_facts(entry_dir: Path, entry: dict) -> dict:
    """The MTP head the builder writes as mtp.onnx when the checkpoint has `mtp.*` weights (its
    embedding and lm_head shared with model.onnx.data): its signature, the `mtp` section the
    builder adds to genai_config.json, its contrib ops' signatures, ONNX Runtime's `mtp/` and
    `mtp_decode/` cases and how often its greedy drafts equal the decoder's next greedy id
    (corpus/reference.py record_mtp; low for random weights, recorded as it is)."""
    case = entry["cases"][0]
    ref = reference.record_mtp(entry_dir / "model.onnx", entry_dir / "mtp.onnx", entry_dir, entry["kv_heads"],
                               entry["head_dim"], case["prompt_ids"], GREEDY_STEPS)
    if ref["greedy_ids"] != case["greedy_ids"]:
        raise AssertionError(f"{entry_dir.name}: greedy ids beside the MTP head differ from the plain run's")
    genai = json.loads((entry_dir / "genai_config.json").read_text())["model"]
    return {"graph": "mtp.onnx", "signature": graph_signature(entry_dir / "mtp.onnx"),
            "contrib_signatures": contrib_signatures(entry_dir / "mtp.onnx"), "genai_config": genai["mtp"],
            "decoder_outputs": genai["decoder"].get("outputs", {}), "inputs": ref["inputs"],
            "outputs": ref["outputs"], "cases": ref["cases"], "drafts": ref["drafts"],
            "drafts_equal": ref["drafts_equal"], "op_histogram": op_histogram(entry_dir / "mtp.onnx")}


def graph_signature(model: Path) -> dict:
    """Every input and output with its declared shape (symbols as names) and element type."""
    import onnx

    graph = onnx.load(str(model), load_external_data=False).graph
    value = lambda v: {"shape": [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim],
                       "dtype": onnx.TensorProto.DataType.Name(v.type.tensor_type.elem_type).lower()}
    return {"inputs": {i.name: value(i) for i in graph.input}, "outputs": {o.name: value(o) for o in graph.output}}


def state_inputs(model: Path) -> dict:
    """Every `past*` input with its declared shape (symbols as names) and element type."""
    import onnx

    graph = onnx.load(str(model), load_external_data=False).graph
    return {i.name: {"shape": [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim],
                     "dtype": onnx.TensorProto.DataType.Name(i.type.tensor_type.elem_type).lower()}
            for i in graph.input if i.name.startswith("past")}


def contrib_signatures(model: Path) -> list[dict]:
    """Each distinct signature of the HYBRID_OPS nodes: domain, op, attributes, input arity and
    which inputs are empty (""), initializers named, with the nodes that have it."""
    import onnx
    from onnx import helper

    graph = onnx.load(str(model), load_external_data=False).graph
    inits = {t.name: list(t.dims) for t in graph.initializer}
    seen: dict[str, dict] = {}
    for n in graph.node:
        if n.op_type not in HYBRID_OPS:
            continue
        attrs = {a.name: plain(helper.get_attribute_value(a)) for a in n.attribute}
        sig = {"domain": n.domain or "ai.onnx", "op": n.op_type, "attributes": attrs, "inputs": len(n.input),
               "empty_inputs": [i for i, x in enumerate(n.input) if not x],
               "initializer_inputs": {i: inits[x] for i, x in enumerate(n.input) if x in inits},
               "outputs": len(n.output)}
        key = json.dumps(sig, sort_keys=True)
        seen.setdefault(key, dict(sig, nodes=[]))["nodes"].append(n.name)
    return list(seen.values())


def plain(value):
    """An attribute value as JSON: strings decoded, lists kept."""
    if isinstance(value, bytes):
        return value.decode()
    return list(value) if isinstance(value, (list, tuple)) else value


def transformers_agreement(entry_dir: Path, mine: list[int], ctx: dict) -> dict:
    """transformers' greedy ids (corpus/hybrid_hf.py greedy, under the builder's transformers) on
    the entry's HF folder, against ONNX Runtime's on the file; a disagreement is recorded with the
    first step that differs and the prefill logits' largest difference, never hidden."""
    import numpy as np
    from onnx import load_tensor, numpy_helper

    theirs = ctx.setdefault("transformers_greedy", {}).get("ids") or hf_greedy(ctx)
    # By name: a decoder with an MTP head outputs its hidden states first.
    outputs = (load_tensor(str(p)) for p in (entry_dir / "prefill").glob("output_*.pb"))
    ort_logits = numpy_helper.to_array(next(t for t in outputs if t.name == "logits"))[0]
    result = {"version": theirs["transformers"], "greedy_ids": theirs["greedy_ids"], "agree": mine == theirs["greedy_ids"],
              "prefill_max_abs_logit_diff": float(np.abs(np.asarray(theirs["prefill_logits"]) - ort_logits).max())}
    if not result["agree"]:
        result["first_difference_step"] = next(i + 1 for i, (a, b) in enumerate(zip(mine, theirs["greedy_ids"])) if a != b)
    return result


def hf_greedy(ctx: dict) -> dict:
    """Runs transformers' greedy once per architecture (the fp32 and int4 entries share it)."""
    import os
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "greedy.json"
        cmd = [sys.executable, str(TOOLS / "corpus" / "hybrid_hf.py"), "greedy", str(ctx["hf"]),
               ",".join(map(str, ctx["prompts"][0])), str(GREEDY_STEPS), str(out)]
        exporters.run(cmd, ctx["hf"].parent / f"{ctx['hf'].name}.greedy.log",
                      dict(os.environ, PYTHONPATH=str(exporters.BUILDER_OVERLAY)))
        ctx["transformers_greedy"] = {"ids": json.loads(out.read_text())}
    return ctx["transformers_greedy"]["ids"]


def bypassed_references(entry_dir: Path, layers: int, kv_heads: int, head_dim: int, prompts: list[list[int]]) -> dict:
    """ONNX Runtime's references on the QDQ file with its attention-internal Q/DQ pairs bypassed
    (corpus/qdq_bypass.py): what npuc's fused float Attention computes, so npuc must give these to
    f32 rounding. The copy lives in memory only; its cases go to `prefill_bypassed/` and
    `decode_bypassed/`."""
    t0 = time.time()
    model, quantised = qdq_bypass.bypass_attention_pairs(entry_dir / "model.onnx", layers)
    ref = reference.record(model.SerializeToString(), entry_dir, kv_heads, head_dim, prompts, DECODE_ID,
                           GREEDY_STEPS, suffix="_bypassed")
    return {
        "attention_qdq_bypassed": {"pairs_per_layer": len(quantised[0]), "quantised_values": quantised},
        "cases_bypassed": ref["cases"],
        "max_abs_logit_bypassed": ref["max_abs_logit"],
        "seconds_bypassed": round(time.time() - t0, 1),
    }


BUILD_LOCK = threading.Lock()


def export_arch(arch: models.Arch, exporters_wanted: list[str], out: Path, force: bool, digest: str,
                make_hf, prompts_of, options: dict | None = None) -> dict:
    """One architecture's entries, exported in order (the QDQ ones read the optimum export).
    `options` go into every entry's context (`bench`, `references`)."""
    index = {}
    if not exporters_wanted:
        return index
    hf = out / f"{arch.name}-hf"
    # The folder is remade when the architecture's spec changed since it was made (a config key
    # that adds weights, as mtp_num_hidden_layers does), not only when it is missing.
    spec = {"hf_class": arch.hf_class, "config": arch.config, "seed": arch.seed}
    spec = json.dumps(spec if arch.dtype == "float32" else dict(spec, dtype=arch.dtype), sort_keys=True)
    stamp = hf / "corpus_spec.json"
    if force or not (hf / "config.json").exists() or not stamp.exists() or stamp.read_text() != spec:
        shutil.rmtree(hf, ignore_errors=True)
        with BUILD_LOCK:  # torch's global RNG draws the weights: one model at a time
            make_hf(hf)
        stamp.write_text(spec)
    ctx = {"hf": hf, "config": json.loads((hf / "config.json").read_text()), **(options or {})}
    ctx["prompts"] = prompts_of(hf)
    if arch.name == "smollm2":
        ctx["prompt_sources"] = SMOLLM2_PROMPTS
    for exporter in exporters_wanted:
        if exporter.startswith(("qdq", "quark")) and "calibration" not in ctx:
            ctx["optimum"] = out / f"{arch.name}-optimum" / "model.onnx"
            ctx["calibration"] = calibration_feeds(ctx["optimum"], ctx["config"])
        try:
            entry = make_entry(arch, exporter, out, ctx, digest)
        except Exception as e:
            traceback.print_exc()
            raise RuntimeError(f"export_corpus: {arch.name}-{exporter} failed") from e
        index[entry["name"]] = entry
        status = (f"refused: {entry['refused']}" if "refused" in entry
                  else f"greedy {entry['cases'][0]['greedy_ids'][:6]}..." if "cases" in entry else "exported")
        print(f"{entry['name']:<36} {status}", flush=True)
    return index


def note_disagreements(index: dict):
    """Float exports of the same weights should agree with optimum's; where ONNX Runtime's greedy
    ids on one differ, the entry says so (an exporter bug: the contract stays what ONNX Runtime
    computes for the file)."""
    for e in index.values():
        if e.get("exporter") not in ("builder-fp32", "torch-dynamo", "torch-dynamo-opset23") or "cases" not in e:
            continue
        ref = index.get(f"{e['arch']}-optimum")
        if not ref or "cases" not in ref:
            continue
        mine, theirs = e["cases"][0]["greedy_ids"], ref["cases"][0]["greedy_ids"]
        e.pop("note", None)
        if mine != theirs:
            at = next(i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b)
            e["note"] = (f"ONNX Runtime's greedy ids on this file part from those on {ref['name']} at step {at + 1} "
                         f"({mine[at]} vs {theirs[at]})")


def smollm2_prompts(hf: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(hf))
    return [tok.encode(p["text"]) if "text" in p
            else list(tok.apply_chat_template(p["messages"], add_generation_prompt=True, tokenize=True))
            for p in SMOLLM2_PROMPTS]


def bench_jobs(args) -> list[tuple]:
    """The bench-only architectures' jobs (`--bench`), as main's corpus jobs."""
    jobs = []
    wanted = lambda arch: [x for x in arch.exporters or BENCH_EXPORTERS
                           if not args.only or arch.name in args.only or f"{arch.name}-{x}" in args.only]
    for arch in models.BENCH_ARCHS.values():
        jobs.append((arch, wanted(arch), lambda hf, a=arch: models.build(a, hf), lambda hf: [BENCH_PROMPT], {}))
    for arch in models.BENCH_HYBRID_ARCHS.values():
        jobs.append((arch, wanted(arch), lambda hf, a=arch: models.build_hybrid(a, hf), lambda hf: [BENCH_PROMPT],
                     {"hybrid": True}))
    return jobs


def check_bench_names(args):
    """A bench-only architecture named without --bench would land in the corpus index the tests
    read: refuse it."""
    for name in args.only or []:
        for arch in [*models.BENCH_ARCHS, *models.BENCH_HYBRID_ARCHS]:
            if name == arch or name.startswith(arch + "-"):
                sys.exit(f"{name} is bench-only: export it with --bench (into fixtures/bench)")
        for arch in models.HYBRID_ARCHS:
            if name == arch or name.startswith(arch + "-builder"):
                sys.exit(f"{name} is a hybrid architecture: export it with --hybrid (into fixtures/hybrid)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="default fixtures/corpus, with --bench fixtures/bench")
    ap.add_argument("--only", nargs="*", help="entries (arch-exporter) or architectures to (re)make")
    ap.add_argument("--force", action="store_true", help="remake even when the stamp matches")
    ap.add_argument("--smollm2-gguf", type=Path, help="SmolLM2-135M's GGUF: add it to the corpus")
    ap.add_argument("--jobs", type=int, default=2, help="architectures exported at once (default 2)")
    ap.add_argument("--bench", action="store_true", help="export the bench-only architectures (not the corpus)")
    ap.add_argument("--no-reference", action="store_true", help="with --bench: skip ONNX Runtime's references")
    ap.add_argument("--hybrid", action="store_true", help="export the hybrid architectures (not the corpus)")
    args = ap.parse_args()
    if args.bench and args.hybrid:
        sys.exit("--bench and --hybrid write different folders: one at a time")
    if args.bench:
        return main_bench(args)
    if args.hybrid:
        return main_hybrid(args)
    if args.no_reference:
        sys.exit("--no-reference is for --bench: the corpus's references are what the tests compare with")
    check_bench_names(args)
    args.out = args.out or TOOLS.parent / "fixtures" / "corpus"
    digest = sources_digest() + ("-forced" + str(time.time()) if args.force else "")
    args.out.mkdir(parents=True, exist_ok=True)
    index_path = args.out / "index.json"
    index = {e["name"]: e for e in json.loads(index_path.read_text())["entries"]} if index_path.exists() else {}
    wanted = lambda arch, names: [x for x in names if not args.only or arch in args.only or f"{arch}-{x}" in args.only]
    jobs = []  # (arch, exporters, make_hf, prompts_of); SmolLM2, the longest, first
    if args.smollm2_gguf:
        smol = models.Arch("smollm2", "LlamaForCausalLM", {}, 0)
        jobs.append((smol, wanted("smollm2", SMOLLM2_EXPORTERS),
                     lambda hf: models.build_from_gguf(args.smollm2_gguf.resolve(), hf), smollm2_prompts))
    for arch in models.ARCHS.values():
        jobs.append((arch, wanted(arch.name, EXPORTERS), lambda hf, a=arch: models.build(a, hf), lambda hf: [PROMPT]))
    # The exporters run as subprocesses and ONNX Runtime releases the GIL: threads overlap them.
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [pool.submit(export_arch, a, names, args.out, args.force, digest, make_hf, prompts_of)
                   for a, names, make_hf, prompts_of in jobs]
        for f in futures:
            try:
                index.update(f.result())
            except RuntimeError as e:
                sys.exit(str(e))
    note_disagreements(index)
    write_index(index_path, index)


def main_bench(args):
    """`--bench`: the bench-only architectures into their own folder and index."""
    if args.smollm2_gguf:
        sys.exit("--bench exports the bench-only architectures; SmolLM2 belongs to the corpus")
    args.out = args.out or TOOLS.parent / "fixtures" / "bench"
    # An entry made without references is remade when they are asked for.
    digest = sources_digest() + ("-noref" if args.no_reference else "")
    digest += "-forced" + str(time.time()) if args.force else ""
    args.out.mkdir(parents=True, exist_ok=True)
    index_path = args.out / "index.json"
    index = {e["name"]: e for e in json.loads(index_path.read_text())["entries"]} if index_path.exists() else {}
    options = {"bench": True, "references": not args.no_reference}
    # One architecture at a time: each is a real model's size.
    for arch, names, make_hf, prompts_of, arch_options in bench_jobs(args):
        try:
            index.update(export_arch(arch, names, args.out, args.force, digest, make_hf, prompts_of,
                                     dict(options, **arch_options)))
        except RuntimeError as e:
            sys.exit(str(e))
    write_index(index_path, index)


def main_hybrid(args):
    """`--hybrid`: the hybrid architectures into their own folder and index, one at a time."""
    if args.smollm2_gguf or args.no_reference:
        sys.exit("--hybrid takes --out, --only and --force")
    args.out = args.out or TOOLS.parent / "fixtures" / "hybrid"
    digest = sources_digest() + ("-forced" + str(time.time()) if args.force else "")
    args.out.mkdir(parents=True, exist_ok=True)
    index_path = args.out / "index.json"
    index = {e["name"]: e for e in json.loads(index_path.read_text())["entries"]} if index_path.exists() else {}
    for arch in models.HYBRID_ARCHS.values():
        names = [x for x in HYBRID_EXPORTERS
                 if not args.only or arch.name in args.only or f"{arch.name}-{x}" in args.only]
        options = {"hybrid": True, "builder_options": models.HYBRID_BUILDER_OPTIONS.get(arch.name, {})}
        try:
            index.update(export_arch(arch, names, args.out, args.force, digest,
                                     lambda hf, a=arch: models.build_hybrid(a, hf), lambda hf: [PROMPT], options))
        except RuntimeError as e:
            sys.exit(str(e))
    write_index(index_path, index)


def write_index(index_path: Path, index: dict):
    entries = sorted(index.values(), key=lambda e: e["name"])
    index_path.write_text(json.dumps({"entries": entries}, indent=2) + "\n")


if __name__ == "__main__":
    main()

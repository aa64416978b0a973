#!/usr/bin/env python3
"""Generate the tiny decoder fixtures (random weights) and check them against ONNX Runtime.

    python tools/gen_fixtures.py [--out DIR] [--only NAME ...] [--force]

For each architecture (llama, qwen3) and form (f1, f2, f3a, f3b, f4) writes
<out>/<arch>_<form>/ with model.onnx, meta.json and the prefill/decode cases.
A fixture is skipped when its stamp matches the current tools sources and all
of its files are present.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import numpy as np
import onnx

TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS))

from npucfix import reference, runner  # noqa: E402
from npucfix.config import TINY_LLAMA, TINY_QWEN3, DecoderConfig  # noqa: E402
from npucfix.form1 import build_form1  # noqa: E402
from npucfix.form2 import Form2Builder, dequantized_weights  # noqa: E402
from npucfix.form3 import VARIANTS, build_form3, calibration_feeds  # noqa: E402
from npucfix.form4 import FUSABLE, Form4Builder  # noqa: E402
from npucfix.graph import io_names, op_histogram  # noqa: E402
from npucfix.quant import quantize_int4  # noqa: E402
from npucfix.weights import random_weights  # noqa: E402

ARCHS: dict[str, tuple[DecoderConfig, int]] = {
    "llama": (TINY_LLAMA, 1001),
    "qwen3": (TINY_QWEN3, 1002),
}
FORMS = ["f1", "f2", "f3a", "f3b", "f4"]
PROMPT_SEED = 2024
DECODE_ID = 137
TOL = 1e-4  # max|ort - reference| / max|reference|


def prompt_ids(cfg: DecoderConfig) -> list[int]:
    return [int(t) for t in np.random.default_rng(PROMPT_SEED).integers(0, cfg.vocab, size=5)]


def base_meta(name: str, form: str, cfg: DecoderConfig, model, seed: int) -> dict:
    ins, outs = io_names(model)
    meta = {"name": name, "form": form}
    meta.update(cfg.meta())
    meta.update({
        "inputs": ins,
        "outputs": outs,
        "cases": ["prefill", "decode"],
        "opset": {o.domain or "ai.onnx": o.version for o in model.opset_import},
        "ir_version": model.ir_version,
        "weights_seed": seed,
        "prompt_ids": prompt_ids(cfg),
        "decode_id": DECODE_ID,
    })
    return meta


def write_fixture(fdir: Path, model, meta: dict, cases: dict, digest: str):
    if meta["form"] != "f2":  # form 2 uses ORT-only ops the onnx checker does not know
        onnx.checker.check_model(model, full_check=True)
    meta["op_histogram"] = op_histogram(model)
    runner.fresh_dir(fdir)
    runner.save_model(model, fdir / "model.onnx")
    ins, outs = meta["inputs"], meta["outputs"]
    runner.write_cases(fdir, ins, outs, cases)
    runner.write_json(fdir / "meta.json", meta)
    runner.write_stamp(fdir, digest)


def fmt(d: dict) -> str:
    return ", ".join(f"{k}={v:.2e}" for k, v in d.items())


def checked_cases(name, cfg, model, weights, padded=True):
    """Run prefill/decode in ORT, compare with the numpy reference; raises past TOL."""
    sess = runner.session(model)
    cases = runner.prefill_decode(cfg, sess, prompt_ids(cfg), DECODE_ID)
    for case, (_, outs) in cases.items():
        runner.check_logits(outs, f"{name}/{case}")
    ref = runner.reference_cases(cfg, weights, cases, reference.forward)
    errs = runner.compare(cases, ref, reference.rel_err)
    errs.update(runner.extra_checks(cfg, sess, weights, reference.forward, reference.rel_err,
                                    prompt_ids(cfg), padded=padded))
    worst = max(errs.values())
    if worst > TOL:
        raise AssertionError(f"{name}: ORT differs from the numpy reference: {fmt(errs)}")
    return sess, cases, errs


def quantized_f2(cfg: DecoderConfig, w: dict):
    symmetric = cfg.arch == "llama"
    norms = {k: v for k, v in w.items() if v.ndim == 1}
    mats = {k[: -len(".weight")]: quantize_int4(v, 32, symmetric)
            for k, v in w.items() if v.ndim == 2 and k != "model.embed_tokens.weight"}
    mats["lm_head"] = quantize_int4(w["model.embed_tokens.weight"], 32, symmetric)
    return norms, mats, symmetric


def select_f4(cfg, w):
    """Try each fused op on its own, then the working set together."""
    tried = {}
    for op in FUSABLE:
        modes = ["causal_bool", "float_mask"] if op == "Attention" else ["causal_bool"]
        for mode in modes:
            try:
                checked_cases(f"f4 probe {op}/{mode}", cfg, Form4Builder(cfg, w, [op], mode).build(), w)
                tried[op] = mode
                break
            except Exception as e:  # noqa: BLE001 - any failure means: fall back
                print(f"    f4: {op} ({mode}) not usable in ORT: {str(e).splitlines()[0][:160]}")
    fused = [op for op in FUSABLE if op in tried]
    return fused, tried.get("Attention", "float_mask")


def gen_arch(arch: str, out: Path, digest: str, wanted: list[str], force: bool):
    cfg, seed = ARCHS[arch]
    todo = [f for f in FORMS if f"{arch}_{f}" in wanted
            and (force or not runner.is_fresh(out / f"{arch}_{f}", digest))]
    for f in FORMS:
        if f"{arch}_{f}" in wanted and f not in todo:
            print(f"  {arch}_{f}: up to date")
    if not todo:
        return {}
    w = random_weights(cfg, seed)
    report = {}
    f1_model = build_form1(cfg, w)
    f1_sess, f1_cases, errs = checked_cases(f"{arch}_f1", cfg, f1_model, w)
    if "f1" in todo:
        name = f"{arch}_f1"
        meta = base_meta(name, "f1", cfg, f1_model, seed)
        meta["checks"] = {"reference_max_rel_err": errs}
        write_fixture(out / name, f1_model, meta, f1_cases, digest)
        report[name] = errs
        print(f"  {name}: {len(f1_model.graph.node)} nodes; vs numpy {fmt(errs)}")

    if "f2" in todo:
        name = f"{arch}_f2"
        norms, mats, symmetric = quantized_f2(cfg, w)
        model = Form2Builder(cfg, norms, mats, packed_qkv=(arch == "llama"), packed_gate_up=(arch == "qwen3")).build()
        wd = dequantized_weights(norms, mats)
        _, cases, errs = checked_cases(name, cfg, model, wd, padded=False)
        vs_f1 = {c: float(np.abs(cases[c][1]["logits"] - f1_cases[c][1]["logits"]).max()) for c in cases}
        meta = base_meta(name, "f2", cfg, model, seed)
        meta["quant"] = {
            "op": "MatMulNBits", "bits": 4, "block_size": 32, "accuracy_level": 0,
            "zero_points": "none (default 8)" if symmetric else "uint8 packed (2 per byte, low nibble first)",
            "packed_qkv": arch == "llama", "packed_gate_up": arch == "qwen3",
            "embedding": "GatherBlockQuantized(bits=4, block_size=32) on a Reshape of the lm_head MatMulNBits "
                         "weight; shares weight/scale/zero-point initializers",
            "position_ids": "none; GroupQueryAttention derives positions from seqlens_k",
        }
        meta["checks"] = {"reference_max_rel_err": errs, "reference_weights": "dequantised int4",
                          "max_abs_logit_diff_vs_f1": vs_f1}
        write_fixture(out / name, model, meta, cases, digest)
        report[name] = errs
        print(f"  {name}: {len(model.graph.node)} nodes; vs numpy(dequant) {fmt(errs)}; "
              f"|logits - f1| max {max(vs_f1.values()):.3f}")

    f3_todo = [f for f in ("f3a", "f3b") if f in todo]
    if f3_todo:
        feeds = calibration_feeds(cfg, f1_sess, seed + 7)
        for f in f3_todo:
            name = f"{arch}_{f}"
            variant = f[-1]
            logging.disable(logging.WARNING)
            try:
                model = build_form3(f1_model, feeds, variant)
            finally:
                logging.disable(logging.NOTSET)
            sess = runner.session(model)
            cases = runner.prefill_decode(cfg, sess, prompt_ids(cfg), DECODE_ID)
            diffs = {}
            for c in cases:
                runner.check_logits(cases[c][1], f"{name}/{c}")
                a, b = cases[c][1]["logits"], f1_cases[c][1]["logits"]
                diffs[f"{c}.max_abs_logit_diff_vs_f1"] = float(np.abs(a - b).max())
                diffs[f"{c}.argmax_agreement_vs_f1"] = float((a.argmax(-1) == b.argmax(-1)).mean())
            meta = base_meta(name, "f3", cfg, model, seed)
            meta["qdq"] = dict(VARIANTS[variant]["meta"])
            meta["quantize_static"] = {
                "quant_format": "QDQ", "op_types_to_quantize": ["MatMul", "Gemm"],
                "per_channel": VARIANTS[variant]["per_channel"],
                "weight_type": VARIANTS[variant]["weight_type"].name,
                "activation_type": VARIANTS[variant]["activation_type"].name,
                "extra_options": VARIANTS[variant]["extra_options"],
                "calibrate_method": "MinMax", "calibration_feeds": len(feeds), "source": f"{arch}_f1",
            }
            meta["checks"] = diffs
            write_fixture(out / name, model, meta, cases, digest)
            report[name] = diffs
            print(f"  {name}: {len(model.graph.node)} nodes; vs f1 {fmt(diffs)}")

    if "f4" in todo:
        name = f"{arch}_f4"
        fused, mode = select_f4(cfg, w)
        model = Form4Builder(cfg, w, fused, mode).build()
        _, cases, errs = checked_cases(name, cfg, model, w)
        meta = base_meta(name, "f4", cfg, model, seed)
        meta["f4_ops"] = fused
        meta["f4_decomposed"] = [op for op in FUSABLE if op not in fused]
        if "Attention" in fused:
            meta["attention_mask_mode"] = mode
        meta["checks"] = {"reference_max_rel_err": errs}
        write_fixture(out / name, model, meta, cases, digest)
        report[name] = errs
        print(f"  {name}: {len(model.graph.node)} nodes, fused {fused} ({mode}); vs numpy {fmt(errs)}")
    return report


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=TOOLS.parent / "fixtures", help="fixtures directory")
    ap.add_argument("--only", nargs="*", help="fixture names to (re)generate, e.g. llama_f1 qwen3_f2")
    ap.add_argument("--force", action="store_true", help="ignore stamps")
    args = ap.parse_args(argv)

    all_names = [f"{a}_{f}" for a in ARCHS for f in FORMS]
    wanted = args.only or all_names
    unknown = set(wanted) - set(all_names)
    if unknown:
        ap.error(f"unknown fixtures: {sorted(unknown)}")
    sources = sorted((TOOLS / "npucfix").glob("*.py")) + [Path(__file__).resolve()]
    digest = runner.file_digest(sources)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    for arch in ARCHS:
        print(f"[{arch}]")
        gen_arch(arch, out, digest, wanted, args.force)
    print(f"tiny fixtures done in {time.time() - t0:.1f}s -> {out}")


if __name__ == "__main__":
    main()

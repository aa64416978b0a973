#!/usr/bin/env python3
"""Loads the OpenVINO IR of an intel-npu bundle with OpenVINO's Python API and checks it.

  ov_check.py DIR                  # DIR holds plan.json, weights.bin and the .xml segments
  ov_check.py DIR --cases CASES    # also run segments on CPU (f32) against reference values
  ov_check.py DIR --cache CACHE    # compile every segment with CACHE_MODE=OPTIMIZE_SIZE into CACHE

Every .xml is read with `openvino.Core().read_model(xml, weights.bin)`. With --cases, CASES/cases.json
lists `{"file", "inputs": {name: {"path", "shape", "dtype"}}, "outputs": {...}}`, raw little-endian
tensors; each listed segment is compiled on CPU with INFERENCE_PRECISION_HINT=f32 (and no dynamic
quantisation) and run, and
max |got - want| and max |want| are reported per output. Prints one JSON object.
"""

import argparse
import json
import os
import sys

import numpy as np
import openvino as ov


def load(path, shape, dtype):
    return np.fromfile(path, dtype=np.dtype(dtype)).reshape(shape)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--cases")
    ap.add_argument("--cache")
    ap.add_argument("--device", default="CPU")
    a = ap.parse_args()
    core = ov.Core()
    plan = json.load(open(os.path.join(a.dir, "plan.json")))
    weights = os.path.join(a.dir, plan["weights_file"])
    files = sorted({f for s in plan["segments"] for f in s["files"].values()})
    report = {"openvino": ov.__version__, "loaded": [], "cases": []}
    models = {}
    for f in files:
        m = core.read_model(os.path.join(a.dir, f), weights)
        models[f] = m
        report["loaded"].append({
            "file": f,
            "inputs": [[i.any_name, list(i.shape)] for i in m.inputs],
            "outputs": [[o.any_name, list(o.shape)] for o in m.outputs],
        })
    # f32 on CPU, and no dynamic int8 quantisation of the activations the CPU plugin otherwise
    # applies to GEMMs with compressed weights: the reference computes in f32/f64.
    config = {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"} if a.device == "CPU" else {}
    if a.cases:
        cases = json.load(open(os.path.join(a.cases, "cases.json")))
        for c in cases:
            compiled = core.compile_model(models[c["file"]], a.device, config)
            feeds = {n: load(os.path.join(a.cases, t["path"]), t["shape"], t["dtype"]) for n, t in c["inputs"].items()}
            got = compiled.create_infer_request().infer(feeds)
            by_name = {k.any_name: v for k, v in got.items()}
            for n, t in c["outputs"].items():
                want = load(os.path.join(a.cases, t["path"]), t["shape"], t["dtype"])
                g = by_name[n].reshape(want.shape)
                finite = bool(np.isfinite(g).all())
                diff = float(np.abs(g.astype(np.float64) - want).max()) if finite else -1.0
                report["cases"].append({
                    "file": c["file"], "output": n, "max_abs_diff": diff,
                    "max_abs_ref": float(np.abs(want).max()), "finite": finite,
                })
    if a.cache:
        os.makedirs(a.cache, exist_ok=True)
        cache_config = dict(config, CACHE_DIR=a.cache, CACHE_MODE="OPTIMIZE_SIZE")
        for f in files:
            core.compile_model(models[f], a.device, dict(cache_config, WEIGHTS_PATH=weights))
        size = sum(os.path.getsize(os.path.join(r, x)) for r, _, fs in os.walk(a.cache) for x in fs)
        report["cache"] = {"dir_bytes": size, "weights_bytes": os.path.getsize(weights), "files": len(files)}
    json.dump(report, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())

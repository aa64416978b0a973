#!/usr/bin/env python3
"""How big OpenVINO's compiled-model cache is for one segment of an intel-npu bundle, per cache mode.

Compiles `intel/<segment>.xml` (read with the bundle's shared `intel/weights.bin`) twice per
configuration into a fresh cache folder (the second compile loads from the cache), and prints the
cache's bytes, both compile times and whether the cached network gives the same outputs. The
configurations: the default, CACHE_MODE=OPTIMIZE_SIZE (weightless blobs where the plugin supports
it), ENABLE_WEIGHTLESS, and both.

Usage: .venv/bin/python tools/ov_cache_modes.py BUNDLE.npub [--segment seg01_t1] [--device CPU]
"""
import argparse
import os
import re
import shutil
import tempfile
import time

import numpy as np
import openvino as ov

CONFIGS = {
    "default": {},
    "CACHE_MODE=OPTIMIZE_SIZE": {"CACHE_MODE": "OPTIMIZE_SIZE"},
    "ENABLE_WEIGHTLESS": {"ENABLE_WEIGHTLESS": "YES"},
    "both": {"CACHE_MODE": "OPTIMIZE_SIZE", "ENABLE_WEIGHTLESS": "YES"},
}


def folder_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)) if os.path.isdir(path) else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--segment", default="seg01_t1")
    ap.add_argument("--device", default="CPU")
    a = ap.parse_args()
    intel = os.path.join(a.bundle, "intel")
    xml, weights = os.path.join(intel, f"{a.segment}.xml"), os.path.join(intel, "weights.bin")
    feeds = None
    # Bytes of weights.bin the segment's constants view (each range once).
    with open(xml) as f:
        ranges = set(re.findall(r'offset="(\d+)" size="(\d+)"', f.read()))
    viewed = sum(int(size) for _, size in ranges)
    print(f"{a.segment} on {a.device}: its constants view {viewed} bytes of weights.bin")
    root = tempfile.mkdtemp(prefix="ov-cache-modes-")
    try:
        for name, extra in CONFIGS.items():
            cache = os.path.join(root, str(len(os.listdir(root))))
            outputs, times = [], []
            for _ in range(2):
                core = ov.Core()
                core.set_property({"CACHE_DIR": cache})
                precision = {"INFERENCE_PRECISION_HINT": "f32"} if a.device == "CPU" else {}
                core.set_property(a.device, {**precision, **extra})
                t0 = time.perf_counter()
                compiled = core.compile_model(core.read_model(xml, weights), a.device)
                times.append((time.perf_counter() - t0) * 1e3)
                if feeds is None:
                    rng = np.random.default_rng(0)
                    feeds = {}
                    for i in compiled.inputs:
                        shape = list(i.get_shape())
                        if i.get_element_type() == ov.Type.i64:
                            feeds[i.get_any_name()] = rng.integers(0, 100, shape).astype(np.int64)
                        else:
                            feeds[i.get_any_name()] = rng.standard_normal(shape).astype(np.float32)
                r = compiled.infer_new_request(feeds)
                outputs.append(np.concatenate([r[o].ravel() for o in compiled.outputs]))
            same = bool(np.array_equal(outputs[0], outputs[1]))
            print(f"{name:<26} cache {folder_bytes(cache):>10} bytes; compile {times[0]:7.0f} ms, "
                  f"from cache {times[1]:7.0f} ms; same outputs: {same}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

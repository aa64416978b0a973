#!/usr/bin/env python3
"""Side by side, in one run: tokens/s of npuc's intel-npu IR on OpenVINO (`npuc run --backend
openvino`) against OpenVINO reading the same ONNX file directly (`read_model` on the .onnx), on the
same device, with the same threads, prompt and greedy loop (prefill, then one token per step).

  tools/bench_openvino.py MODEL.onnx BUNDLE.npub [--threads 2] [--gen 32] [--prompt TEXT]

Both sides compile before timing (the compile time is reported apart). Prints a table and, with
--json, one JSON object; the ratio is npuc decode tok/s over ONNX decode tok/s.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
import openvino as ov


def onnx_greedy(model_path, ids, gen, threads, device):
    core = ov.Core()
    config = {"INFERENCE_NUM_THREADS": str(threads)}
    if device == "CPU":
        config.update({"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"})
    t0 = time.perf_counter()
    compiled = core.compile_model(core.read_model(model_path), device, config)
    compile_ms = (time.perf_counter() - t0) * 1e3
    req = compiled.create_infer_request()
    names = [i.any_name for i in compiled.inputs]
    past = {}
    for i in compiled.inputs:
        if i.any_name.startswith("past_key_values"):
            shape = [d.get_length() if d.is_static else 0 for d in i.get_partial_shape()]
            shape[0] = 1
            past[i.any_name] = np.zeros(shape, np.float32)
    out_names = [o.any_name for o in compiled.outputs]

    def step(tokens, position):
        feeds = {"input_ids": np.array([tokens], np.int64)}
        if "attention_mask" in names:
            feeds["attention_mask"] = np.ones((1, position + len(tokens)), np.int64)
        if "position_ids" in names:
            feeds["position_ids"] = np.arange(position, position + len(tokens), dtype=np.int64)[None]
        feeds.update(past)
        r = req.infer(feeds)
        for o, n in zip(compiled.outputs, out_names):
            if n.startswith("present"):
                past[n.replace("present", "past_key_values")] = r[o]
        return r[compiled.outputs[0]][0, -1]

    t0 = time.perf_counter()
    logits = step(ids, 0)
    tokens = [int(np.argmax(logits))]
    ttft = time.perf_counter() - t0
    t1 = time.perf_counter()
    position = len(ids)
    while len(tokens) < gen:
        logits = step([tokens[-1]], position)
        position += 1
        tokens.append(int(np.argmax(logits)))
    decode_s = time.perf_counter() - t1
    return {"tokens": tokens, "compile_ms": compile_ms, "ttft_ms": ttft * 1e3, "decode_tok_s": (gen - 1) / decode_s}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("bundle")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--device", default="CPU")
    ap.add_argument("--prompt", default="The capital of France is")
    ap.add_argument("--npuc", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "npuc"))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    cmd = [a.npuc, "run", a.bundle, "--backend", "openvino", "--device", a.device, "--prompt", a.prompt,
           "--max-tokens", str(a.gen), "--threads", str(a.threads), "--json"]
    ours = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(a.bundle, "tokenizer.json"))
    ids = tok.encode(a.prompt).ids
    theirs = onnx_greedy(a.model, ids, len(ours["tokens"]), a.threads, a.device)
    ratio = ours["decode_tok_s"] / theirs["decode_tok_s"]
    report = {
        "device": a.device, "threads": a.threads, "prompt_tokens": len(ids), "generated": len(ours["tokens"]),
        "npuc_ir": {k: ours[k] for k in ("decode_tok_s", "ttft_ms", "compile_ms", "networks")},
        "onnx": {k: theirs[k] for k in ("decode_tok_s", "ttft_ms", "compile_ms")},
        "same_tokens": ours["tokens"] == theirs["tokens"],
        "ratio_decode": ratio,
    }
    if a.json:
        print(json.dumps(report))
    else:
        print(f"{'':12} {'decode tok/s':>12} {'ttft ms':>9} {'compile ms':>11}")
        for k in ("npuc_ir", "onnx"):
            r = report[k]
            print(f"{k:12} {r['decode_tok_s']:12.1f} {r['ttft_ms']:9.1f} {r['compile_ms']:11.0f}")
        print(f"ratio (npuc IR / ONNX, decode): {ratio:.2f}x; same greedy tokens: {report['same_tokens']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

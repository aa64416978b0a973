"""The hybrid corpus's Hugging Face side, run under the builder's transformers (its overlay first on
PYTHONPATH): the Qwen3.5 and LFM2-MoE classes exist only there, and the builder reads every folder
with that version, so each folder is written and checked by the transformers that exports it.

    python hybrid_hf.py build SPEC.json OUT        # a random-weight model folder
    python hybrid_hf.py greedy HF PROMPT STEPS OUT.json   # transformers' own greedy ids and logits

SPEC.json is {"hf_class", "config", "seed"} (corpus/models.py HYBRID_ARCHS). A text config with
`mtp_num_hidden_layers` also gets a multi-token-prediction head's weights (`mtp.*`, see mtp_state).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import models  # noqa: E402


def build(spec: dict, out: Path):
    """Writes the model folder. Weights are drawn with std INIT_STD; then every tensor the init
    leaves at exactly 0 or 1 (norm weights, Qwen3.5's (1 + w) norms, dt_bias, biases, LFM2-MoE's
    expert bias buffer, attention sinks) is moved by U(-0.5, 0.5) per element, so a kernel that
    ignores a gate, a decay or a bias gives other numbers."""
    import torch
    import transformers

    torch.manual_seed(spec["seed"])
    cls = getattr(transformers, spec["hf_class"])
    # A composite config's sub-configs carry their own init std, which is the one the init reads.
    config = {k: dict(v, initializer_range=models.INIT_STD) if k.endswith("_config") else v
              for k, v in spec["config"].items()}
    cfg = cls.config_class(**config, initializer_range=models.INIT_STD)
    model = cls(cfg).eval().float()
    with torch.no_grad():
        for name, t in model.state_dict(keep_vars=True).items():
            if t.is_floating_point() and ((t == 0) | (t == 1)).all():
                t.add_(torch.rand_like(t) - 0.5)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    text = getattr(cfg, "text_config", cfg)
    if getattr(text, "mtp_num_hidden_layers", 0):
        add_tensors(out / "model.safetensors", mtp_state(model, text, spec["seed"]))
    models.write_tokenizer(out, text.vocab_size)


def mtp_state(model, text, seed: int) -> dict:
    """A Qwen3.5 multi-token-prediction head as the real checkpoints store it and the builder reads
    it (onnxruntime_genai/models/loaders/qwen.py QwenMTPModel): `mtp.fc.weight` [hidden, 2 hidden]
    over the normed token embedding and hidden state, the (1 + w) norms `mtp.pre_fc_norm_embedding`,
    `mtp.pre_fc_norm_hidden` and `mtp.norm`, and one full-attention decoder layer `mtp.layers.0.*`
    named as transformers' decoder layer names its tensors (the builder loads them into one).
    transformers' class has no such head (it drops `mtp.*` on load), so the tensors are drawn here,
    from their own generator so the decoder's weights stay those of the seed: matrices with std
    INIT_STD, vectors (every one a (1 + w) norm's weight) U(-0.5, 0.5) — what build gives the
    decoder's own."""
    import copy

    import torch

    config = copy.deepcopy(text)
    config.num_hidden_layers, config.layer_types = 1, ["full_attention"]
    full = model.config.text_config.layer_types.index("full_attention")
    layer = type(model.model.language_model.layers[full])(config, layer_idx=0)
    hidden = text.hidden_size
    shapes = {f"mtp.layers.0.{k}": v.shape for k, v in layer.state_dict().items()}
    shapes.update({"mtp.fc.weight": (hidden, 2 * hidden), "mtp.pre_fc_norm_embedding.weight": (hidden,),
                   "mtp.pre_fc_norm_hidden.weight": (hidden,), "mtp.norm.weight": (hidden,)})
    gen = torch.Generator().manual_seed(seed + 1000)
    return {name: torch.rand(shape, generator=gen) - 0.5 if len(shape) == 1
            else torch.randn(shape, generator=gen) * models.INIT_STD for name, shape in sorted(shapes.items())}


def add_tensors(path: Path, tensors: dict):
    """Adds `tensors` to the safetensors file save_pretrained wrote (one shard: the models are tiny)."""
    from safetensors.torch import load_file, save_file

    if path.with_name("model.safetensors.index.json").exists():
        raise RuntimeError(f"{path.parent}: a sharded checkpoint; the MTP tensors go into one file")
    save_file({**load_file(path), **tensors}, path, metadata={"format": "pt"})


def greedy(hf: Path, prompt: list[int], steps: int) -> dict:
    """Greedy ids from transformers' generate (its cache, its recurrent and conv state) with EOS
    not stopping the run, as ONNX Runtime's greedy loop in reference.py runs; and the prefill's
    logits from one forward, for the size of the difference from ONNX Runtime's."""
    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(hf)
    cls = getattr(transformers, config.architectures[0])
    model = cls.from_pretrained(hf, dtype=torch.float32).eval()
    ids = torch.tensor([prompt])
    gen = transformers.GenerationConfig(max_new_tokens=steps, do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]
        out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gen)
    return {"greedy_ids": out[0, len(prompt):].tolist(), "prefill_logits": logits.tolist(),
            "transformers": transformers.__version__}


def main():
    if sys.argv[1] == "build":
        build(json.loads(Path(sys.argv[2]).read_text()), Path(sys.argv[3]))
    elif sys.argv[1] == "greedy":
        prompt = [int(t) for t in sys.argv[3].split(",")]
        Path(sys.argv[5]).write_text(json.dumps(greedy(Path(sys.argv[2]), prompt, int(sys.argv[4]))))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()

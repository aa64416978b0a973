"""Tiny random-weight decoders made with transformers' own config and model classes.

Every structural feature of the architecture is there (q/k norms, biases, tied or untied
embeddings); only the sizes are small. Weights are drawn with a larger spread than transformers'
default init (std 0.02 gives near-uniform attention, which hides RoPE and mask bugs) and the norm
weights are random too, so a kernel that ignores them is caught.

BENCH_ARCHS are made the same way at a real model's sizes, for `make bench` only: the corpus (and
so `make test`) never builds them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

VOCAB = 512
INIT_STD = 0.08
NORM_RANGE = (0.5, 1.5)


@dataclass(frozen=True)
class Arch:
    name: str
    hf_class: str
    config: dict
    seed: int


COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)

ARCHS = {
    # SmolLM2's shape of Llama: tied embeddings, GQA, head_dim 32.
    "llama": Arch("llama", "LlamaForCausalLM", dict(COMMON, tie_word_embeddings=True, rms_norm_eps=1e-5,
                                                    rope_theta=10000.0), 11),
    # Qwen2.5: biases on the q/k/v projections, tied embeddings.
    "qwen2": Arch("qwen2", "Qwen2ForCausalLM", dict(COMMON, tie_word_embeddings=True, rms_norm_eps=1e-6,
                                                    rope_theta=1000000.0), 13),
    # Phi-3: fused qkv and gate_up projections sliced apart; one RoPE scale (the builder takes
    # the long-RoPE path unless the original context equals the context).
    "phi3": Arch("phi3", "Phi3ForCausalLM", dict(COMMON, tie_word_embeddings=False, rms_norm_eps=1e-5,
                                                 rope_theta=10000.0, original_max_position_embeddings=512), 14),
    # Mistral: a sliding window shorter than a corpus case (8 prompt + 16 generated positions),
    # so keys leave the window within the greedy run.
    "mistral": Arch("mistral", "MistralForCausalLM", dict(COMMON, tie_word_embeddings=False, rms_norm_eps=1e-5,
                                                          rope_theta=10000.0, sliding_window=12), 15),
    # Gemma 3 (text): GELU-tanh gate, norms before and after attention and MLP with (1 + w)
    # weights, q/k norms, the embedding scaled by sqrt(hidden), a score scale from
    # query_pre_attn_scalar (not head_dim), and a local layer (sliding window, its own RoPE base)
    # before a global one.
    "gemma3": Arch("gemma3", "Gemma3ForCausalLM", dict(
        COMMON, head_dim=32, tie_word_embeddings=True, rms_norm_eps=1e-6, rope_theta=1000000.0,
        rope_local_base_freq=10000.0, query_pre_attn_scalar=48, sliding_window=12,
        layer_types=["sliding_attention", "full_attention"], hidden_activation="gelu_pytorch_tanh"), 16),
    # Qwen3: q/k RMSNorm per head, explicit head_dim, untied lm_head.
    "qwen3": Arch("qwen3", "Qwen3ForCausalLM", dict(COMMON, head_dim=64, tie_word_embeddings=False,
                                                    rms_norm_eps=1e-6, rope_theta=1000000.0), 12),
}


# Bench only: real sizes, random weights (what a decode step reads and computes depends on the
# shapes, not the values), exported by `tools/export_corpus.py --bench` into fixtures/bench/.
BENCH_ARCHS = {
    # Qwen3-0.6B's shapes: 28 layers, hidden 1024, 16 query and 8 KV heads of 128, q/k norms,
    # tied embeddings over a 151936 vocabulary (the embedding is a quarter of the weights).
    "qwen3-0.6b": Arch("qwen3-0.6b", "Qwen3ForCausalLM", dict(
        vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, tie_word_embeddings=True, rope_theta=1000000.0, rms_norm_eps=1e-6,
        max_position_embeddings=40960, bos_token_id=1, eos_token_id=2, pad_token_id=0), 17),
}


def build(arch: Arch, out: Path) -> dict:
    """Writes a Hugging Face model folder (weights, config, tokenizer); returns the config dict."""
    import torch
    import transformers

    torch.manual_seed(arch.seed)
    cls = getattr(transformers, arch.hf_class)
    config_cls = cls.config_class
    cfg = config_cls(**arch.config, initializer_range=INIT_STD)
    model = cls(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(*NORM_RANGE)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    write_tokenizer(out, arch.config["vocab_size"])
    return json.loads((out / "config.json").read_text())


def write_tokenizer(out: Path, vocab_size: int = VOCAB):
    """A word-level tokenizer over the model's vocabulary (`vocab_size` ids, one word each): the
    builder needs one to write its genai_config, and tests feed token ids directly."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"w{i}": i for i in range(3, vocab_size)})
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<pad>")
    fast.save_pretrained(out)


def dims(config: dict) -> tuple[int, int, int]:
    """(layers, kv_heads, head_dim) of a saved config."""
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    return config["num_hidden_layers"], config.get("num_key_value_heads", heads), head_dim


def build_from_gguf(gguf: Path, out: Path) -> dict:
    """A Hugging Face folder from a GGUF file through transformers' own GGUF loader (weights
    dequantised to float32, tokenizer converted): SmolLM2-135M with its real weights."""
    import transformers

    out.mkdir(parents=True, exist_ok=True)
    kw = dict(gguf_file=gguf.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), torch_dtype="float32", **kw)
    tok = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), **kw)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return json.loads((out / "config.json").read_text())

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
    # The dtype the random weights are drawn and saved in: float16 halves a large model's memory
    # while it is made (4B parameters take 16 GB in float32); the builder reads either.
    dtype: str = "float32"
    # The exporters this architecture is made with, when not all of its list's (a 4B model's fp32
    # export would need 16 GB more disk and memory than its int4 one).
    exporters: tuple[str, ...] | None = None


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
        max_position_embeddings=40960, bos_token_id=1, eos_token_id=2, pad_token_id=0), 17,
        exporters=("builder-int4", "builder-fp32", "optimum")),
    # Qwen3-4B's shapes: 36 layers, hidden 2560, intermediate 9728, 32 query and 8 KV heads of
    # 128, tied embeddings. Drawn in float16 and exported to int4 only.
    "qwen3-4b": Arch("qwen3-4b", "Qwen3ForCausalLM", dict(
        vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, tie_word_embeddings=True, rope_theta=1000000.0, rms_norm_eps=1e-6,
        max_position_embeddings=40960, bos_token_id=1, eos_token_id=2, pad_token_id=0), 18,
        dtype="float16", exporters=("builder-int4",)),
}


# The hybrid corpus (`tools/export_corpus.py --hybrid`, into fixtures/hybrid/): recurrent and
# mixture-of-experts decoders as the builder exports them, each with one layer of every kind. Made
# by corpus/hybrid_hf.py under the builder's transformers, which has the Qwen3.5 and LFM2-MoE
# classes. Qwen3.5's attention uses the real model's proportions: head_dim 64 with a quarter of it
# rotated as interleaved MRoPE sections [3, 3, 2], twice as many value heads as key heads in the
# Gated DeltaNet layers. One MTP layer, as the real checkpoints have: the builder then writes the
# multi-token-prediction head as mtp.onnx beside model.onnx (corpus/hybrid_hf.py mtp_state).
QWEN35_TEXT = dict(
    COMMON, num_hidden_layers=2, layer_types=["linear_attention", "full_attention"], head_dim=64,
    linear_conv_kernel_dim=4, linear_key_head_dim=32, linear_value_head_dim=32, linear_num_key_heads=2,
    linear_num_value_heads=4, rms_norm_eps=1e-6, tie_word_embeddings=False, mtp_num_hidden_layers=1,
    rope_parameters=dict(rope_type="default", rope_theta=10000000.0, partial_rotary_factor=0.25,
                         mrope_section=[3, 3, 2], mrope_interleaved=True))
# The vision tower is part of the class; the builder exports the text decoder only.
QWEN35_VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=128)
EXPERTS = dict(num_experts=4, num_experts_per_tok=2)

HYBRID_ARCHS = {
    # Qwen3.5: a Gated DeltaNet layer (causal conv, gated delta rule, gated RMSNorm) before a
    # gated full-attention layer with q/k norms; (1 + w) norms.
    "qwen3.5": Arch("qwen3.5", "Qwen3_5ForConditionalGeneration", dict(
        text_config=QWEN35_TEXT, vision_config=QWEN35_VISION, tie_word_embeddings=False), 21),
    # Qwen3.5-MoE: the same layers with a routed MoE (4 experts, top 2) and a gated shared expert.
    "qwen3.5-moe": Arch("qwen3.5-moe", "Qwen3_5MoeForConditionalGeneration", dict(
        text_config=dict(QWEN35_TEXT, **EXPERTS, moe_intermediate_size=64, shared_expert_intermediate_size=64),
        vision_config=QWEN35_VISION, tie_word_embeddings=False), 22),
    # LFM2: short causal convolutions (kernel 3, gated by the input projection) and attention
    # with q/k norms; the FFN size as given (no auto-adjust). No conv biases, as in LFM2's own
    # checkpoints: with `conv_bias` the in/out projections get biases too, which the builder drops
    # (its graph then parts from transformers' forward by 4.7 in the logits).
    "lfm2": Arch("lfm2", "Lfm2ForCausalLM", dict(
        COMMON, layer_types=["conv", "full_attention"], conv_L_cache=3, conv_bias=False, norm_eps=1e-5,
        block_auto_adjust_ff_dim=False, tie_word_embeddings=True,
        rope_parameters=dict(rope_type="default", rope_theta=1000000.0)), 23),
    # gpt-oss: MoE with biased experts and a clamped SwiGLU, attention sinks, a sliding-window
    # layer (window 12, shorter than a greedy run) before a full one, YaRN over a 4096-position
    # original context (the builder's YaRN needs head_dim >= 64).
    "gpt-oss": Arch("gpt-oss", "GptOssForCausalLM", dict(
        COMMON, hidden_size=64, intermediate_size=64, head_dim=64, num_local_experts=4, num_experts_per_tok=2,
        sliding_window=12, layer_types=["sliding_attention", "full_attention"], max_position_embeddings=32768,
        rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=8.0, beta_fast=32.0, beta_slow=1.0,
                             truncate=False, original_max_position_embeddings=4096)), 24),
    # LFM2-MoE: a dense conv layer, then MoE layers (sigmoid router with an expert bias) after an
    # attention layer and a conv layer.
    "lfm2-moe": Arch("lfm2-moe", "Lfm2MoeForCausalLM", dict(
        COMMON, num_hidden_layers=3, layer_types=["conv", "full_attention", "conv"], num_dense_layers=1,
        **EXPERTS, moe_intermediate_size=64, conv_L_cache=3, conv_bias=False, norm_eps=1e-5,
        tie_word_embeddings=True, rope_parameters=dict(rope_type="default", rope_theta=1000000.0)), 25),
}
# Bench only, hybrid: Qwen3.5-MoE's proportions at a size this machine exports and runs in minutes,
# made like HYBRID_ARCHS (corpus/hybrid_hf.py under the builder's transformers) and exported by
# `tools/export_corpus.py --bench` into fixtures/bench/. Scaled from the real 35B-A3B model (hidden
# 2048, 40 layers, 256 experts of 512 with top 8 and a shared expert of 512): hidden 1024, 16 layers
# as three Gated DeltaNet layers to one gated full-attention layer, attention heads of 256 (8 query,
# 2 KV) with a quarter rotated as interleaved MRoPE [11, 11, 10], delta-rule heads of 128 (8 key, 16
# value), and in every layer 32 experts of 256 with top 4 plus a gated shared expert of 256; a
# 32768-word vocabulary, untied, and no MTP head. 614M parameters in the decoder (403M of them routed
# experts), 261M active per token (4 of 32 experts; 228M without the input embedding, of which a
# token reads one row).
QWEN35_MOE_BENCH_TEXT = dict(
    vocab_size=32768, hidden_size=1024, intermediate_size=3072, num_hidden_layers=16,
    layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 4, num_attention_heads=8, num_key_value_heads=2,
    head_dim=256, linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128,
    linear_num_key_heads=8, linear_num_value_heads=16, num_experts=32, num_experts_per_tok=4,
    moe_intermediate_size=256, shared_expert_intermediate_size=256, rms_norm_eps=1e-6, tie_word_embeddings=False,
    max_position_embeddings=4096, bos_token_id=1, eos_token_id=2, pad_token_id=0, mtp_num_hidden_layers=0,
    rope_parameters=dict(rope_type="default", rope_theta=10000000.0, partial_rotary_factor=0.25,
                         mrope_section=[11, 11, 10], mrope_interleaved=True))
BENCH_HYBRID_ARCHS = {
    "qwen3.5-moe-bench": Arch("qwen3.5-moe-bench", "Qwen3_5MoeForConditionalGeneration", dict(
        text_config=QWEN35_MOE_BENCH_TEXT, vision_config=dict(QWEN35_VISION, out_hidden_size=1024),
        tie_word_embeddings=False), 26),
}

# Builder options per hybrid architecture: gpt-oss's sliding-window layer gets a full-length KV
# cache like the other layers (the default is a ring buffer of the window's size on CPU).
HYBRID_BUILDER_OPTIONS = {"gpt-oss": {"windowed_kv_cache": "false"}}


def build(arch: Arch, out: Path) -> dict:
    """Writes a Hugging Face model folder (weights, config, tokenizer); returns the config dict."""
    import torch
    import transformers

    torch.manual_seed(arch.seed)
    cls = getattr(transformers, arch.hf_class)
    config_cls = cls.config_class
    cfg = config_cls(**arch.config, initializer_range=INIT_STD)
    torch.set_default_dtype(getattr(torch, arch.dtype))
    try:
        model = cls(cfg).eval()
    finally:
        torch.set_default_dtype(torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(*NORM_RANGE)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    write_tokenizer(out, arch.config["vocab_size"])
    return json.loads((out / "config.json").read_text())


def build_hybrid(arch: Arch, out: Path) -> dict:
    """A hybrid architecture's model folder, made by corpus/hybrid_hf.py under the builder's
    transformers (the only one with every hybrid class); returns the config dict."""
    import os
    import sys
    import tempfile

    from corpus.exporters import BUILDER_OVERLAY, run

    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        spec = Path(scratch) / "spec.json"
        spec.write_text(json.dumps({"hf_class": arch.hf_class, "config": arch.config, "seed": arch.seed}))
        run([sys.executable, str(Path(__file__).with_name("hybrid_hf.py")), "build", str(spec), str(out)],
            out.parent / f"{out.name}.log", dict(os.environ, PYTHONPATH=str(BUILDER_OVERLAY)))
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
    """(layers, kv_heads, head_dim) of a saved config (a composite one's text config)."""
    config = config.get("text_config", config)
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

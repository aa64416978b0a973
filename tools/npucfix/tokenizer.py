"""A Hugging Face `tokenizers` tokenizer rebuilt from GGUF tokenizer.ggml.* metadata.

Handles the GPT-2 style byte-level BPE ("tokenizer.ggml.model" == "gpt2"). The
"smollm" pre-tokenizer of llama.cpp splits every digit on its own and then
applies the GPT-2 regex, which is Digits(individual_digits) followed by
ByteLevel(use_regex) here. Control tokens (type 3) become special added tokens,
user-defined ones (type 4) plain added tokens.
"""

from __future__ import annotations

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

CONTROL = 3
USER_DEFINED = 4


def build_tokenizer(get) -> Tokenizer:
    """get(key, default) reads a GGUF metadata value."""
    model = get("tokenizer.ggml.model")
    if model != "gpt2":
        raise ValueError(f"only byte-level BPE (gpt2) tokenizers are handled, not {model}")
    tokens = list(get("tokenizer.ggml.tokens"))
    types = list(get("tokenizer.ggml.token_type"))
    merges = [tuple(m.split(" ", 1)) for m in get("tokenizer.ggml.merges")]
    pre = get("tokenizer.ggml.pre", "default")

    vocab = {tok: i for i, tok in enumerate(tokens)}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=bool(get("tokenizer.ggml.add_space_prefix", False)),
                                          use_regex=True)
    if pre in ("smollm", "starcoder", "refact", "codeshell"):
        tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif pre in ("gpt2", "default"):
        tk.pre_tokenizer = byte_level
    else:
        raise ValueError(f"unhandled pre-tokenizer {pre}")
    tk.decoder = decoders.ByteLevel()
    tk.post_processor = processors.ByteLevel(trim_offsets=False)

    added = []
    for i, (tok, ty) in enumerate(zip(tokens, types)):
        if ty in (CONTROL, USER_DEFINED):
            added.append((i, AddedToken(tok, special=(ty == CONTROL), normalized=False)))
    tk.add_special_tokens([a for _, a in added if a.special])
    tk.add_tokens([a for _, a in added if not a.special])
    for i, a in added:
        got = tk.token_to_id(a.content)
        if got != i:
            raise AssertionError(f"added token {a.content!r} got id {got}, expected {i}")
    return tk


def render_chat(messages: list[dict], add_generation_prompt: bool = True) -> str:
    """The SmolLM2 chat template (chat_template.jinja in the fixture), evaluated by hand."""
    out = []
    for n, m in enumerate(messages):
        if n == 0 and messages[0]["role"] != "system":
            out.append("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
                       "trained by Hugging Face<|im_end|>\n")
        out.append(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n")
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
    return "".join(out)

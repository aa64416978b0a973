"""`torch.onnx.export(..., dynamo=True)` of a Hugging Face decoder with its KV cache.

    python dynamo_export.py HF_FOLDER OUT_FOLDER [--opset23]

The model's forward takes a `DynamicCache`, which torch.export cannot take as an input; a thin
module takes the caches as flat tensors (`past_key_values.<i>.key|value`), builds the cache, and
returns the logits and the presents flat. Every batch, sequence and past size is `Dim.AUTO`, so
the exporter names them itself (`s10`, `s70`, ...), as it does for its users.

With --opset23 the export targets opset 23, where the exporter's own graph optimisation
(onnxscript's) writes the standard fused ops: RMSNormalization, RotaryEmbedding and Attention
(the causal mask an input, `is_causal` 0).
"""

import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, DynamicCache


class FlatCache(torch.nn.Module):
    def __init__(self, model, layers: int):
        super().__init__()
        self.model, self.layers = model, layers

    def forward(self, input_ids, attention_mask, position_ids, *past):
        cache = DynamicCache()
        for i in range(self.layers):
            cache.update(past[2 * i], past[2 * i + 1], i)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=cache, use_cache=True)
        presents = []
        for layer in out.past_key_values.layers[: self.layers]:
            presents += [layer.keys, layer.values]
        return (out.logits, *presents)


def main():
    hf, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32, attn_implementation="sdpa").eval()
    cfg = model.config
    layers, kv = cfg.num_hidden_layers, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    batch, seq, past_len = 2, 4, 3
    args = (torch.randint(0, cfg.vocab_size, (batch, seq)), torch.ones(batch, past_len + seq, dtype=torch.int64),
            torch.arange(past_len, past_len + seq).repeat(batch, 1))
    past = tuple(torch.randn(batch, kv, past_len, head_dim) for _ in range(2 * layers))
    names_in = ["input_ids", "attention_mask", "position_ids"]
    names_in += [f"past_key_values.{i}.{k}" for i in range(layers) for k in ("key", "value")]
    names_out = ["logits"] + [f"present.{i}.{k}" for i in range(layers) for k in ("key", "value")]
    auto = torch.export.Dim.AUTO
    shapes = ({0: auto, 1: auto}, {0: auto, 1: auto}, {0: auto, 1: auto}, tuple({0: auto, 2: auto} for _ in past))
    opset = 23 if "--opset23" in sys.argv[3:] else 18
    program = torch.onnx.export(FlatCache(model, layers), args + past, dynamo=True, input_names=names_in,
                                output_names=names_out, dynamic_shapes=shapes, opset_version=opset)
    program.save(str(out / "model.onnx"))


if __name__ == "__main__":
    main()

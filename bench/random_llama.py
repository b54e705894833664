"""A random-weight llama MLX model dir, built on the device it will run on, for benchmarks
that must be bound by the GPU (a 1B in bf16, an 8B-class in 4 bits), with a real tokenizer.

Special tokens' output rows are zeroed, so with random weights the model never ends early:
every answer runs to max_tokens. (tests/tinymodel.py builds the tests' seeded CPU model.)

    python -m bench.random_llama OUT TOKENIZER_DIR --size 8b --bits 4
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models.llama import Model, ModelArgs

from tests.tinymodel import take_tokenizer

SIZES = {
    "1b": {"hidden_size": 2048, "num_hidden_layers": 16, "intermediate_size": 8192,
           "num_attention_heads": 32, "num_key_value_heads": 8, "tie_word_embeddings": True},
    "8b": {"hidden_size": 4096, "num_hidden_layers": 32, "intermediate_size": 14336,
           "num_attention_heads": 32, "num_key_value_heads": 8, "tie_word_embeddings": False},
}  # fmt: skip


def build(
    out: Path, tokenizer_dir: Path, size: str, bits: int | None, context: int = 32_768
) -> Path:
    vocab, special = take_tokenizer(out, tokenizer_dir)
    config = {
        "model_type": "llama",
        "vocab_size": vocab,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "max_position_embeddings": context,
        **SIZES[size],
    }
    mx.random.seed(0)
    model = Model(ModelArgs.from_dict(config))
    model.set_dtype(mx.bfloat16)
    rows = model.lm_head if not config["tie_word_embeddings"] else model.model.embed_tokens
    rows.weight[mx.array(special)] = 0
    if bits:
        nn.quantize(model, group_size=64, bits=bits)
        config["quantization"] = {"group_size": 64, "bits": bits}
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("tokenizer_dir", type=Path)
    parser.add_argument("--size", choices=sorted(SIZES), default="1b")
    parser.add_argument("--bits", type=int, choices=[4, 8])
    parser.add_argument("--context", type=int, default=32_768, help="agents' prompts are long")
    args = parser.parse_args()
    print(build(args.out, args.tokenizer_dir, args.size, args.bits, args.context))


if __name__ == "__main__":
    main()

"""A random-weight llama with a real tokenizer: real MLX end to end, at test speed.

float32 throughout: MLX's CPU backend is fastest in float32 (float16 matmuls are emulated).
Special tokens get zero embedding rows, so with tied embeddings their logit is exactly 0 and
always loses to the maximum of the other ~49k random logits: the model never emits EOS, and
every generation runs to max_tokens, which keeps fault tests predictable.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def take_tokenizer(out: Path, tokenizer_dir: Path) -> tuple[int, list[int]]:
    """Copy the tokenizer into `out`; its vocabulary size and its special tokens' ids."""
    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copy(tokenizer_dir / name, out / name)
    tokenizer = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    added = tokenizer.get("added_tokens", [])
    vocab = 1 + max([*tokenizer["model"]["vocab"].values(), *(t["id"] for t in added)])
    return vocab, [t["id"] for t in added if t.get("special")]


def build_tiny_model(
    out: Path,
    tokenizer_dir: Path,
    *,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    context: int = 2048,
    kv_heads: int | None = None,
    ffn: int | None = None,
    dtype: str = "float32",
) -> Path:
    """Write a seeded random llama MLX model dir to `out`, with `tokenizer_dir`'s tokenizer.
    Not only tiny: `python -m tests.tinymodel OUT TOKENIZER_DIR --hidden 2048 --layers 16
    --heads 32 --kv-heads 8 --ffn 8192 --dtype bfloat16` is a 1B llama for GPU benchmarks."""
    vocab, special = take_tokenizer(out, tokenizer_dir)
    kv_heads, ffn = kv_heads or heads // 2, ffn or 2 * hidden
    head_dim = hidden // heads
    config = {
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "intermediate_size": ffn,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "vocab_size": vocab,
        "max_position_embeddings": context,
        "tie_word_embeddings": True,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))

    rng = np.random.default_rng(0)

    def normal(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape, dtype=np.float32) / np.float32(np.sqrt(shape[-1]))

    ones = np.ones(hidden, dtype=np.float32)
    embed = normal(vocab, hidden)
    embed[special] = 0
    weights = {"model.embed_tokens.weight": embed, "model.norm.weight": ones}
    for i in range(layers):
        p = f"model.layers.{i}"
        weights |= {
            f"{p}.self_attn.q_proj.weight": normal(heads * head_dim, hidden),
            f"{p}.self_attn.k_proj.weight": normal(kv_heads * head_dim, hidden),
            f"{p}.self_attn.v_proj.weight": normal(kv_heads * head_dim, hidden),
            f"{p}.self_attn.o_proj.weight": normal(hidden, heads * head_dim),
            f"{p}.mlp.gate_proj.weight": normal(ffn, hidden),
            f"{p}.mlp.up_proj.weight": normal(ffn, hidden),
            f"{p}.mlp.down_proj.weight": normal(hidden, ffn),
            f"{p}.input_layernorm.weight": ones,
            f"{p}.post_attention_layernorm.weight": ones,
        }
    arrays = {k: mx.array(v).astype(getattr(mx, dtype)) for k, v in weights.items()}
    mx.save_safetensors(str(out / "model.safetensors"), arrays, metadata={"format": "mlx"})
    return out


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="a random-weight llama MLX model dir")
    parser.add_argument("out", type=Path)
    parser.add_argument("tokenizer_dir", type=Path)
    for name in ("hidden", "layers", "heads", "context", "kv-heads", "ffn"):
        parser.add_argument("--" + name, type=int)
    parser.add_argument("--dtype", default="float32")
    args = vars(parser.parse_args())
    sizes = {k: v for k, v in args.items() if v is not None and k not in ("out", "tokenizer_dir")}
    print(build_tiny_model(args["out"], args["tokenizer_dir"], **sizes))

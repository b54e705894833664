"""A random-weight SmolVLM (idefics3 family) with a real tokenizer, for mlx-vlm at test speed.

SmolVLM is SmolLM2 plus a SigLIP vision tower: our SmolLM2 tokenizer only needs SmolVLM's image
tokens added. The vision tower sees 32x32 tiles in 8x8 patches; with the pixel shuffle (scale
2) each tile becomes 4 image tokens. The image processor resizes the longest edge to 64 and
splits it into 32-pixel tiles plus a global one: a 64x64 image is 5 tiles, 20 image tokens.

As in `tinymodel`, special tokens get zero rows in the (copied) embedding and output matrices:
their logit is exactly 0 and always loses to the maximum of the other random logits, so the
model never emits EOS and every generation runs to max_tokens. float32 throughout (fastest on
MLX's CPU backend). Weight names and shapes come from mlx-vlm's own model class.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

IMAGE_TOKENS = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"]
GRID = 8  # <row_i_col_j> tokens for up to GRID x GRID tiles
TILE, PATCH, SCALE = 32, 8, 2
IMAGE_SEQ_LEN = (TILE // PATCH) ** 2 // SCALE**2

# SmolVLM-Instruct's own template: content is a list of {"type": "text"|"image"} parts.
CHAT_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)


def build_tiny_vlm(
    out: Path,
    tokenizer_dir: Path,
    *,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    vision_hidden: int = 32,
    longest_edge: int = 2 * TILE,
    resize: bool = True,
    context: int = 2048,
) -> Path:
    """Write a seeded random SmolVLM MLX model dir to `out`, from `tokenizer_dir`'s SmolLM2
    tokenizer. `longest_edge` is the image processor's resize target (a multiple of 32);
    with `resize=False` images keep their size, so their token count grows with their area."""
    out.mkdir(parents=True, exist_ok=True)
    vocab, eou = _write_tokenizer(out, tokenizer_dir)
    image_token_id = vocab - len(IMAGE_TOKENS) - GRID * GRID + 1
    config: dict[str, Any] = {
        "model_type": "smolvlm",
        "architectures": ["SmolVLMForConditionalGeneration"],
        "image_token_id": image_token_id,
        "scale_factor": SCALE,
        "vocab_size": vocab,
        "eos_token_id": eou,
        "text_config": {
            "model_type": "llama",
            "hidden_size": hidden,
            "intermediate_size": 2 * hidden,
            "num_attention_heads": heads,
            "num_key_value_heads": heads // 2,
            "num_hidden_layers": layers,
            "rms_norm_eps": 1e-5,
            "rope_theta": 100000.0,
            "vocab_size": vocab,
            "max_position_embeddings": context,
            "tie_word_embeddings": False,
        },
        "vision_config": {
            "model_type": "smolvlm_vision",
            "hidden_size": vision_hidden,
            "intermediate_size": 2 * vision_hidden,
            "num_attention_heads": 2,
            "num_hidden_layers": 1,
            "patch_size": PATCH,
            "image_size": TILE,
            "num_channels": 3,
            "layer_norm_eps": 1e-6,
        },
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    image_processor = {
        "image_processor_type": "SmolVLMImageProcessor",
        "processor_class": "SmolVLMProcessor",
        "do_convert_rgb": True,
        "do_resize": resize,
        "size": {"longest_edge": longest_edge},
        "resample": 1,
        "do_image_splitting": True,
        "max_image_size": {"longest_edge": TILE},
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "do_pad": True,
    }
    (out / "preprocessor_config.json").write_text(json.dumps(image_processor, indent=2))
    processor = {"processor_class": "SmolVLMProcessor", "image_seq_len": IMAGE_SEQ_LEN}
    (out / "processor_config.json").write_text(json.dumps(processor, indent=2))
    (out / "chat_template.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE}))
    _write_weights(out, config, special=_special_ids(out))
    return out


def _write_tokenizer(out: Path, tokenizer_dir: Path) -> tuple[int, int]:
    """Copy the tokenizer with SmolVLM's image tokens appended; return (vocab, eou id)."""
    tokenizer = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    added = tokenizer.setdefault("added_tokens", [])
    base = 1 + max([*tokenizer["model"]["vocab"].values(), *(t["id"] for t in added)])
    grid = range(1, GRID + 1)
    names = IMAGE_TOKENS + [f"<row_{r}_col_{c}>" for r in grid for c in grid]
    for offset, name in enumerate(names):
        added.append(
            {
                "id": base + offset,
                "content": name,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        )
    (out / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    tok_config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    tok_config.pop("added_tokens_decoder", None)
    tok_config |= {
        "eos_token": "<end_of_utterance>",
        "chat_template": CHAT_TEMPLATE,
        "extra_special_tokens": {
            "image_token": "<image>",
            "fake_image_token": "<fake_token_around_image>",
            "global_image_token": "<global-img>",
            "end_of_utterance_token": "<end_of_utterance>",
        },
        "processor_class": "SmolVLMProcessor",
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))
    return base + len(names), base + IMAGE_TOKENS.index("<end_of_utterance>")


def _special_ids(out: Path) -> list[int]:
    added = json.loads((out / "tokenizer.json").read_text())["added_tokens"]
    return [t["id"] for t in added if t.get("special")]


def _write_weights(out: Path, config: dict[str, Any], special: list[int]) -> None:
    from mlx_vlm.utils import get_model_and_args, update_module_configs

    arch, _ = get_model_and_args(config)
    model_config = arch.ModelConfig.from_dict(config)
    model = arch.Model(update_module_configs(model_config, arch, config, ["text", "vision"]))
    rng = np.random.default_rng(0)
    weights: dict[str, mx.array] = {}
    for name, param in sorted(tree_flatten(model.parameters()), key=lambda kv: kv[0]):
        shape = tuple(param.shape)
        if name.endswith((".bias", "norm.weight", "norm1.weight", "norm2.weight")):
            fill = np.ones if name.endswith("weight") else np.zeros
            value = fill(shape, np.float32)
        else:
            value = rng.standard_normal(shape, dtype=np.float32)
            value /= np.float32(np.sqrt(np.prod(shape[1:])))
        weights[name] = mx.array(value)
    embed = np.array(weights["language_model.embed_tokens.weight"])
    embed[special] = 0
    weights["language_model.embed_tokens.weight"] = mx.array(embed)
    weights["language_model.lm_head.weight"] = mx.array(embed)
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})

"""A random-weight llama with a real tokenizer: real MLX end to end, at test speed.

float32 throughout: MLX's CPU backend is fastest in float32 (float16 matmuls are emulated).
Special tokens get zero embedding rows, so with tied embeddings their logit is exactly 0 and
always loses to the maximum of the other ~49k random logits: the model never emits EOS, and
every generation runs to max_tokens, which keeps fault tests predictable.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    shape = Llama(vocab, hidden, layers, heads, kv_heads, ffn, context, tied=True)
    save(out, shape.random(shape.write_config(out), special), dtype)
    return out


END_LOGIT = 64.0  # EOS's logit, before the final norm's scale: far above any random one


def build_eos_model(out: Path, tokenizer_dir: Path) -> Path:
    """A random llama whose greedy answer to any prompt is its end token at once, as a model
    that answers with end-of-turn does: only generation with end tokens suppressed (the
    canary's) gets tokens from it, and those are the random model's own.

    Dimension 0 of the residual stream is 1 for every token and no layer writes to it; the
    untied `lm_head` reads it only for EOS, with a weight that always wins; its other rows
    are the embedding's without dimension 0."""
    from transformers import AutoTokenizer

    vocab, special = take_tokenizer(out, tokenizer_dir)
    shape = Llama(vocab, 64, 2, heads=4, kv_heads=2, ffn=128, context=2048, tied=False)
    weights = shape.random(shape.write_config(out), special)
    embed = weights["model.embed_tokens.weight"]
    embed[:, 0] = 1
    for name, weight in weights.items():
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            weight[0] = 0  # the layer's output in dimension 0
    head = embed.copy()
    head[:, 0] = 0
    eos = AutoTokenizer.from_pretrained(str(out)).eos_token_id
    head[eos] = 0
    head[eos, 0] = END_LOGIT
    save(out, weights | {"lm_head.weight": head})
    return out


@dataclass(frozen=True)
class Llama:
    """A llama's sizes: its config, and a layer's seeded random weights."""

    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    context: int
    tied: bool
    rope_theta: float = 10000.0

    @property
    def ones(self) -> np.ndarray:
        return np.ones(self.hidden, dtype=np.float32)

    def random(
        self, normal: Callable[..., np.ndarray], special: list[int]
    ) -> dict[str, np.ndarray]:
        """Every weight but an untied `lm_head`, seeded random; the `special` tokens' rows
        of the embedding are zero."""
        embed = normal(self.vocab, self.hidden)
        embed[special] = 0
        weights = {"model.embed_tokens.weight": embed, "model.norm.weight": self.ones}
        for i in range(self.layers):
            weights |= self.layer(i, normal)
        return weights

    def write_config(self, out: Path) -> Callable[..., np.ndarray]:
        """Write config.json; the seeded draw of normal weights, scaled by fan-in."""
        config = {
            "model_type": "llama",
            "hidden_size": self.hidden,
            "num_hidden_layers": self.layers,
            "intermediate_size": self.ffn,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "rms_norm_eps": 1e-5,
            "rope_theta": self.rope_theta,
            "vocab_size": self.vocab,
            "max_position_embeddings": self.context,
            "tie_word_embeddings": self.tied,
        }
        (out / "config.json").write_text(json.dumps(config, indent=2))
        rng = np.random.default_rng(0)
        return lambda *shape: (
            rng.standard_normal(shape, dtype=np.float32) / np.float32(np.sqrt(shape[-1]))
        )

    def layer(
        self, i: int, normal: Callable[..., np.ndarray], silent: bool = False
    ) -> dict[str, np.ndarray]:
        """Layer `i`'s weights; a `silent` layer adds nothing to the residual stream."""
        hidden, ffn, head_dim = self.hidden, self.ffn, self.hidden // self.heads
        out = (lambda *shape: np.zeros(shape, np.float32)) if silent else normal
        p = f"model.layers.{i}"
        return {
            f"{p}.self_attn.q_proj.weight": normal(self.heads * head_dim, hidden),
            f"{p}.self_attn.k_proj.weight": normal(self.kv_heads * head_dim, hidden),
            f"{p}.self_attn.v_proj.weight": normal(self.kv_heads * head_dim, hidden),
            f"{p}.self_attn.o_proj.weight": out(hidden, self.heads * head_dim),
            f"{p}.mlp.gate_proj.weight": normal(ffn, hidden),
            f"{p}.mlp.up_proj.weight": normal(ffn, hidden),
            f"{p}.mlp.down_proj.weight": out(hidden, ffn),
            f"{p}.input_layernorm.weight": self.ones,
            f"{p}.post_attention_layernorm.weight": self.ones,
        }


def save(out: Path, weights: dict[str, np.ndarray], dtype: str = "float32") -> None:
    arrays = {k: mx.array(v).astype(getattr(mx, dtype)) for k, v in weights.items()}
    mx.save_safetensors(str(out / "model.safetensors"), arrays, metadata={"format": "mlx"})


def tool_template(result_mark: str = "") -> str:
    """A template in LFM2's tool-call format (mlx-lm's `pythonic` parser, which it infers
    from `<|tool_call_start|>` in the template): the tools listed in the system turn, an
    assistant's calls rendered back as `[name(key="value")]` between the markers, a tool's
    answer as a turn (its text after `result_mark`, where one is given)."""
    mark = "{% if message.role == 'tool' %}" + result_mark + "{% endif %}" if result_mark else ""
    return (
        "{%- if tools %}<|im_start|>system\nList of tools: <|tool_list_start|>"
        "{{ tools | tojson }}<|tool_list_end|><|im_end|>\n{% endif %}"
        "{%- for message in messages %}<|im_start|>{{ message.role }}\n"
        f"{mark}{{% if message.content is string %}}{{{{ message.content }}}}{{% endif %}}"
        "{% if message.tool_calls %}<|tool_call_start|>["
        "{%- for call in message.tool_calls %}{% if not loop.first %}, {% endif %}"
        "{{ call.function.name }}("
        "{%- for key, value in call.function.arguments.items() %}"
        "{% if not loop.first %}, {% endif %}{{ key }}={{ value | tojson }}{% endfor %})"
        "{%- endfor %}]<|tool_call_end|>{% endif %}<|im_end|>\n{% endfor %}"
        "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )


TOOL_TEMPLATE = tool_template()
TOOL_MARKERS = ("<|tool_call_start|>", "<|tool_call_end|>")
TOOL_SCRIPT = '<|tool_call_start|>[get_weather(city="Paris")]<|tool_call_end|>'


def add_tokens(out: Path, tokenizer_dir: Path, added: tuple[str, ...], chat_template: str) -> int:
    """Copy the tokenizer into `out` with `added` as single (special) tokens, as tool-call
    markers are in the models that use them, and `chat_template` as its template; the
    vocabulary's size."""
    take_tokenizer(out, tokenizer_dir)
    spec = json.loads((out / "tokenizer.json").read_text())
    known = {t["content"] for t in spec["added_tokens"]}
    next_id = 1 + max([*spec["model"]["vocab"].values(), *(t["id"] for t in spec["added_tokens"])])
    for content in added:
        if content not in known:
            spec["added_tokens"].append(
                {
                    "id": next_id,
                    "content": content,
                    "single_word": False,
                    "lstrip": False,
                    "rstrip": False,
                    "normalized": False,
                    "special": True,
                }
            )
            next_id += 1
    (out / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False))
    config = json.loads((out / "tokenizer_config.json").read_text())
    (out / "tokenizer_config.json").write_text(
        json.dumps({**config, "chat_template": chat_template}, indent=2)
    )
    return next_id


def trigger(tokenizer: Any) -> int:
    """The generation prompt's last token: the one every chat answer follows."""
    hello = [{"role": "user", "content": "hello"}]
    rendered = tokenizer.apply_chat_template(hello, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(rendered, add_special_tokens=False)[-1]


def distinct(tokenizer: Any, chain: list[int], *others: int) -> None:
    """A chain of tokens, each mapped to the next, must not repeat one, nor hold `others`."""
    if len(set(chain)) < len(chain) or set(others) & set(chain):
        pieces = tokenizer.convert_ids_to_tokens(chain)
        raise ValueError(f"the trigger and script tokens must be distinct: {pieces}")


def build_scripted_model(
    out: Path,
    tokenizer_dir: Path,
    text: str = TOOL_SCRIPT,
    *,
    chat_template: str = TOOL_TEMPLATE,
    added: tuple[str, ...] = TOOL_MARKERS,
    hidden: int = 64,
) -> Path:
    """A llama whose greedy answer to any chat is exactly `text`, then EOS.

    Its only layer's output projections (`o_proj`, `down_proj`) are zero, so the residual
    stream is the current token's embedding and the next token a function of the current one
    alone: the generation prompt's last token (the trigger) and each token of `text` get their
    own embedding direction, which the untied `lm_head` maps to the token that follows it in
    the script, and the script's last to EOS. Every other token maps to "." (so a plain prompt,
    like the supervisor's canary, gets an answer: dots up to max_tokens). So the script's
    tokens must be distinct, and differ from the trigger and "." (checked). `added` become
    single (special) tokens of the tokenizer, as tool-call markers are in the models that use
    them.
    """
    from transformers import AutoTokenizer

    vocab = add_tokens(out, tokenizer_dir, added, chat_template)
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    eos = tokenizer.eos_token_id
    (filler,) = tokenizer.encode(".", add_special_tokens=False)
    chain = [trigger(tokenizer), *tokenizer.encode(text, add_special_tokens=False)]
    distinct(tokenizer, chain, eos, filler)
    if len(chain) + 1 > hidden:
        raise ValueError(f"{len(chain)} script tokens need hidden > {len(chain)}")

    shape = Llama(vocab, hidden, 1, heads=4, kv_heads=2, ffn=2 * hidden, context=2048, tied=False)
    normal = shape.write_config(out)

    # Direction 0: any token off the script; direction k + 1: the chain's k-th token.
    embed = np.zeros((vocab, hidden), dtype=np.float32)
    embed[:, 0] = 1
    # RMSNorm makes a one-hot row sqrt(hidden) long: logits of 4 * 8 = 32 against 0, so even
    # sampling at temperature 1 follows the script.
    head = np.zeros((vocab, hidden), dtype=np.float32)
    head[filler, 0] = 4
    for k, token in enumerate(chain):
        embed[token] = 0
        embed[token, k + 1] = 1
        follower = chain[k + 1] if k + 1 < len(chain) else eos
        head[follower, k + 1] = 4
    weights = {
        "model.embed_tokens.weight": embed,
        "model.norm.weight": shape.ones,
        "lm_head.weight": head,
        **shape.layer(0, normal, silent=True),
    }
    save(out, weights)
    return out


THINK_MARKERS = ("<think>", "</think>")  # what mlx-lm detects a thinking model by
THINKING = " Let me see"  # the thinking model's thinking, then its answer
ANSWER = " Paris indeed"


def thinking_template(opens: bool) -> str:
    """A chat template that marks thinking as Qwen3's does: `enable_thinking` false closes an
    empty thinking block in the generation prompt; with `opens`, the generation prompt opens
    the block otherwise (as DeepSeek-R1's and Qwen3-Thinking's do)."""
    thinking = "<think>" if opens else ""
    return (
        "{%- for message in messages %}<|im_start|>{{ message.role }}\n"
        "{{ message.content }}<|im_end|>\n{% endfor %}"
        "{%- if add_generation_prompt %}<|im_start|>assistant\n"
        "{% if enable_thinking is defined and enable_thinking is false %}<think></think>"
        f"{{%- else %}}{thinking}{{% endif %}}{{% endif %}}"
    )


def build_thinking_model(out: Path, tokenizer_dir: Path, *, opens: bool = False) -> Path:
    """A llama whose tokenizer marks thinking (`<think>`, `</think>`) and whose greedy
    answer to any chat is `<think>` THINKING `</think>` ANSWER, then EOS (a scripted model:
    `build_scripted_model`). With thinking disabled (`enable_thinking=False`) the template
    closes the block itself and the answer is ANSWER alone; with `opens`, the template opens
    the block and the model goes on from there: the same answer."""
    text = THINKING + "</think>" + ANSWER
    return build_scripted_model(
        out,
        tokenizer_dir,
        text if opens else "<think>" + text,
        chat_template=thinking_template(opens),
        added=THINK_MARKERS,
    )


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

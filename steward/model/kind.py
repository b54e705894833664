"""What a model's files say of it, read without mlx: whether it generates (`chat`) or embeds
(`embedding`), and its context length (the worker's bound on prompts, and what `/v1/models`
shows of a model that has never loaded).

A model directory says so when it is unambiguous: a sentence-transformers layout
(`modules.json`, which every sentence-transformers model has, decoder-based embedders such
as Qwen3-Embedding included) or an encoder architecture (BERT and its kin cannot generate).
Anything else is a chat model; `--model-kind embedding` serves a decoder without that
layout (E5-mistral, gte-Qwen as plain checkpoints) as an embedder.
"""

from __future__ import annotations

import json
from pathlib import Path

from steward.model.resolve import ModelSource

KINDS = ("chat", "embedding")
# model_type of encoders: no causal head, so an embedder whatever steward can load of it
ENCODERS = frozenset({"bert", "roberta", "xlm-roberta", "nomic_bert", "modernbert"})


def detect(source: ModelSource) -> str:
    """`embedding` when the model's files say so, else `chat`."""
    if source.kind != "mlx":  # a GGUF file: a llama-family chat model (model/gguf.py)
        return "chat"
    if (source.path / "modules.json").is_file():
        return "embedding"
    return "embedding" if model_type(source.path) in ENCODERS else "chat"


def resolve(asked: str, source: ModelSource) -> str:
    """`--model-kind`: as asked, or detected for `auto`."""
    if asked == "auto":
        return detect(source)
    if asked not in KINDS:
        raise ValueError(f"--model-kind {asked}: must be auto, {' or '.join(KINDS)}")
    return asked


def model_type(model_dir: Path) -> str:
    config = json.loads((model_dir / "config.json").read_text())
    return str(config.get("model_type", ""))


def context_length(model_dir: Path) -> int:
    config = json.loads((model_dir / "config.json").read_text())
    text_config = config.get("text_config", config)
    for key in ("max_position_embeddings", "max_seq_len", "n_positions", "seq_length"):
        if isinstance(text_config.get(key), int):
            return text_config[key]
    return 4096


def declared_context(source: ModelSource | None) -> int | None:
    """A model directory's context length, before any worker loads it (None: a GGUF file
    not imported yet, whose length its import writes)."""
    if source is None or source.kind != "mlx" or not (source.path / "config.json").is_file():
        return None
    return context_length(source.path)

"""Whether a model generates (`chat`) or embeds (`embedding`), from its files, without mlx.

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

"""A random-weight decoder embedder with a real tokenizer, laid out as sentence-transformers
lays out Qwen3-Embedding: the model, `modules.json`, a `Pooling` module's config (last
token) and `Normalize`. Detected as kind `embedding` from these files alone.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.tinymodel import build_tiny_model

ST = "sentence_transformers.models."


def build_tiny_embedder(
    out: Path,
    tokenizer_dir: Path,
    *,
    pooling: str = "lasttoken",
    matryoshka: bool = True,
    context: int = 256,
) -> Path:
    """A tiny llama (hidden 64) whose vectors pool by `pooling` (a sentence-transformers
    `pooling_mode_*` name); `matryoshka` marks it trained for truncated dimensions."""
    build_tiny_model(out, tokenizer_dir, context=context)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(config | {"is_matryoshka": matryoshka}))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": ST + "Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": ST + "Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": ST + "Normalize"},
    ]
    (out / "modules.json").write_text(json.dumps(modules))
    (out / "1_Pooling").mkdir(exist_ok=True)
    modes = ("cls_token", "mean_tokens", "max_tokens", "lasttoken")
    flags = {f"pooling_mode_{mode}": mode == pooling for mode in modes}
    (out / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 64, **flags})
    )
    (out / "2_Normalize").mkdir(exist_ok=True)
    return out

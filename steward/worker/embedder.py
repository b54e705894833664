"""An embedding model: inputs (texts or token ids) in, one vector each out.

Decoder-based embedders run on mlx-lm's own models (Qwen3-Embedding, E5-mistral, gte-Qwen:
any architecture mlx-lm loads), read as their final hidden states and pooled. mlx-embeddings
(which also has BERT-family encoders) is not used: it is GPLv3, which an Apache-2.0 server
cannot take on as a dependency, and it pulls in mlx-vlm; so encoders are not served yet.

How a model pools is read from its sentence-transformers files when it has them
(`modules.json`: a `Pooling` module's config, and whether a `Normalize` follows), else a
decoder's usual: the last token, unit length. A layer after pooling (`Dense`) is refused:
leaving it out would answer vectors the model never meant. Right padding needs no mask in a
causal model (no valid position attends to a later one), so a batch of unequal inputs
pools exactly what each alone would.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from steward.model.kind import ENCODERS, model_type
from steward.model.resolve import ModelError
from steward.wire.protocol import Embed, Rejected
from steward.worker.backend import (
    PREPARE_ERRORS,
    context_length,
    max_token_chars,
    unpreparable,
    vocab_size,
)
from steward.worker.injection import Injector

MODES = {  # sentence-transformers' pooling flags, and the ones served
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_lasttoken": "last",
}
ST = "sentence_transformers.models."


@dataclass(frozen=True)
class Pooling:
    mode: str  # cls, mean or last
    normalize: bool

    @classmethod
    def read(cls, model_dir: Path) -> Pooling:
        """From `modules.json` and its `Pooling` module; a decoder's default without them."""
        if not (model_dir / "modules.json").is_file():
            return cls("last", True)
        modules = json.loads((model_dir / "modules.json").read_text())
        kinds = [str(m.get("type", "")).removeprefix(ST) for m in modules]
        if unknown := [k for k in kinds if k not in ("Transformer", "Pooling", "Normalize")]:
            raise ModelError(f"{model_dir}: sentence-transformers module {unknown[0]} not served")
        pooling = next((m for m in modules if m.get("type") == ST + "Pooling"), None)
        if pooling is None:
            return cls("last", "Normalize" in kinds)
        config = json.loads((model_dir / pooling["path"] / "config.json").read_text())
        on = [flag for flag, value in config.items() if flag.startswith("pooling_mode_") and value]
        if len(on) != 1 or on[0] not in MODES:
            raise ModelError(f"{model_dir}: pooling {on} not served (one of {sorted(MODES)})")
        return cls(MODES[on[0]], "Normalize" in kinds)


@dataclass(frozen=True)
class Matryoshka:
    """Which `dimensions` a model was trained to be cut to (vLLM's reading of config.json:
    `matryoshka_dimensions`, or `is_matryoshka` for any)."""

    full: int
    allowed: tuple[int, ...] | None  # None: any from 1 to `full`
    trained: bool

    @classmethod
    def read(cls, config: dict[str, Any], full: int) -> Matryoshka:
        listed = config.get("matryoshka_dimensions")
        allowed = tuple(int(d) for d in listed) if isinstance(listed, list) else None
        return cls(full, allowed, allowed is not None or bool(config.get("is_matryoshka")))

    def refusal(self, dimensions: int | None) -> str | None:
        """Why `dimensions` cannot be served, if it cannot."""
        if dimensions is None or dimensions == self.full:
            return None
        if not self.trained:
            return (
                f"dimensions: this model does not support Matryoshka truncation; it answers "
                f"{self.full} dimensions only"
            )
        if self.allowed is not None and dimensions not in self.allowed:
            return f"dimensions: this model supports {list(self.allowed)}"
        if dimensions > self.full:
            return f"dimensions: at most {self.full} for this model"
        return None


class Embedder:
    """The model, its tokenizer, its pooling: `prepare` a request, `forward` a batch."""

    batches = True  # requests embedded together (embedding_engine.py)
    thinking = False

    def __init__(self, model_dir: Path, injector: Injector, max_tokens: int) -> None:
        if (kind := model_type(model_dir)) in ENCODERS:
            raise ModelError(f"{model_dir}: encoder models ({kind}) are not served yet")
        from mlx_lm import load

        self.injector = injector
        injector.hit("load")
        self.pooling = Pooling.read(model_dir)
        model, self.tokenizer = load(str(model_dir))
        self.network = getattr(model, "model", None)  # the decoder without its head
        if self.network is None:
            raise ModelError(f"{model_dir}: {kind} has no hidden states to pool")
        config = json.loads((model_dir / "config.json").read_text())
        self.dimensions = int(config.get("hidden_size") or model.args.hidden_size)
        self.matryoshka = Matryoshka.read(config, self.dimensions)
        self.context_length = context_length(model_dir)
        self.max_token_chars = max_token_chars(self.tokenizer)
        rows = getattr(getattr(self.network, "embed_tokens", None), "weight", None)
        self.vocab_size = rows.shape[0] if rows is not None else vocab_size(model, self.tokenizer)
        self.max_tokens = max_tokens  # a request's inputs, in all

    def prepare(self, req: Embed) -> list[list[int]] | Rejected:
        """Each input's token ids; a request that cannot be served gets its 400 here."""
        if why := self.matryoshka.refusal(req.dimensions):
            return Rejected(req.id, "validation_error", why)
        try:
            inputs = [
                item if isinstance(item, list) else self.tokenizer.encode(item)
                for item in req.inputs
            ]
        except PREPARE_ERRORS as exc:
            return unpreparable(req, exc)
        for i, ids in enumerate(inputs):
            if not ids:
                return Rejected(req.id, "validation_error", f"input[{i}]: no tokens")
            if len(ids) > self.context_length:
                return Rejected(
                    req.id,
                    "context_length_exceeded",
                    f"input[{i}]: {len(ids)} tokens, more than this model's maximum context "
                    f"length of {self.context_length}",
                )
            if bad := [t for t in ids if not 0 <= t < self.vocab_size]:
                return Rejected(
                    req.id,
                    "validation_error",
                    f"input[{i}]: token {bad[0]} is not in the vocabulary",
                )
        if (total := sum(map(len, inputs))) > self.max_tokens:
            return Rejected(
                req.id,
                "validation_error",
                f"input: {total} tokens in all, more than {self.max_tokens} "
                "(--max-embedding-tokens)",
            )
        return inputs

    def forward(self, inputs: list[list[int]]) -> np.ndarray:
        """One forward of right-padded inputs: their pooled vectors, float32, not normalized."""
        width = max(map(len, inputs))
        padded = mx.array([ids + [0] * (width - len(ids)) for ids in inputs])
        lengths = mx.array([len(ids) for ids in inputs])
        hidden = self.network(padded).astype(mx.float32)
        if self.pooling.mode == "cls":
            pooled = hidden[:, 0]
        elif self.pooling.mode == "last":
            pooled = hidden[mx.arange(len(inputs)), lengths - 1]
        else:
            mask = (mx.arange(width)[None, :] < lengths[:, None]).astype(mx.float32)
            pooled = (hidden * mask[..., None]).sum(axis=1) / lengths[:, None]
        return np.array(pooled, dtype=np.float32)

    def finish(self, vectors: np.ndarray, dimensions: int | None) -> bytes:
        """A request's vectors as it asked for them: cut to `dimensions`, then unit length
        (when the model normalizes), as little-endian float32."""
        cut = vectors[:, : dimensions or self.dimensions]
        if self.pooling.normalize:
            cut = cut / np.maximum(np.linalg.norm(cut, axis=1, keepdims=True), 1e-12)
        return cut.astype("<f4").tobytes()

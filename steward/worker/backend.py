"""The MLX backend: one loaded model and its tokenizer, and what turns a request into
prompt tokens (engine.py batches the generations).

Everything that touches mlx lives in `steward.worker` and `steward.model.gguf`; the front
never imports either. Request-level problems (a prompt too long, a template that refuses
the messages) come back as `Rejected`; anything the backend raises propagates, to be
reported as `Failed` and classified by the supervisor.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from mlx_lm import load

from steward.worker.injection import Injector
from steward.worker.protocol import Generate, Rejected


def context_length(model_dir: Path) -> int:
    config = json.loads((model_dir / "config.json").read_text())
    text_config = config.get("text_config", config)
    for key in ("max_position_embeddings", "max_seq_len", "n_positions", "seq_length"):
        if isinstance(text_config.get(key), int):
            return text_config[key]
    return 4096


# What templating and tokenising raise for a request they cannot handle (a template's
# `raise_exception`, a role it does not know): that request's 400, never a backend fault.
PREPARE_ERRORS = (ValueError, TypeError, KeyError, IndexError, TemplateError)


def unpreparable(req: Generate, exc: Exception) -> Rejected:
    return Rejected(
        req.id, "validation_error", f"The prompt could not be prepared: {type(exc).__name__}: {exc}"
    )


def max_token_chars(tokenizer: Any) -> int:
    """The longest token's text, in characters: a token's string in the vocabulary is at
    least as long as the text it decodes to (byte-level BPE: a character per byte;
    SentencePiece: `▁` per space, `<0x..>` per byte)."""
    return max((len(token) for token in tokenizer.get_vocab()), default=1)


class Backend:
    batches = True  # engine.py decodes its requests together

    def __init__(self, model_dir: Path, injector: Injector) -> None:
        self.injector = injector
        injector.hit("load")
        self.model, self.tokenizer = load(str(model_dir))
        self.context_length = context_length(model_dir)
        self.max_token_chars = max_token_chars(self.tokenizer)

    def encode(self, req: Generate) -> list[int]:
        if req.messages is not None:
            return list(
                self.tokenizer.apply_chat_template(req.messages, add_generation_prompt=True)
            )
        return list(self.tokenizer.encode(req.prompt or ""))


def over_context(req: Generate, context_length: int, prompt_tokens: int) -> Rejected | None:
    """A prompt and its completion must fit the context: else a 400 for the request, no fault."""
    wanted = req.max_tokens or 1
    if context_length - prompt_tokens >= wanted:
        return None
    return Rejected(
        req.id,
        "context_length_exceeded",
        f"This model's maximum context length is {context_length} tokens; the prompt has "
        f"{prompt_tokens} tokens and {wanted} were requested for the "
        "completion.",
    )

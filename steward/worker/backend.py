"""The MLX backend: one loaded model, one generation at a time, fault points wired in.

Everything that touches mlx lives here and in `steward.model.gguf`; the front never
imports either. Request-level problems (a prompt too long) come back as `Rejected`;
anything the backend raises propagates, to be reported as `Failed` and classified by
the supervisor.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import mlx.core as mx
from jinja2 import TemplateError
from mlx_lm import load, stream_generate
from mlx_lm.sample_utils import make_sampler

from steward.worker.injection import Injector
from steward.worker.protocol import (
    Done,
    FromWorker,
    Generate,
    Progress,
    Rejected,
    Token,
    prompt_text,
)
from steward.worker.stops import StopMatcher


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

    def generate(
        self,
        req: Generate,
        emit: Callable[[FromWorker], None],
        cancelled: Callable[[], bool],
    ) -> Done | Rejected:
        try:
            tokens = self.encode(req)
        except PREPARE_ERRORS as exc:
            return unpreparable(req, exc)
        if rejected := over_context(req, self.context_length, len(tokens)):
            return rejected
        room = self.context_length - len(tokens)
        self.injector.hit("prefill", req.seq, req.attempt, prompt_text(req))
        if req.seed is not None:
            mx.random.seed(req.seed)
        start = time.perf_counter()
        outputs = stream_generate(
            self.model,
            self.tokenizer,
            tokens,
            max_tokens=req.max_tokens or room,
            sampler=make_sampler(req.temperature, req.top_p),
            prompt_progress_callback=lambda *_: emit(Progress(req.id)),
        )
        # mlx-lm's last response, when generation met EOS, carries the EOS: not a token.
        return relay(
            req,
            outputs,
            lambda out: out.finish_reason != "stop",
            len(tokens),
            start,
            emit,
            cancelled,
            self.injector,
        )


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


def relay(
    req: Generate,
    outputs: Iterable[Any],
    is_token: Callable[[Any], bool],
    prompt_tokens: int,
    start: float,
    emit: Callable[[FromWorker], None],
    cancelled: Callable[[], bool],
    injector: Injector,
) -> Done:
    """A generator's responses to `Token` messages and a `Done`: stop strings, the decode
    fault point, cancellation and timings, the same for every backend."""
    text = prompt_text(req)
    stops = StopMatcher(req.stop)
    first, count, finish = start, 0, "length"
    for step, out in enumerate(outputs):
        real = is_token(out)
        if step == 0:
            first = time.perf_counter()
        elif real:
            injector.hit("decode", req.seq, req.attempt, text)
        count += real
        piece, stopped = stops.feed(out.text)
        if stopped or out.finish_reason:
            piece += "" if stopped else stops.flush()
            finish = "stop" if stopped or out.finish_reason == "stop" else "length"
        if piece or real:
            emit(Token(req.id, int(out.token) if real else -1, piece))
        if stopped or cancelled():
            finish = finish if stopped else "cancelled"
            break
    elapsed = time.perf_counter() - first
    return Done(
        req.id,
        finish,
        prompt_tokens=prompt_tokens,
        completion_tokens=count,
        ttft=first - start,
        decode_tps=(count - 1) / elapsed if count > 1 and elapsed > 0 else 0.0,
    )

"""The MLX backend: one loaded model and its tokenizer, and what turns a request into
prompt tokens (engine.py batches the generations).

Everything that touches mlx lives in `steward.worker` and `steward.model.gguf`; the front
never imports either. Request-level problems (a prompt too long, a template that refuses
the messages) come back as `Rejected`; anything the backend raises propagates, to be
reported as `Failed` and classified by the supervisor.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from mlx_lm import load
from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.utils import load_model

from steward.model.kind import context_length
from steward.wire.protocol import Generate, Rejected
from steward.worker.answer import Answer
from steward.worker.grammar import BatchStep, Grammars
from steward.worker.injection import Injector
from steward.worker.logits import Processor
from steward.worker.logprobs import Logprobs
from steward.worker.reasoning import ReasoningSplit, split_for
from steward.worker.toolcalls import FORCED, ToolCalls

# What templating and tokenising raise for a request they cannot handle (a template's
# `raise_exception`, a role it does not know): that request's 400, never a backend fault.
PREPARE_ERRORS = (ValueError, TypeError, KeyError, IndexError, TemplateError)
PREDICTED_CHARS = 8  # characters a token, at most, of a prediction's text (prose and code: 3-5)


def unpreparable(req: Generate, exc: Exception) -> Rejected:
    return Rejected(
        req.id, "validation_error", f"The prompt could not be prepared: {type(exc).__name__}: {exc}"
    )


def max_token_chars(tokenizer: Any) -> int:
    """The longest token's text, in characters: a token's string in the vocabulary is at
    least as long as the text it decodes to (byte-level BPE: a character per byte;
    SentencePiece: `▁` per space, `<0x..>` per byte)."""
    return max((len(token) for token in tokenizer.get_vocab()), default=1)


class Shaping:
    """What a backend does to an answer beyond its model: the logits shaped (`logit_bias`,
    the penalties, a grammar), the log-probabilities read, the tool calls found. Text and
    vision backends alike, from mlx-lm's tokenizer."""

    def __init__(self, model: Any, tokenizer: TokenizerWrapper) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size(model, tokenizer)
        self.grammars = Grammars(tokenizer._tokenizer, sorted(tokenizer.eos_token_ids))
        self.end_tokens = set(tokenizer.eos_token_ids)  # what `ignore_eos` suppresses

    @property
    def thinking(self) -> bool:
        """The model marks its thinking (mlx-lm's detection, from the tokenizer)."""
        return bool(self.tokenizer.has_thinking)

    def template_options(self, req: Generate) -> dict[str, Any]:
        """What the chat template is given besides the messages: the tools, and thinking on
        or off (`enable_thinking`, which a template that has no thinking ignores): as the
        request says, else on where the model marks thinking. (mlx-lm's rule when unsaid;
        mlx-vlm's would be off, so it is always said.)"""
        options: dict[str, Any] = {"tools": req.tools} if req.tools else {}
        thinking = self.thinking if req.thinking is None else req.thinking
        return options | {"enable_thinking": thinking}

    @functools.cached_property
    def logprobs(self) -> Logprobs:
        return Logprobs(self.grammars.tokenizer.decode_bytes)

    def logits_processor(self, req: Generate) -> Processor | None:
        """What shapes the request's logits, if anything does. ValueError: a token id out
        of the vocabulary, a grammar that does not compile (the request's 400)."""
        if bad := [t for t in req.logit_bias if t >= self.vocab_size]:
            raise ValueError(f"logit_bias: token {bad[0]} is not in the vocabulary")
        grammar = self.grammars.start(req.grammar, list(req.resume)) if req.grammar else None
        processor = Processor(req, grammar, self.end_tokens if req.ignore_eos else ())
        return processor if processor.shapes else None

    def answer(self, req: Generate, prompt: list[int]) -> Answer:
        """How the answer to a prompt of these ids reaches the client (answer.py), past the
        tokens it already has."""
        split = self.reasoning_split(req, prompt)
        answer = Answer(self.tokenizer.detokenizer, req.stop, self.tool_calls(req), split)
        answer.resume(req.resume)
        return answer

    def reasoning_split(self, req: Generate, prompt: list[int]) -> ReasoningSplit | None:
        """A chat answer of a thinking model is split into thinking and answer; a raw
        completion is the model's text as it comes, and an answer under a grammar is all
        answer (the grammar allows no thinking)."""
        if req.messages is None or req.grammar is not None:
            return None
        return split_for(self.tokenizer, prompt)

    def tool_calls(self, req: Generate) -> ToolCalls | None:
        """How the answer's tool calls are found, if it may make any."""
        if req.calls in FORCED:
            return ToolCalls(req.calls, req.call_name, parallel=req.parallel_calls)
        tokenizer = self.tokenizer
        if req.calls != "auto" or not tokenizer.has_tool_calling:
            return None
        return ToolCalls(
            "auto",
            markers=(tokenizer.tool_call_start, tokenizer.tool_call_end or ""),
            parser=tokenizer.tool_parser,
            tools=req.tools,
            parallel=req.parallel_calls,
        )


class Backend(Shaping):
    batches = True  # engine.py decodes its requests together

    def __init__(
        self, model_dir: Path, injector: Injector, tokenizer: TokenizerWrapper | None = None
    ) -> None:
        """`tokenizer`: built already, as mlx-lm's `load` builds it (a warm spare's)."""
        self.injector = injector
        injector.hit("load")
        if tokenizer is None:
            self.model, tokenizer = load(str(model_dir))
        else:
            self.model, _ = load_model(model_dir)
        super().__init__(self.model, tokenizer)
        self.context_length = context_length(model_dir)
        self.max_token_chars = max_token_chars(tokenizer)
        self.batch_step = BatchStep(self.grammars.executor)

    def predicted(self, req: Generate) -> list[int]:
        """Its `prediction`'s tokens, no more than the context holds (no answer is longer).
        The text is cut first at `PREDICTED_CHARS` characters a token of the context: a
        client's 22 MB prediction would otherwise be tokenised whole (15 s of a CPU), and
        the longest token's characters (a run of whitespace, tens to hundreds) would let
        most of it through. A prediction of longer tokens loses drafts, never an answer."""
        text = req.prediction[: self.context_length * PREDICTED_CHARS]
        return list(self.tokenizer.encode(text, add_special_tokens=False))[: self.context_length]

    def encode(self, req: Generate) -> list[int]:
        if req.messages is not None:
            return list(
                self.tokenizer.apply_chat_template(
                    req.messages, add_generation_prompt=True, **self.template_options(req)
                )
            )
        return list(self.tokenizer.encode(req.prompt or ""))


def vocab_size(model: Any, tokenizer: Any) -> int:
    """The logits' width: the model's vocabulary (often padded past the tokenizer's)."""
    args = getattr(model, "args", None) or getattr(model, "config", None)  # mlx-lm, mlx-vlm
    text = getattr(args, "text_config", None)  # a vision model's language model, if any
    size = text.get("vocab_size") if isinstance(text, dict) else getattr(text, "vocab_size", None)
    size = size or getattr(args, "vocab_size", None)
    return size if isinstance(size, int) else len(tokenizer.get_vocab())


def over_context(req: Generate, context_length: int, prompt_tokens: int) -> Rejected | None:
    """A prompt and its completion must fit the context: else a 400 for the request, no
    fault, with the counts each dialect words its error with (errors.py `Overflow`)."""
    wanted = req.max_tokens or 1
    if context_length - prompt_tokens >= wanted:
        return None
    return Rejected(
        req.id,
        "context_length_exceeded",
        f"This model's maximum context length is {context_length} tokens; the prompt has "
        f"{prompt_tokens} tokens and {wanted} were requested for the completion.",
        prompt_tokens=prompt_tokens,
        context_length=context_length,
        completion_tokens=wanted,
    )

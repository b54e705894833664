"""What OpenAI's two generation dialects share (chat.py, completions.py): the sampling
parameters and their bounds, the answer's frame (ids, usage, timings, log-probabilities,
the stream's end and its error event), and `/v1/models`.

The rule for parameters (every dialect's): a parameter steward knows is honoured, accepted
as a no-op that changes nothing on a local server (`user`, `metadata`, `store: false`,
`service_tier`, ...: SDKs and agents send them), or refused with a 400 that names it where
it would change the answer and steward cannot do it; a value out of range is a 400 naming
the field. A parameter steward does not know is ignored, never refused: agents' CLIs send
new fields every few releases. It is left out of everything after validation, named in the
`steward-ignored` response header and logged once (ignored.py, `Schema` below);
`--strict-requests` refuses it instead, as OpenAI's own API does ("unrecognized request
argument"), for people who write clients.
"""

from __future__ import annotations

import math
import time
from abc import abstractmethod
from typing import Annotated, Any, Literal, Self

from fastapi import Request
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    model_validator,
)

from steward.errors import ApiError
from steward.front import backend, ignored
from steward.front.dialects.exchange import dialect_router
from steward.front.dialects.seam import Answer, sse
from steward.pool.names import listed_names
from steward.supervisor.jobs import Job
from steward.wire.protocol import Done, Logprob, TopLogprob

MAX_STOP = 4
MAX_STOP_CHARS = 256
MAX_NAME_CHARS = 256
MAX_TOKENS = 2**31 - 1  # the context length bounds it further, once the model is known
MAX_N = 128  # `--max-n` bounds it further
MAX_LOGIT_BIAS = 300
MAX_TOP_LOGPROBS = 20

Tokens = Annotated[int, Field(ge=1, le=MAX_TOKENS)]


class Schema(BaseModel):
    """No NaN or infinity in any float. A field steward does not know passes validation
    and is dropped at once, noted for the `steward-ignored` header (ignored.py)."""

    model_config = ConfigDict(allow_inf_nan=False, extra="allow")

    @model_validator(mode="wrap")
    @classmethod
    def _unknown(cls, value: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        model = handler(value)
        ignored.unknown(model, value)
        return model


class StreamOptions(Schema):
    include_usage: bool = False
    include_obfuscation: bool | None = None  # no obfuscation is ever added


class Sampling(Schema):
    """What chat and text completions share."""

    model: str | None = Field(None, max_length=256)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1, le=2**31 - 1, description="0 or -1: off (vLLM's)")
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(1.0, ge=0.1, le=10.0)  # scales a logit at most 10x
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = Field(
        None, max_length=MAX_LOGIT_BIAS
    )
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-(2**63), lt=2**64)
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    # Accepted, no effect on a local server.
    user: str | None = Field(None, max_length=MAX_NAME_CHARS)
    metadata: dict[str, str] | None = Field(None, max_length=16)
    store: Literal[False] | None = None
    service_tier: str | None = Field(None, max_length=64)  # one tier: every request alike

    @model_validator(mode="after")
    def _bounds(self) -> Sampling:
        stops = self.stop_list()
        if len(stops) > MAX_STOP or any(len(s) > MAX_STOP_CHARS for s in stops):
            raise ValueError(f"stop: at most {MAX_STOP} strings of {MAX_STOP_CHARS} characters")
        for key in self.logit_bias or {}:
            if not (key.isdigit() and int(key) < 2**31):
                raise ValueError(f"logit_bias: {key[:32]!r} is not a token id")
        return self

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else self.stop

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def sampling(self) -> dict[str, Any]:
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": max(self.top_k, 0),
            "min_p": self.min_p,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "repetition_penalty": self.repetition_penalty,
            "logit_bias": {int(k): v for k, v in (self.logit_bias or {}).items()},
            "stop": self.stop_list(),
            "seed": None if self.seed is None else self.seed % 2**32,
        }


def choices(request: Request, body: Sampling) -> int:
    """`n`, within `--max-n`."""
    most = request.app.state.config.max_n
    if body.n > most:
        raise ApiError("validation_error", f"n: at most {most} (--max-n)", param="n")
    return body.n


class OpenAIAnswer(Answer):
    """The frame of an OpenAI completion: what chat and text completion answers share."""

    object = ""  # "chat.completion" or "text_completion"
    chunk_object = ""  # a stream chunk's
    prefix = ""  # of the answer's id

    def __init__(self, model: str, request_id: str, include_usage: bool, logprobs: bool) -> None:
        self.model = model
        self.id = self.prefix + request_id[:48]
        self.created = int(time.time())
        self.include_usage = include_usage
        self.logprobs = logprobs

    def base(self, obj: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "steward",
        }

    @staticmethod
    def usage(dones: list[Done]) -> dict[str, Any]:
        """The prompt once, every choice's completion (as OpenAI counts `n` choices)."""
        prompt, cached = dones[0].prompt_tokens, dones[0].cached_tokens
        completion = sum(done.completion_tokens for done in dones)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        }

    @staticmethod
    def timings(done: Done) -> dict[str, float]:
        """The worker's own clock, as llama.cpp's server reports it: what HTTP and IPC add
        is the difference between these and what a client measures."""
        return {
            "cache_n": done.cached_tokens,
            "prompt_n": done.prompt_tokens - done.cached_tokens,
            "prompt_ms": round(done.ttft * 1e3, 3),
            "predicted_n": done.completion_tokens,
            "predicted_per_second": round(done.decode_tps, 2),
        }

    def full(self, jobs: list[Job], dones: list[Done]) -> dict[str, Any]:
        choices = [
            self.choice(i, job, done) for i, (job, done) in enumerate(zip(jobs, dones, strict=True))
        ]
        usage, timings = self.usage(dones), self.timings(dones[0])
        return {**self.base(self.object), "choices": choices, "usage": usage, "timings": timings}

    @abstractmethod
    def choice(self, index: int, job: Job, done: Done) -> dict[str, Any]:
        """Choice `index` of the whole answer."""

    def chunk(self, obj: str, choice: dict[str, Any], done: Done | None) -> str:
        body = {**self.base(obj), "choices": [choice]}
        if self.include_usage:
            body["usage"] = None
        if done is not None:
            body["timings"] = self.timings(done)
        return sse(body)

    def closing(self, dones: list[Done]) -> list[str]:
        usage = [sse({**self.base(self.chunk_object), "choices": [], "usage": self.usage(dones)})]
        return [*(usage if self.include_usage else []), "data: [DONE]\n\n"]

    def failed(self, error: ApiError, request_id: str) -> list[str]:
        return [sse({"error": error.body(request_id)["error"]})]


def finite(logprob: float) -> float:
    """JSON has no infinity; OpenAI writes an impossible token's log-probability as -9999.
    Nor NaN, which only a broken distribution gives: -9999 too, never an unwritable answer."""
    return -9999.0 if math.isnan(logprob) else max(logprob, -9999.0)


def logprob_entry(entry: Logprob | TopLogprob) -> dict[str, Any]:
    shaped = {"token": entry.token, "logprob": finite(entry.logprob), "bytes": list(entry.raw)}
    if isinstance(entry, Logprob):
        shaped["top_logprobs"] = [logprob_entry(top) for top in entry.top]
    return shaped


router = dialect_router()


@router.get("/models")
def models(request: Request) -> dict[str, Any]:
    """Every configured model's concrete names (an alias glob answers, but is not listed),
    each with its state (SPEC §9: `unloaded` ones load on demand), kind, context length
    (its files' until a worker has loaded it: model/kind.py) and the `max_tokens` a request
    that omits it gets."""
    config = request.app.state.config
    snapshot = backend.pool(request).snapshot(detail=False)
    return {
        "object": "list",
        "data": [
            {
                "id": name,
                "object": "model",
                "created": model.created,
                "owned_by": "steward",
                "root": model.name,
                "status": str(model.state),
                "kind": model.kind,
                "context_length": model.context_length,
                "max_tokens_default": config.max_tokens_default or None,
            }
            for model in snapshot.models
            for name in listed_names(model)
        ],
    }


def check_tools(
    names: list[str], forcing: bool, chosen: list[str], with_answer_format: bool, field: str
) -> None:
    """The tool rules both OpenAI dialects apply: names unique, a choice that asks for a
    call (`required`, a function) needs tools and names one of them, and a JSON answer
    (`field`) excludes tool calls. `auto` with no tools is no tools, as OpenAI reads it
    (Codex's compaction request sends it so)."""
    if len(set(names)) < len(names):
        raise ValueError("tools: two functions share a name")
    if forcing and not names:
        raise ValueError("tool_choice: needs tools")
    for name in chosen:
        if name not in names:
            raise ValueError(f"tool_choice: no tool is named {name!r}")
    if with_answer_format:
        raise ValueError(
            f"{field}: a JSON answer and tool calls exclude each other; set tool_choice to "
            f'"none" or leave {field} out'
        )

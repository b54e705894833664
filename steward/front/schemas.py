"""Request bodies of the OpenAI API, validated before anything reaches the worker.

Bounds live here: message counts, stop strings, every number's range (nothing a client
sends may overflow the worker's 64-bit wire format), no empty prompt. Parameters steward
cannot honour are refused with a clear 400 instead of being silently ignored; those it
accepts only at their default value are left out of the OpenAPI schema, so the schema
advertises nothing that is always refused.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.json_schema import SkipJsonSchema

MAX_MESSAGES = 2048
MAX_STOP = 4
MAX_STOP_CHARS = 256
MAX_NAME_CHARS = 256
MAX_PARTS = 1024  # content parts of one message
MAX_TOKENS = 2**31 - 1  # the context length bounds it further, once the model is known
MAX_N = 128
MAX_LOGIT_BIAS = 300
MAX_TOOLS = 128

Tokens = Annotated[int, Field(ge=1, le=MAX_TOKENS)]


class Strict(BaseModel):
    """No NaN or infinity in any float."""

    model_config = ConfigDict(allow_inf_nan=False)


class TextPart(Strict):
    type: Literal["text"]
    text: str


class ImageURL(Strict):
    url: str
    detail: str | None = None


class ImagePart(Strict):
    type: Literal["image_url"]
    image_url: ImageURL


Part = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class Message(Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | Annotated[list[Part], Field(max_length=MAX_PARTS)] | None = None
    name: str | None = Field(None, max_length=MAX_NAME_CHARS)

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content if isinstance(p, TextPart))
        return self.content or ""

    def image_urls(self) -> list[str]:
        if isinstance(self.content, list):
            return [p.image_url.url for p in self.content if isinstance(p, ImagePart)]
        return []

    def for_worker(self) -> dict[str, Any]:
        """Text as a string; with images, parts in order, each image a placeholder whose
        bytes travel separately (`Generate.images`)."""
        if not self.image_urls():
            return {"role": self.role, "content": self.text()}
        parts = [
            {"type": "text", "text": p.text} if isinstance(p, TextPart) else {"type": "image"}
            for p in self.content or []
        ]
        return {"role": self.role, "content": parts}


class StreamOptions(Strict):
    include_usage: bool = False


class Sampling(Strict):
    """What chat and text completions share."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    model: str | None = Field(None, max_length=256)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-(2**63), lt=2**64)
    stream: bool = False
    stream_options: StreamOptions | None = None
    # Range-checked, then refused unless at their defaults (not in the schema).
    n: SkipJsonSchema[int] = Field(1, ge=1, le=MAX_N)
    presence_penalty: SkipJsonSchema[float] = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: SkipJsonSchema[float] = Field(0.0, ge=-2.0, le=2.0)
    logprobs: SkipJsonSchema[bool | Annotated[int, Field(ge=0, le=20)] | None] = None
    top_logprobs: SkipJsonSchema[int | None] = Field(None, ge=0, le=20)
    logit_bias: SkipJsonSchema[dict[str, Annotated[float, Field(ge=-100, le=100)]] | None] = Field(
        None, max_length=MAX_LOGIT_BIAS
    )

    @model_validator(mode="after")
    def _supported(self) -> Sampling:
        stops = self.stop_list()
        if len(stops) > MAX_STOP or any(len(s) > MAX_STOP_CHARS for s in stops):
            raise ValueError(f"stop: at most {MAX_STOP} strings of {MAX_STOP_CHARS} characters")
        for key in self.logit_bias or {}:
            if not (key.isdigit() and int(key) < 2**31):
                raise ValueError(f"logit_bias: {key[:32]!r} is not a token id")
        unsupported = {
            "n": self.n != 1,
            "presence_penalty": self.presence_penalty != 0,
            "frequency_penalty": self.frequency_penalty != 0,
            "logprobs": bool(self.logprobs),
            "top_logprobs": bool(self.top_logprobs),
            "logit_bias": bool(self.logit_bias),
        }
        if bad := [name for name, on in unsupported.items() if on]:
            raise ValueError(f"not supported by steward: {', '.join(bad)}")
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
            "stop": self.stop_list(),
            "seed": None if self.seed is None else self.seed % 2**32,
        }


class ResponseFormat(Strict):
    type: Literal["text"]


class ChatRequest(Sampling):
    messages: list[Message] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_tokens: Tokens | None = None
    max_completion_tokens: Tokens | None = None
    tools: SkipJsonSchema[list[dict[str, Any]] | None] = Field(None, max_length=MAX_TOOLS)
    response_format: ResponseFormat | None = None

    @model_validator(mode="after")
    def _chat_supported(self) -> ChatRequest:
        if self.tools:
            raise ValueError("not supported by steward: tools")
        return self

    def image_urls(self) -> list[str]:
        return [url for m in self.messages for url in m.image_urls()]

    def params(self) -> dict[str, Any]:
        messages = [m.for_worker() for m in self.messages]
        limit = self.max_completion_tokens or self.max_tokens
        return {"messages": messages, "max_tokens": limit, **self.sampling()}

    def prompt_chars(self) -> int:
        return sum(len(m.text()) for m in self.messages)


class CompletionRequest(Sampling):
    prompt: str | list[str]
    max_tokens: Tokens | None = 16
    echo: SkipJsonSchema[bool] = False
    suffix: SkipJsonSchema[str | None] = None

    @model_validator(mode="after")
    def _completion_supported(self) -> CompletionRequest:
        if isinstance(self.prompt, list) and len(self.prompt) != 1:
            raise ValueError("prompt: one prompt per request (a list of prompts is not supported)")
        if not self.text():
            raise ValueError("prompt: must not be empty")
        if self.echo or self.suffix:
            raise ValueError("not supported by steward: echo, suffix")
        return self

    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]

    def params(self) -> dict[str, Any]:
        return {"prompt": self.text(), "max_tokens": self.max_tokens, **self.sampling()}

    def prompt_chars(self) -> int:
        return len(self.text())

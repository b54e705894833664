"""Request bodies of the OpenAI API, validated before anything reaches the worker.

Bounds live here: message counts, stop strings, sampling ranges. Parameters steward cannot
honour are refused with a clear 400 instead of being silently ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

MAX_MESSAGES = 2048
MAX_STOP = 4
MAX_STOP_CHARS = 256


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ImageURL(BaseModel):
    url: str
    detail: str | None = None


class ImagePart(BaseModel):
    type: Literal["image_url"]
    image_url: ImageURL


Part = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class Message(BaseModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[Part] | None = None
    name: str | None = None

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


class StreamOptions(BaseModel):
    include_usage: bool = False


class Sampling(BaseModel):
    """What chat and text completions share."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = Field(None, max_length=256)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-(2**63), lt=2**64)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: bool | int | None = None

    @model_validator(mode="after")
    def _supported(self) -> Sampling:
        stops = self.stop_list()
        if len(stops) > MAX_STOP or any(len(s) > MAX_STOP_CHARS for s in stops):
            raise ValueError(f"stop: at most {MAX_STOP} strings of {MAX_STOP_CHARS} characters")
        unsupported = {
            "n": self.n != 1,
            "presence_penalty": self.presence_penalty != 0,
            "frequency_penalty": self.frequency_penalty != 0,
            "logprobs": bool(self.logprobs),
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


class ChatRequest(Sampling):
    messages: list[Message] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[Any] | None = None
    response_format: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _chat_supported(self) -> ChatRequest:
        if self.tools:
            raise ValueError("not supported by steward: tools")
        if self.response_format and self.response_format.get("type") != "text":
            raise ValueError("not supported by steward: response_format other than text")
        return self

    def image_urls(self) -> list[str]:
        return [url for m in self.messages for url in m.image_urls()]

    def params(self) -> dict[str, Any]:
        messages = [m.for_worker() for m in self.messages]
        limit = self.max_completion_tokens or self.max_tokens
        return {"messages": messages, "max_tokens": limit, **self.sampling()}


class CompletionRequest(Sampling):
    prompt: str | list[str]
    max_tokens: int | None = Field(16, ge=1)
    echo: bool = False
    suffix: str | None = None

    @model_validator(mode="after")
    def _completion_supported(self) -> CompletionRequest:
        if isinstance(self.prompt, list) and len(self.prompt) != 1:
            raise ValueError("prompt: one prompt per request (batched prompts not supported)")
        if self.echo or self.suffix:
            raise ValueError("not supported by steward: echo, suffix")
        return self

    def params(self) -> dict[str, Any]:
        prompt = self.prompt if isinstance(self.prompt, str) else self.prompt[0]
        return {"prompt": prompt, "max_tokens": self.max_tokens, **self.sampling()}

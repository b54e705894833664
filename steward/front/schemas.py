"""Request bodies of the OpenAI API, validated before anything reaches the worker.

Bounds live here: message counts, stop strings, every number's range (nothing a client
sends may overflow the worker's 64-bit wire format), no empty prompt.

The rule for parameters: every parameter steward knows is honoured, or refused with a 400
that names it; a parameter it does not know is refused the same way, as OpenAI's own API
does ("Unrecognized request argument"), so a misspelt `max_token` or a vendor field
steward does not implement never passes silently. Fields that change nothing on a local
server and that SDKs and frameworks send (`user`, `metadata`, `store: false`,
`service_tier`) are accepted.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

MAX_MESSAGES = 2048
MAX_STOP = 4
MAX_STOP_CHARS = 256
MAX_NAME_CHARS = 256
MAX_PARTS = 1024  # content parts of one message
MAX_TOKENS = 2**31 - 1  # the context length bounds it further, once the model is known
MAX_N = 128  # `--max-n` bounds it further
MAX_LOGIT_BIAS = 300
MAX_TOOLS = 128
MAX_TOOL_CALLS = 128  # in one assistant message of the history
MAX_TOP_LOGPROBS = 20
FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")

Tokens = Annotated[int, Field(ge=1, le=MAX_TOKENS)]
Name = Annotated[str, Field(pattern=FUNCTION_NAME.pattern)]


class Strict(BaseModel):
    """No NaN or infinity in any float; no field steward does not know."""

    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")


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


class CalledFunction(Strict):
    name: Name
    arguments: str


class ToolCall(Strict):
    id: str = Field(max_length=MAX_NAME_CHARS)
    type: Literal["function"] = "function"
    function: CalledFunction

    def for_template(self) -> dict[str, Any]:
        """Chat templates expect the arguments as an object (mlx-lm's server does this too)."""
        try:
            arguments = json.loads(self.function.arguments)
        except ValueError:
            arguments = self.function.arguments
        function = {"name": self.function.name, "arguments": arguments}
        return {"id": self.id, "type": "function", "function": function}


class Message(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | Annotated[list[Part], Field(max_length=MAX_PARTS)] | None = None
    name: str | None = Field(None, max_length=MAX_NAME_CHARS)
    tool_calls: Annotated[list[ToolCall], Field(max_length=MAX_TOOL_CALLS)] | None = None
    tool_call_id: str | None = Field(None, max_length=MAX_NAME_CHARS)
    refusal: str | None = None  # sent back by clients that replay an answer as history

    @model_validator(mode="after")
    def _roles(self) -> Message:
        if self.tool_calls and self.role != "assistant":
            raise ValueError("tool_calls: only an assistant message makes tool calls")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("tool_call_id: a tool message answers a call; name it")
        return self

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
        bytes travel separately (`Generate.images`); tool calls and their answers as chat
        templates expect them."""
        message: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.image_urls():
            message["content"] = [
                {"type": "text", "text": p.text} if isinstance(p, TextPart) else {"type": "image"}
                for p in self.content or []
            ]
        if self.tool_calls:
            message["tool_calls"] = [call.for_template() for call in self.tool_calls]
        if self.tool_call_id:
            message["tool_call_id"] = self.tool_call_id
        if self.name:
            message["name"] = self.name
        return message


class StreamOptions(Strict):
    include_usage: bool = False


class Function(Strict):
    name: Name
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(Strict):
    type: Literal["function"]
    function: Function


class NamedFunction(Strict):
    name: Name


class NamedTool(Strict):
    type: Literal["function"]
    function: NamedFunction


class JSONSchema(Strict):
    name: str = Field(max_length=MAX_NAME_CHARS)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchema | None = None

    @model_validator(mode="after")
    def _schema(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("json_schema: given exactly when type is json_schema")
        return self


class Sampling(Strict):
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
    service_tier: Literal["auto", "default"] | None = None

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


ToolChoice = Literal["none", "auto", "required"] | NamedTool


class ChatRequest(Sampling):
    messages: list[Message] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_tokens: Tokens | None = None
    max_completion_tokens: Tokens | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    response_format: ResponseFormat | None = None
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True

    @model_validator(mode="after")
    def _chat(self) -> ChatRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs: needs logprobs: true")
        names = [tool.function.name for tool in self.tools or []]
        if len(set(names)) < len(names):
            raise ValueError("tools: two functions share a name")
        choice = self.tool_choice
        if choice is not None and choice != "none" and not self.tools:
            raise ValueError("tool_choice: needs tools")
        if isinstance(choice, NamedTool) and choice.function.name not in names:
            raise ValueError(f"tool_choice: no tool is named {choice.function.name!r}")
        if self.structured() and self.tools and self.choice() != "none":
            raise ValueError(
                "response_format: a JSON answer and tool calls exclude each other; "
                'set tool_choice to "none" or leave response_format out'
            )
        return self

    def choice(self) -> str | NamedTool:
        """`none`, `auto`, `required` or the named function: OpenAI's default is `auto`
        with tools, `none` without."""
        if self.tool_choice is not None:
            return self.tool_choice
        return "auto" if self.tools else "none"

    def structured(self) -> bool:
        return self.response_format is not None and self.response_format.type != "text"

    def image_urls(self) -> list[str]:
        return [url for m in self.messages for url in m.image_urls()]

    def params(self) -> dict[str, Any]:
        messages = [m.for_worker() for m in self.messages]
        limit = self.max_completion_tokens or self.max_tokens
        tools = None
        if self.tools and self.choice() != "none":
            tools = [tool.model_dump(exclude_none=True) for tool in self.tools]
        logprobs = (self.top_logprobs or 0) if self.logprobs else -1
        return {
            "messages": messages,
            "max_tokens": limit,
            "tools": tools,
            "logprobs": logprobs,
            **self.sampling(),
        }

    def prompt_chars(self) -> int:
        return sum(len(m.text()) for m in self.messages) + sum(
            len(json.dumps(tool.model_dump(exclude_none=True))) for tool in self.tools or []
        )


class CompletionRequest(Sampling):
    prompt: str | list[str]
    max_tokens: Tokens | None = 16
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1, le=MAX_N)

    @model_validator(mode="after")
    def _completion(self) -> CompletionRequest:
        if isinstance(self.prompt, list) and len(self.prompt) != 1:
            raise ValueError("prompt: one prompt per request (a list of prompts is not supported)")
        if not self.text():
            raise ValueError("prompt: must not be empty")
        if self.echo or self.suffix or (self.best_of or self.n) != self.n:
            raise ValueError("not supported by steward: echo, suffix, best_of other than n")
        return self

    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]

    def image_urls(self) -> list[str]:
        return []

    def params(self) -> dict[str, Any]:
        logprobs = -1 if self.logprobs is None else self.logprobs
        return {
            "prompt": self.text(),
            "max_tokens": self.max_tokens,
            "logprobs": logprobs,
            **self.sampling(),
        }

    def prompt_chars(self) -> int:
        return len(self.text())

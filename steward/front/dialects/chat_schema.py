"""The body of `POST /v1/chat/completions`, validated before anything reaches the worker.

Bounds live here (message counts, parts, tools, names), beside the shared sampling ones
(openai.py), whose rule for parameters holds here. Fields OpenAI documents that change
nothing here are accepted on purpose and documented as no-ops: `prompt_cache_key`,
`prompt_cache_retention`, `prompt_cache_options` (the prompt cache is automatic;
prewarming is refused), `safety_identifier`, `verbosity`, `audio`. `prediction` (OpenAI's
Predicted Outputs) gives the worker draft tokens, which speed the answer and never change
it (speculation.py). `modalities` may only ask for text; `moderation` and
`web_search_options` are refused.
`reasoning_effort` turns a thinking model's thinking off (`none`, `minimal`) or on. A tool
that carries a function is served as one whatever its `type`; one without (`custom`, a
hosted tool) is left out and named (ignored.py). The legacy `functions` / `function_call`
are read as `tools` / `tool_choice`, and answered in their own legacy shape (chat.py).
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from steward.front import ignored
from steward.front.dialects.openai import (
    MAX_NAME_CHARS,
    MAX_TOP_LOGPROBS,
    Sampling,
    Schema,
    Tokens,
    check_tools,
)

MAX_MESSAGES = 2048
MAX_PARTS = 1024  # content parts of one message
MAX_TOOLS = 128
MAX_TOOL_CALLS = 128  # in one assistant message of the history
FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")

Name = Annotated[str, Field(pattern=FUNCTION_NAME.pattern)]
SERVED_TOOLS = "has no function (name and parameters); steward serves function tools only"
# Fields that would change the answer and that steward does not do, and why.
REFUSED = {
    "moderation": "steward runs no moderation model",
    "web_search_options": "steward runs no web search",
}
Effort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]


class TextPart(Schema):
    type: Literal["text"]
    text: str


class Prediction(Schema):
    """OpenAI's Predicted Outputs: the answer as the client expects it, in text parts or
    one string."""

    type: Literal["content"]
    content: str | list[TextPart]

    def text(self) -> str:
        content = self.content
        return content if isinstance(content, str) else "".join(p.text for p in content)


class ImageURL(Schema):
    url: str
    detail: str | None = None


class ImagePart(Schema):
    type: Literal["image_url"]
    image_url: ImageURL


Part = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class CalledFunction(Schema):
    name: Name
    arguments: str


class ToolCall(Schema):
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


class Message(Schema):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | Annotated[list[Part], Field(max_length=MAX_PARTS)] | None = None
    name: str | None = Field(None, max_length=MAX_NAME_CHARS)
    tool_calls: Annotated[list[ToolCall], Field(max_length=MAX_TOOL_CALLS)] | None = None
    tool_call_id: str | None = Field(None, max_length=MAX_NAME_CHARS)
    refusal: str | None = None  # sent back by clients that replay an answer as history
    reasoning_content: str | None = None  # an answer's thinking, sent back with it
    function_call: CalledFunction | None = None  # legacy: an assistant's one call

    @model_validator(mode="after")
    def _roles(self) -> Message:
        if (self.tool_calls or self.function_call) and self.role != "assistant":
            raise ValueError("tool_calls: only an assistant message makes tool calls")
        if self.role == "function" and not self.name:
            raise ValueError("name: a function message names the function it answers")
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
        calls = self.tool_calls or []
        if self.function_call:  # legacy: as the tool call it would be today
            calls = [ToolCall(id=self.function_call.name, function=self.function_call)]
        if calls:
            message["tool_calls"] = [call.for_template() for call in calls]
        if self.role == "function":
            message |= {"role": "tool", "tool_call_id": self.name}
        if self.tool_call_id:
            message["tool_call_id"] = self.tool_call_id
        if self.reasoning_content and self.role == "assistant":
            message["reasoning_content"] = self.reasoning_content  # templates may render it
        if self.name:
            message["name"] = self.name
        return message


class Function(Schema):
    name: Name
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(Schema):
    """A function tool; whatever its `type` says (a type steward does not know), a tool
    that carries a function is served as one (`ChatRequest._served`)."""

    type: str = Field("function", max_length=64)
    function: Function

    def for_template(self) -> dict[str, Any]:
        return {"type": "function", "function": self.function.model_dump(exclude_none=True)}


class NamedFunction(Schema):
    name: Name


class NamedTool(Schema):
    type: Literal["function"]
    function: NamedFunction


class JSONSchema(Schema):
    name: str = Field(max_length=MAX_NAME_CHARS)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(Schema):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchema | None = None

    @model_validator(mode="after")
    def _schema(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("json_schema: given exactly when type is json_schema")
        return self


ToolChoice = Literal["none", "auto", "required"] | NamedTool


class PromptCacheOptions(Schema):
    """The prompt cache is automatic; only prewarming would change the answer (none)."""

    mode: Literal["implicit", "explicit"] | None = None
    ttl: Literal["30m", "12h"] | None = None
    comparison_response_id: str | None = Field(None, max_length=MAX_NAME_CHARS)
    prewarm: bool | None = None

    @model_validator(mode="after")
    def _prewarm(self) -> PromptCacheOptions:
        if self.prewarm:
            raise ValueError("prompt_cache_options.prewarm: not supported (the cache is automatic)")
        return self


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
    functions: Annotated[list[Function], Field(max_length=MAX_TOOLS)] | None = None  # legacy
    function_call: Literal["none", "auto"] | NamedFunction | None = None  # legacy
    reasoning_effort: Effort | None = None
    modalities: list[str] | None = Field(None, max_length=4)
    # Accepted, no effect here: the prompt cache is automatic; one model, one verbosity.
    prompt_cache_key: str | None = Field(None, max_length=1024)
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    prompt_cache_options: PromptCacheOptions | None = None
    safety_identifier: str | None = Field(None, max_length=MAX_NAME_CHARS)
    verbosity: Literal["low", "medium", "high"] | None = None
    audio: dict[str, Any] | None = None  # audio output's voice: `modalities` refuses audio
    prediction: Prediction | None = None  # draft tokens: a faster answer, never another
    # Refused when given: each would change the answer, and steward cannot do it.
    moderation: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None

    @field_validator("tools", mode="before")
    @classmethod
    def _served(cls, value: Any) -> Any:
        """A tool without a function (`custom`, a hosted tool) is left out (ignored.py)."""
        return ignored.served_tools(
            value, lambda tool: isinstance(tool.get("function"), dict), SERVED_TOOLS
        )

    @model_validator(mode="after")
    def _chat(self) -> ChatRequest:
        for name, why in REFUSED.items():
            if getattr(self, name) is not None:
                raise ValueError(f"{name}: not supported: {why}")
        if self.modalities is not None and set(self.modalities) != {"text"}:
            raise ValueError('modalities: steward answers in text only (["text"])')
        self._legacy()
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs: needs logprobs: true")
        choice = self.tool_choice
        check_tools(
            [tool.function.name for tool in self.tools or []],
            choice not in (None, "none", "auto"),
            [choice.function.name] if isinstance(choice, NamedTool) else [],
            self.structured() and bool(self.tools) and self.choice() != "none",
            "response_format",
        )
        return self

    def _legacy(self) -> None:
        """`functions` and `function_call` as the `tools` and `tool_choice` they became."""
        if self.functions is not None and self.tools is not None:
            raise ValueError("functions: give tools or the legacy functions, not both")
        if self.function_call is not None and self.tool_choice is not None:
            raise ValueError("function_call: give tool_choice or the legacy function_call")
        if self.functions is not None:
            self.tools = [Tool(type="function", function=f) for f in self.functions]
            self.parallel_tool_calls = False  # a legacy answer holds one call
        if isinstance(self.function_call, NamedFunction):
            self.tool_choice = NamedTool(type="function", function=self.function_call)
        elif self.function_call is not None:
            self.tool_choice = self.function_call

    @property
    def legacy(self) -> bool:
        """Asked in the legacy shape, answered in it (`function_call`, one call)."""
        return self.functions is not None

    def thinking(self) -> bool | None:
        """A thinking model's thinking: off for `none`/`minimal`, on for any other effort,
        else the template's default."""
        if self.reasoning_effort is None:
            return None
        return self.reasoning_effort not in ("none", "minimal")

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
            tools = [tool.for_template() for tool in self.tools]
        logprobs = (self.top_logprobs or 0) if self.logprobs else -1
        return {
            "messages": messages,
            "max_tokens": limit,
            "tools": tools,
            "logprobs": logprobs,
            "thinking": self.thinking(),
            "prediction": self.prediction.text() if self.prediction else "",
            **self.sampling(),
        }

    def prompt_chars(self) -> int:
        return sum(len(m.text()) for m in self.messages) + sum(
            len(json.dumps(tool.for_template())) for tool in self.tools or []
        )

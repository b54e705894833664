"""The body of `POST /v1/responses`, validated before anything reaches the worker.

Every parameter of the official SDK's `responses.create` is here: honoured, accepted as a
documented no-op (`docs/dialects/responses.md`), or refused with a 400 naming it; any
other field is refused as unknown, as in chat completions (openai.py). What is refused is
what would change the answer and that steward cannot do: hosted tools (web search, file
search, code interpreter, ...: a 400 naming the tool's type), `background`, stored prompt
templates (`prompt`), the Conversations API (`conversation`), server-side compaction
(`context_management`), moderation, `truncation: auto`, and prompt-cache prewarming.

Items of the input are kept in their wire shape (plain dicts, `Item.canonical`): the
store holds them so, and responses_input.py reads them as chat messages whether they came
from this request, a stored response, or steward's own output.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from steward.front.dialects.chat_schema import (
    MAX_MESSAGES,
    MAX_PARTS,
    MAX_TOOLS,
    Effort,
    Name,
    PromptCacheOptions,
)
from steward.front.dialects.openai import (
    MAX_NAME_CHARS,
    MAX_TOP_LOGPROBS,
    Strict,
    Tokens,
    check_tools,
)

MAX_ID_CHARS = 256
MAX_ANNOTATIONS = 1024
Status = Literal["in_progress", "completed", "incomplete"]
Summary = Literal["auto", "concise", "detailed"]
ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")
PART_TYPES = ("input_text", "input_image", "output_text", "refusal")
INCLUDABLE = Literal[
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
    "reasoning.encrypted_content",
    "message.output_text.logprobs",
]
# Fields that would change the answer and that steward does not do, and why.
REFUSED = {
    "background": "steward answers in the foreground only (no background responses)",
    "background_options": "steward answers in the foreground only (no background responses)",
    "conversation": "steward serves no Conversations API: chain responses with "
    "previous_response_id, or send the whole history as input",
    "context_management": "steward compacts no context: send the history you want the model to see",
    "moderation": "steward runs no moderation model",
    "prompt": "steward keeps no prompt templates: send the instructions and input themselves",
}


class InputText(Strict):
    type: Literal["input_text"]
    text: str
    prompt_cache_breakpoint: dict[str, Any] | None = None  # the prompt cache is automatic


class OutputText(Strict):
    """An assistant's text sent back as history: annotations and logprobs are ignored."""

    type: Literal["output_text"]
    text: str
    annotations: list[dict[str, Any]] = Field(default_factory=list, max_length=MAX_ANNOTATIONS)
    logprobs: list[dict[str, Any]] | None = None


class Refusal(Strict):
    type: Literal["refusal"]
    refusal: str


class InputImage(Strict):
    type: Literal["input_image"]
    image_url: str | None = None
    file_id: str | None = None
    detail: Literal["low", "high", "auto", "original"] | None = None
    prompt_cache_breakpoint: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _url(self) -> InputImage:
        if self.file_id is not None:
            raise ValueError("file_id: steward keeps no files; send the image as image_url")
        if not self.image_url:
            raise ValueError("image_url: an input_image needs its image_url (a data: URL)")
        return self


Part = Annotated[InputText | OutputText | Refusal | InputImage, Field(discriminator="type")]


def _known(values: Any, known: tuple[str, ...], what: str) -> Any:
    """Each dict's `type` among `known`, else a 400 naming the type (before pydantic's own
    discriminator message, which lists tags but not why)."""
    if isinstance(values, list):
        for i, value in enumerate(values):
            kind = value.get("type") if isinstance(value, dict) else None
            if isinstance(kind, str) and kind not in known:
                raise ValueError(
                    f"{what}.{i}.type: {kind!r} is not supported by steward "
                    f"(supported: {', '.join(known)})"
                )
    return values


class MessageItem(Strict):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: Annotated[list[Part], Field(max_length=MAX_PARTS)]  # a string: made one part
    id: str | None = Field(None, max_length=MAX_ID_CHARS)
    status: Status | None = None
    phase: Literal["commentary", "final_answer"] | None = None  # no effect here

    @field_validator("content", mode="before")
    @classmethod
    def _parts(cls, value: Any) -> Any:
        return _known(value, PART_TYPES, "content")


def _message(item: dict[str, Any]) -> dict[str, Any]:
    item = {"type": "message", **item}
    if isinstance(item.get("content"), str):
        kind = "output_text" if item.get("role") == "assistant" else "input_text"
        part = {"type": kind, "text": item["content"]}
        item["content"] = [part | {"annotations": []} if kind == "output_text" else part]
    return item


class FunctionCallItem(Strict):
    type: Literal["function_call"]
    call_id: str = Field(max_length=MAX_ID_CHARS)
    name: Name
    arguments: str
    id: str | None = Field(None, max_length=MAX_ID_CHARS)
    status: Status | None = None
    caller: dict[str, Any] | None = None  # "direct": the only caller there is here


class FunctionCallOutputItem(Strict):
    type: Literal["function_call_output"]
    call_id: str = Field(max_length=MAX_ID_CHARS)
    output: str | Annotated[list[InputText], Field(max_length=MAX_PARTS)]
    id: str | None = Field(None, max_length=MAX_ID_CHARS)
    status: Status | None = None
    name: str | None = Field(None, max_length=MAX_NAME_CHARS)
    caller: dict[str, Any] | None = None

    @field_validator("output", mode="before")
    @classmethod
    def _parts(cls, value: Any) -> Any:
        return _known(value, ("input_text",), "output")


class SummaryText(Strict):
    type: Literal["summary_text"]
    text: str


class ReasoningText(Strict):
    type: Literal["reasoning_text"]
    text: str


class ReasoningItem(Strict):
    """Thinking sent back (steward's own, or a summary): the next assistant turn's
    `reasoning_content` for templates that render it."""

    type: Literal["reasoning"]
    id: str | None = Field(None, max_length=MAX_ID_CHARS)
    summary: list[SummaryText] = Field(default_factory=list, max_length=MAX_PARTS)
    content: Annotated[list[ReasoningText], Field(max_length=MAX_PARTS)] | None = None
    encrypted_content: str | None = None
    status: Status | None = None


Item = Annotated[
    MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem,
    Field(discriminator="type"),
]


def canonical(item: Item) -> dict[str, Any]:
    """The item as the wire writes it (what the store keeps and input_items lists)."""
    return item.model_dump(exclude_none=True, by_alias=True)


class FunctionTool(Strict):
    type: Literal["function"]
    name: Name
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # the schema is enforced whenever a call is forced

    def for_template(self) -> dict[str, Any]:
        function = {"name": self.name, "description": self.description}
        function["parameters"] = self.parameters or {"type": "object", "properties": {}}
        return {"type": "function", "function": {k: v for k, v in function.items() if v}}


class FunctionChoice(Strict):
    type: Literal["function"]
    name: Name


class AllowedTools(Strict):
    type: Literal["allowed_tools"]
    mode: Literal["auto", "required"]
    tools: Annotated[list[FunctionChoice], Field(min_length=1, max_length=MAX_TOOLS)]


ToolChoice = Literal["none", "auto", "required"] | FunctionChoice | AllowedTools


class TextFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(None, max_length=MAX_NAME_CHARS)
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    description: str | None = None
    strict: bool | None = None  # the schema is enforced, strict or not

    @model_validator(mode="after")
    def _schema(self) -> TextFormat:
        if self.type == "json_schema" and (self.schema_ is None or not self.name):
            raise ValueError("text.format: a json_schema format gives its name and schema")
        return self

    def shown(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True, by_alias=True)


class TextConfig(Strict):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # one model, one verbosity


class ReasoningConfig(Strict):
    effort: Effort | None = None
    summary: Summary | None = None  # no summariser here: the thinking itself is given
    generate_summary: Summary | None = None  # the deprecated name of `summary`
    context: Literal["auto", "current_turn", "all_turns"] | None = None  # the template's
    mode: str | None = Field(None, max_length=64)  # one model, one mode


class StreamOptions(Strict):
    include_obfuscation: bool | None = None  # no obfuscation is ever added


class AccessPrograms(Strict):
    cyber: Literal["standard", "daybreak_blue", "daybreak_red"] | None = None


class ImageOptions(Strict):
    context_compression: Literal["auto", "enabled", "disabled"] | None = None


class ResponsesRequest(Strict):
    model: str | None = Field(None, max_length=256)
    input: Annotated[list[Item], Field(max_length=MAX_MESSAGES)] | None = None  # or a string
    instructions: str | None = None
    max_output_tokens: Tokens | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: Annotated[list[FunctionTool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    store: bool | None = None
    previous_response_id: str | None = Field(None, max_length=MAX_ID_CHARS)
    include: Annotated[list[INCLUDABLE], Field(max_length=16)] | None = None
    metadata: (
        dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]] | None
    ) = Field(None, max_length=16)
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    truncation: Literal["auto", "disabled"] | None = None
    # Accepted, no effect here (docs/dialects/responses.md says why, one by one).
    max_tool_calls: int | None = Field(None, ge=0)  # bounds built-in tools: there are none
    prompt_cache_key: str | None = Field(None, max_length=1024)
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    prompt_cache_options: PromptCacheOptions | None = None
    safety_identifier: str | None = Field(None, max_length=MAX_NAME_CHARS)
    user: str | None = Field(None, max_length=MAX_NAME_CHARS)
    service_tier: (
        Literal["auto", "default", "flex", "scale", "priority", "fast", "ultrafast"] | None
    ) = None
    access_programs: AccessPrograms | None = None
    image: ImageOptions | None = None
    # Refused when given (REFUSED says why).
    background: bool | None = None
    background_options: dict[str, Any] | None = None
    conversation: str | dict[str, Any] | None = None
    context_management: list[dict[str, Any]] | None = None
    moderation: dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _items(cls, value: Any) -> Any:
        """A string is one user message; an item with a role and no type is a message (the
        SDK's "easy" input message); a message's string content is its one text part."""
        if isinstance(value, str):
            value = [{"role": "user", "content": value}]
        if isinstance(value, list):
            value = [_message(v) if isinstance(v, dict) and "role" in v else v for v in value]
        return _known(value, ITEM_TYPES, "input")

    @field_validator("tools", mode="before")
    @classmethod
    def _function_tools(cls, value: Any) -> Any:
        if isinstance(value, list):
            for i, tool in enumerate(value):
                kind = tool.get("type") if isinstance(tool, dict) else None
                if isinstance(kind, str) and kind != "function":
                    raise ValueError(
                        f"tools.{i}.type: the {kind!r} tool is not served by steward: it runs "
                        "no hosted tools; give function tools (type 'function') and run them "
                        "yourself"
                    )
        return value

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _function_choice(cls, value: Any) -> Any:
        kind = value.get("type") if isinstance(value, dict) else None
        if isinstance(kind, str) and kind not in ("function", "allowed_tools"):
            raise ValueError(
                f"tool_choice: {kind!r} names a hosted tool, which steward does not run; "
                "choose a function tool"
            )
        return value

    @model_validator(mode="after")
    def _responses(self) -> ResponsesRequest:
        for name, why in REFUSED.items():
            given = getattr(self, name)
            if given not in (None, False, []):
                raise ValueError(f"{name}: not supported: {why}")
        if self.truncation == "auto":
            raise ValueError(
                "truncation: 'auto' is not supported: steward drops no input; an input longer "
                "than the context is a 400 (context_length_exceeded)"
            )
        check_tools(
            [tool.name for tool in self.tools or []],
            self.tool_choice not in (None, "none"),
            self.chosen(),
            self.structured() and bool(self.tools) and self.choice() != "none",
            "text.format",
        )
        return self

    def choice(self) -> str | FunctionChoice:
        """`none`, `auto`, `required`, or a function; `allowed_tools` is its mode over the
        tools it allows (`allowed`). OpenAI's default is `auto` with tools, else `none`."""
        choice = self.tool_choice
        if isinstance(choice, AllowedTools):
            if len(choice.tools) == 1 and choice.mode == "required":
                return choice.tools[0]
            return choice.mode
        if choice is not None:
            return choice
        return "auto" if self.tools else "none"

    def chosen(self) -> list[str]:
        choice = self.tool_choice
        if isinstance(choice, AllowedTools):
            return [tool.name for tool in choice.tools]
        return [choice.name] if isinstance(choice, FunctionChoice) else []

    def allowed(self) -> list[FunctionTool]:
        """The tools the model may call (all, or those `allowed_tools` names)."""
        tools = self.tools or []
        if isinstance(self.tool_choice, AllowedTools):
            return [tool for tool in tools if tool.name in self.chosen()]
        return tools

    def format(self) -> TextFormat:
        given = self.text.format if self.text else None
        return given or TextFormat(type="text")

    def structured(self) -> bool:
        return self.format().type != "text"

    def includes(self, what: str) -> bool:
        return what in (self.include or [])

    def thinking(self) -> bool | None:
        """A thinking model's thinking: off for effort `none`/`minimal`, on for any other
        effort, else the template's default (as chat's `reasoning_effort`)."""
        effort = self.reasoning.effort if self.reasoning else None
        return None if effort is None else effort not in ("none", "minimal")

    def items(self) -> list[dict[str, Any]]:
        """This request's input, as items (a string is one user message)."""
        return [canonical(item) for item in self.input or []]

    def tools_chars(self) -> int:
        return sum(len(json.dumps(tool.model_dump(exclude_none=True))) for tool in self.tools or [])

"""The body of `POST /v1/responses`, validated before anything reaches the worker.

Every parameter of the official SDK's `responses.create` is here: honoured, accepted as a
documented no-op (`docs/dialects/responses.md`), or refused with a 400 naming it; any
other field is ignored and named in the `steward-ignored` header, as in chat completions
(openai.py). What is refused is what would change the answer and that steward cannot do:
`background`, stored prompt templates (`prompt`), the Conversations API (`conversation`),
moderation, `truncation: auto`, prompt-cache prewarming, and a `tool_choice` naming a
hosted tool. Tools are functions: a tool with a name and `parameters` is served as one
whatever its type; a `namespace` tool's functions are served under flat names
(`NamespaceTool`); a hosted or `custom` tool (no schema) is left out and named in the
header.

Items of the input are kept in their wire shape (plain dicts, `Item.canonical`): the
store holds them so, and responses_input.py reads them as chat messages whether they came
from this request, a stored response, or steward's own output.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    Discriminator,
    Field,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)

from steward.front import ignored
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
    Schema,
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
UNSERVED_TOOL = "has no parameters: a hosted or custom tool, which steward does not serve"
# Fields that would change the answer and that steward does not do, and why.
REFUSED = {
    "background": "steward answers in the foreground only (no background responses)",
    "background_options": "steward answers in the foreground only (no background responses)",
    "conversation": "steward serves no Conversations API: chain responses with "
    "previous_response_id, or send the whole history as input",
    "moderation": "steward runs no moderation model",
    "prompt": "steward keeps no prompt templates: send the instructions and input themselves",
}


class InputText(Schema):
    type: Literal["input_text"]
    text: str
    prompt_cache_breakpoint: dict[str, Any] | None = None  # the prompt cache is automatic


class OutputText(Schema):
    """An assistant's text sent back as history: annotations and logprobs are ignored."""

    type: Literal["output_text"]
    text: str
    annotations: list[dict[str, Any]] = Field(default_factory=list, max_length=MAX_ANNOTATIONS)
    logprobs: list[dict[str, Any]] | None = None


class Refusal(Schema):
    type: Literal["refusal"]
    refusal: str


class InputImage(Schema):
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


class MessageItem(Schema):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: Annotated[list[Part], Field(max_length=MAX_PARTS)]  # a string: made one part
    id: str | None = Field(None, max_length=MAX_ID_CHARS)
    status: Status | None = None
    phase: Literal["commentary", "final_answer"] | None = None  # no effect here

    @field_validator("content", mode="before")
    @classmethod
    def _parts(cls, value: Any, info: ValidationInfo) -> Any:
        """A string is the message's one text part (the SDK's "easy" input message)."""
        if isinstance(value, str):
            if info.data.get("role") == "assistant":
                return [{"type": "output_text", "text": value, "annotations": []}]
            return [{"type": "input_text", "text": value}]
        return _known(value, PART_TYPES, "content")


def _item_kind(value: Any) -> str | None:
    """An item's `type`; an item with a role and no type is a message (the SDK's "easy"
    input message)."""
    if not isinstance(value, dict):
        return getattr(value, "type", None)
    return value.get("type") or ("message" if "role" in value else None)


class FunctionCallItem(Schema):
    type: Literal["function_call"]
    call_id: str = Field(max_length=MAX_ID_CHARS)
    name: Name
    arguments: str
    namespace: Name | None = None  # a namespace tool's function (`flat_name`)
    id: str | None = Field(None, max_length=MAX_ID_CHARS)
    status: Status | None = None
    caller: dict[str, Any] | None = None  # "direct": the only caller there is here


class FunctionCallOutputItem(Schema):
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


class SummaryText(Schema):
    type: Literal["summary_text"]
    text: str


class ReasoningText(Schema):
    type: Literal["reasoning_text"]
    text: str


class ReasoningItem(Schema):
    """Thinking sent back (steward's own, or a summary): the next assistant turn's
    `reasoning_content` for templates that render it."""

    type: Literal["reasoning"]
    id: str | None = Field(None, max_length=MAX_ID_CHARS)
    summary: list[SummaryText] = Field(default_factory=list, max_length=MAX_PARTS)
    content: Annotated[list[ReasoningText], Field(max_length=MAX_PARTS)] | None = None
    encrypted_content: str | None = None
    status: Status | None = None


Item = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(_item_kind),
]


def canonical(item: Item) -> dict[str, Any]:
    """The item as the wire writes it (what the store keeps and input_items lists)."""
    return item.model_dump(exclude_none=True, by_alias=True)


class FunctionTool(Schema):
    """A function the model may call: `type` `function`, or a type steward does not know
    with a `name` and `parameters` (`served`). A deferred one (`defer_loading`) is in the
    prompt like the others: no tool search needs to find it."""

    type: str = Field("function", max_length=64)
    name: Name
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # the schema is enforced whenever a call is forced
    defer_loading: bool | None = None
    output_schema: dict[str, Any] | None = None  # describes the output the client sends back

    def for_template(self) -> dict[str, Any]:
        function = {"name": self.name, "description": self.description}
        function["parameters"] = self.parameters or {"type": "object", "properties": {}}
        return {"type": "function", "function": {k: v for k, v in function.items() if v}}


def function(tool: dict[str, Any]) -> bool:
    """A function, or a tool of any type that carries a name and a schema."""
    return tool.get("type") == "function" or ("name" in tool and "parameters" in tool)


def namespace_tools(tools: Any) -> Any:
    """A namespace's functions: those steward cannot serve (`custom` tools, which have no
    schema) are left out (ignored.py)."""
    return ignored.served_tools(tools, function, UNSERVED_TOOL)


def request_tools(tools: Any) -> Any:
    """Functions and namespaces: hosted tools and `custom` tools are left out."""
    return ignored.served_tools(
        tools, lambda tool: tool.get("type") == "namespace" or function(tool), UNSERVED_TOOL
    )


class NamespaceTool(Schema):
    """Functions grouped under a name (Codex sends its sub-agent tools so): served as
    functions named `flat_name(namespace, name)`, and a call to one comes back with its
    `namespace` and `name` apart, as the client dispatches it."""

    type: Literal["namespace"]
    name: Name
    description: str | None = None  # not shown: the flat names carry the namespace
    tools: Annotated[list[FunctionTool], Field(max_length=MAX_TOOLS)]

    _served = field_validator("tools", mode="before")(namespace_tools)


def flat_name(namespace: str, name: str) -> str:
    """`multi_agent_v1__close_agent`: Codex's own flat name for a namespaced tool (its
    `ToolName::canonical_flat_name`)."""
    return f"{namespace.rstrip('_')}__{name.lstrip('_')}"


def _tool_kind(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return "namespace" if kind == "namespace" else "function"


Tool = Annotated[
    Annotated[FunctionTool, Tag("function")] | Annotated[NamespaceTool, Tag("namespace")],
    Discriminator(_tool_kind),
]


class FunctionChoice(Schema):
    type: Literal["function"]
    name: Name


class AllowedTools(Schema):
    type: Literal["allowed_tools"]
    mode: Literal["auto", "required"]
    tools: Annotated[list[FunctionChoice], Field(min_length=1, max_length=MAX_TOOLS)]


ToolChoice = Literal["none", "auto", "required"] | FunctionChoice | AllowedTools


class TextFormat(Schema):
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


class TextConfig(Schema):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # one model, one verbosity


class ReasoningConfig(Schema):
    effort: Effort | None = None
    summary: Summary | None = None  # no summariser here: the thinking itself is given
    generate_summary: Summary | None = None  # the deprecated name of `summary`
    context: Literal["auto", "current_turn", "all_turns"] | None = None  # the template's
    mode: str | None = Field(None, max_length=64)  # one model, one mode


class StreamOptions(Schema):
    include_obfuscation: bool | None = None  # no obfuscation is ever added


class AccessPrograms(Schema):
    cyber: Literal["standard", "daybreak_blue", "daybreak_red"] | None = None


class ImageOptions(Schema):
    context_compression: Literal["auto", "enabled", "disabled"] | None = None


class Compaction(Schema):
    type: str = Field(max_length=64)  # `compaction`
    compact_threshold: int | None = Field(None, ge=0)


class ResponsesRequest(Schema):
    model: str | None = Field(None, max_length=256)
    input: Annotated[list[Item], Field(max_length=MAX_MESSAGES)] | None = None  # or a string
    instructions: str | None = None
    max_output_tokens: Tokens | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
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
    # Compaction past a threshold: steward compacts nothing, and an input over the context
    # is a 400 `context_length_exceeded`, on which Codex compacts the history itself.
    context_management: Annotated[list[Compaction], Field(max_length=8)] | None = None
    # Refused when given (REFUSED says why).
    background: bool | None = None
    background_options: dict[str, Any] | None = None
    conversation: str | dict[str, Any] | None = None
    moderation: dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _items(cls, value: Any) -> Any:
        """A string is one user message."""
        if isinstance(value, str):
            value = [{"role": "user", "content": value}]
        return _known(value, ITEM_TYPES, "input")

    _served = field_validator("tools", mode="before")(request_tools)

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
            [tool.name for tool in self.functions()],
            self.tool_choice not in (None, "none", "auto"),
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
        return "auto" if self.functions() else "none"

    def chosen(self) -> list[str]:
        choice = self.tool_choice
        if isinstance(choice, AllowedTools):
            return [tool.name for tool in choice.tools]
        return [choice.name] if isinstance(choice, FunctionChoice) else []

    def functions(self) -> list[FunctionTool]:
        """Every function served, a namespace's named by `flat_name`."""
        functions: list[FunctionTool] = []
        for tool in self.tools or []:
            if isinstance(tool, NamespaceTool):
                functions += [
                    f.model_copy(update={"name": flat_name(tool.name, f.name)}) for f in tool.tools
                ]
            else:
                functions.append(tool)
        return functions

    def namespaced(self) -> dict[str, tuple[str, str]]:
        """A namespace's functions: flat name -> (namespace, name)."""
        return {
            flat_name(tool.name, f.name): (tool.name, f.name)
            for tool in self.tools or []
            if isinstance(tool, NamespaceTool)
            for f in tool.tools
        }

    def allowed(self) -> list[FunctionTool]:
        """The functions the model may call (all, or those `allowed_tools` names)."""
        functions = self.functions()
        if isinstance(self.tool_choice, AllowedTools):
            return [tool for tool in functions if tool.name in self.chosen()]
        return functions

    def format(self) -> TextFormat:
        given = self.text.format if self.text else None
        return given or TextFormat(type="text")

    def structured(self) -> bool:
        return self.format().type != "text"

    def parallel(self) -> bool:
        """More than one tool call allowed: OpenAI's default, unless `false`."""
        return self.parallel_tool_calls is not False

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
        return sum(len(json.dumps(tool.for_template())) for tool in self.functions())

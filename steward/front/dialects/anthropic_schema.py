"""The bodies of `POST /v1/messages` and `/v1/messages/count_tokens`, validated before
anything reaches the worker (their blocks: anthropic_blocks.py).

The parameter rule (openai.py) holds here too, in Anthropic's words: every field the SDK's
`messages.create` takes is honoured, accepted as a no-op that says so below, or refused
with a 400 naming it where it would change the answer and steward cannot do it; any other
field is ignored and named in the `steward-ignored` header (ignored.py), as is a tool
steward cannot serve (a server tool). Bounds are chat's
(chat_schema.py): messages, blocks, tools, stop strings. A conversation that ends with
the assistant's turn (a prefill) is refused: the template opens a new assistant turn, it
cannot continue one.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from steward.front import ignored
from steward.front.dialects.anthropic_blocks import (
    MAX_ID_CHARS,
    CacheControl,
    Cached,
    ImageBlock,
    MessageParam,
    Name,
    TextBlock,
    TextBlocks,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    assistant_turn,
    text_of,
    user_turns,
)
from steward.front.dialects.chat_schema import MAX_MESSAGES, MAX_TOOLS
from steward.front.dialects.openai import MAX_NAME_CHARS, MAX_STOP_CHARS, MAX_TOKENS, Schema

SERVER_TOOL = "has no input_schema: a server tool, which steward does not run"
# Beta fields that would change the answer and that steward does not do, and why.
REFUSED = {
    "mcp_servers": "steward connects to no MCP servers (run them client side, as Claude Code does)",
    "compaction": "steward compacts no context: send the history you want the model to see",
    "thread": "steward holds no conversations: send the history",
    "fallbacks": "steward serves one model here, with no substitutes",
}
MAX_STOP_SEQUENCES = 16  # each is looked for after every token: a bound keeps that cheap
DEFAULT_CLEAR_TRIGGER = 100_000  # input tokens: Anthropic's default for clear_tool_uses


class CustomTool(Cached):
    """A tool the model may call: one with an `input_schema`, served as a function whatever
    else it carries (`MessagesPrompt._served`). A deferred tool (`defer_loading`) is in the
    prompt like the others: no tool search needs to find it. `eager_input_streaming`
    changes nothing (a call's input always streams as it is generated), nor do
    `input_examples` (the template shows a tool's schema)."""

    type: str | None = Field(None, max_length=64)  # `custom`, or a type steward does not know
    name: Name
    description: str | None = None
    input_schema: dict[str, Any]
    strict: bool | None = None  # checked against tool_choice (`MessagesPrompt._tools`)
    allowed_callers: list[Literal["direct"]] | None = None
    defer_loading: bool | None = None
    eager_input_streaming: bool | None = None
    input_examples: list[dict[str, Any]] | None = None

    def for_template(self) -> dict[str, Any]:
        function = {"name": self.name, "parameters": self.input_schema}
        if self.description is not None:
            function = {"name": self.name, "description": self.description} | function
        return {"type": "function", "function": function}


class ToolChoice(Schema):
    type: Literal["auto", "any", "tool", "none"]
    name: Name | None = None
    disable_parallel_tool_use: bool = False

    @model_validator(mode="after")
    def _named(self) -> ToolChoice:
        if (self.type == "tool") != (self.name is not None):
            raise ValueError("name: given exactly when type is tool")
        if self.type == "none" and self.disable_parallel_tool_use:
            raise ValueError("disable_parallel_tool_use: not with type none")
        return self


class Thinking(Schema):
    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    display: Literal["summarized", "omitted"] | None = None

    @model_validator(mode="after")
    def _budget(self) -> Thinking:
        if (self.type == "enabled") != (self.budget_tokens is not None):
            raise ValueError("budget_tokens: given exactly when type is enabled")
        if self.display is not None and self.type not in ("enabled", "adaptive"):
            raise ValueError("display: only when thinking is enabled or adaptive")
        return self


class JSONFormat(Schema):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(Schema):
    # One local model has one effort: accepted, no effect (`thinking` turns thinking on/off).
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: JSONFormat | None = None


class ThinkingTurns(Schema):
    type: Literal["thinking_turns"]
    value: int = Field(ge=0, le=MAX_MESSAGES)


class AllTurns(Schema):
    type: Literal["all"]


class ClearThinking(Schema):
    """Thinking of older assistant turns left out of the prompt: all but the last `keep`
    turns that carry thinking (one, unless said)."""

    type: Literal["clear_thinking_20251015"]
    keep: ThinkingTurns | AllTurns | Literal["all"] | None = None

    def kept(self) -> int | None:
        """How many of the last thinking turns keep their thinking (None: all)."""
        if self.keep is None:
            return 1
        return self.keep.value if isinstance(self.keep, ThinkingTurns) else None


class InputTokens(Schema):
    type: Literal["input_tokens"]
    value: int = Field(ge=1, le=MAX_TOKENS)


class ClearToolUses(Schema):
    """Clears old tool results once the prompt passes `trigger` input tokens: served where
    that cannot happen, a trigger at or beyond the model's context length (a prompt past it
    is refused anyway); a 400 otherwise (`anthropic.py`)."""

    type: Literal["clear_tool_uses_20250919"]
    trigger: InputTokens | None = None
    keep: dict[str, Any] | None = None
    clear_at_least: dict[str, Any] | None = None
    clear_tool_inputs: bool | list[str] | None = None
    exclude_tools: list[str] | None = Field(None, max_length=MAX_TOOLS)

    @property
    def threshold(self) -> int:
        return self.trigger.value if self.trigger else DEFAULT_CLEAR_TRIGGER


Edit = Annotated[ClearThinking | ClearToolUses, Field(discriminator="type")]


class ContextManagement(Schema):
    """Anthropic's beta context editing, which Claude Code sends (module doc of
    anthropic.py); `compact_20260112` (a summary by the model) is not served."""

    edits: list[Edit] | None = Field(None, max_length=8)


class MessagesPrompt(Schema):
    """What `messages.create` and `messages.count_tokens` share: the prompt."""

    model: str | None = Field(None, max_length=256)
    messages: list[MessageParam] = Field(min_length=1, max_length=MAX_MESSAGES)
    system: TextBlocks | None = None
    tools: Annotated[list[CustomTool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    context_management: ContextManagement | None = None
    # Accepted, no effect on a local server: the prompt cache is automatic, there is one
    # speed, and no workspaces or user profiles to bill.
    cache_control: CacheControl | None = None
    speed: Literal["standard", "fast"] | None = None
    user_profile_id: str | None = Field(None, max_length=MAX_NAME_CHARS)
    workspace_id: str | None = Field(None, max_length=MAX_NAME_CHARS)

    # Refused when given (beta): each would change the answer, and steward cannot do it.
    mcp_servers: list[dict[str, Any]] | None = None
    compaction: dict[str, Any] | None = None
    thread: dict[str, Any] | None = None
    fallbacks: Any = None

    @field_validator("tools", mode="before")
    @classmethod
    def _served(cls, value: Any) -> Any:
        """A tool with no `input_schema` (a server tool: web search, bash, the tool search
        tool, ...) is left out of the prompt (ignored.py): steward runs none, and every
        deferred tool is in the prompt already, so a tool search has nothing to find."""
        return ignored.served_tools(value, lambda tool: "input_schema" in tool, SERVER_TOOL)

    @model_validator(mode="after")
    def _prompt(self) -> MessagesPrompt:
        for name, why in REFUSED.items():
            if getattr(self, name) not in (None, []):
                raise ValueError(f"{name}: not supported: {why}")
        if self.messages[-1].role == "assistant":
            raise ValueError(
                "messages: the last message is the assistant's; steward does not continue "
                "a prefilled answer (end with a user message)"
            )
        names = [tool.name for tool in self.tools or []]
        if len(set(names)) < len(names):
            raise ValueError("tools: two tools share a name")
        choice = self.tool_choice
        if choice is not None and choice.type in ("any", "tool") and not self.tools:
            raise ValueError(f"tool_choice: {choice.type} needs tools")
        if choice is not None and choice.type == "tool" and choice.name not in names:
            raise ValueError(f"tool_choice: no tool is named {choice.name!r}")
        if self.schema() is not None and self.tools and self.choice() != "none":
            raise ValueError(
                "output_config: a JSON answer and tool use exclude each other here; set "
                'tool_choice to {"type": "none"} or leave output_config.format out'
            )
        if self.constrained and self.thinking and self.thinking.type == "enabled":
            raise ValueError(
                "thinking: an answer under a grammar (tool_choice any or tool, or "
                "output_config.format) leaves no room for thinking; leave thinking out"
            )
        if any(t.strict for t in self.tools or []) and self.choice() == "auto":
            raise ValueError(
                "tools: strict is enforced only when tool_choice is any or tool (an auto "
                "call is the model's own text)"
            )
        return self

    def choice(self) -> str:
        """`auto` (Anthropic's default with tools), `any`, `tool` or `none`."""
        if not self.tools:
            return "none"
        return self.tool_choice.type if self.tool_choice else "auto"

    @property
    def constrained(self) -> bool:
        """The answer is generated under a grammar: a forced call or a JSON answer."""
        return self.choice() in ("any", "tool") or self.schema() is not None

    @property
    def single_call(self) -> bool:
        return bool(self.tool_choice and self.tool_choice.disable_parallel_tool_use)

    def schema(self) -> dict[str, Any] | None:
        config = self.output_config
        return config.format.schema_ if config and config.format else None

    def enable_thinking(self) -> bool | None:
        """The template's `enable_thinking`: None leaves it to the model (omitted, or
        `adaptive`: the model decides); `between_tools` thinks in a turn that goes on after
        tool results. An answer under a grammar has no thinking (the worker's rule): off,
        so a template that opens a thinking block in its prompt closes it."""
        if self.constrained:
            return False
        kind = self.thinking.type if self.thinking else None
        if kind in (None, "adaptive"):
            return None
        if kind == "between_tools":
            last = self.messages[-1].content
            return any(isinstance(block, ToolResultBlock) for block in last)
        return kind == "enabled"

    def image_urls(self) -> list[str]:
        """Every image's URL in the order of its placeholder: a tool result's with its result."""
        found = []
        for message in self.messages:
            for block in message.content:
                if isinstance(block, ImageBlock):
                    found.append(block)
                elif isinstance(block, ToolResultBlock):
                    found += block.images()
        return [block.url() for block in found]

    def clear_tool_uses(self) -> list[ClearToolUses]:
        edits = self.context_management.edits if self.context_management else None
        return [edit for edit in edits or [] if isinstance(edit, ClearToolUses)]

    def template_messages(self) -> list[dict[str, Any]]:
        """The conversation as chat templates take it (module doc); image blocks as
        placeholders whose bytes travel apart, in order (`Generate.images`)."""
        turns: list[dict[str, Any]] = []
        if self.system:
            turns.append({"role": "system", "content": text_of(self.system)})
        kept = self._thinking_turns()
        names: dict[str, str] = {}  # tool_use id -> name, for the tool turns answering them
        tools = {tool.name: tool.for_template()["function"] for tool in self.tools or []}
        for i, message in enumerate(self.messages):
            if message.role == "assistant":
                turns.append(assistant_turn(message, i in kept, names))
            else:
                turns += user_turns(message, names, tools)
        return turns

    def _thinking_turns(self) -> set[int]:
        """The assistant messages whose thinking reaches the template."""
        with_thinking = [
            i
            for i, m in enumerate(self.messages)
            if any(isinstance(b, ThinkingBlock) for b in m.content)
        ]
        edits = self.context_management.edits if self.context_management else None
        clears = [edit for edit in edits or [] if isinstance(edit, ClearThinking)]
        if not clears or (kept := clears[-1].kept()) is None:
            return set(with_thinking)
        return set(with_thinking[len(with_thinking) - kept :]) if kept else set()

    def prompt_chars(self) -> int:
        """Characters of the prompt's text, for the context bound of `Job.too_long`."""
        chars = sum(len(block.text) for block in self.system or [])
        for message in self.messages:
            for block in message.content:
                if isinstance(block, TextBlock):
                    chars += len(block.text)
                elif isinstance(block, ToolUseBlock):
                    chars += len(block.name) + len(json.dumps(block.input))
                elif isinstance(block, ToolResultBlock):
                    chars += len(block.text())
                elif isinstance(block, ThinkingBlock):
                    chars += len(block.thinking)
        return chars + sum(len(json.dumps(t.for_template())) for t in self.tools or [])


class CountTokensRequest(MessagesPrompt):
    """`messages.count_tokens`: the prompt, counted as the engine counts it."""


class Metadata(Schema):
    user_id: str | None = Field(None, max_length=1024)


class Diagnostics(Schema):
    previous_message_id: str | None = Field(None, max_length=MAX_ID_CHARS)


class MessagesRequest(MessagesPrompt):
    """`messages.create`. `max_tokens` 0 warms the prompt cache and answers nothing (as
    Anthropic's does). `temperature`, `top_p` and `top_k` are older clients' (the current
    SDK dropped them); Anthropic's default temperature is 1."""

    max_tokens: int = Field(ge=0, le=MAX_TOKENS)
    stop_sequences: list[Annotated[str, Field(max_length=MAX_STOP_CHARS)]] | None = Field(
        None, max_length=MAX_STOP_SEQUENCES
    )
    stream: bool = False
    temperature: float = Field(1.0, ge=0.0, le=1.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0, le=2**31 - 1)
    # Accepted, no effect on a local server: no abuse detection, one service tier, one
    # place, no cache-miss report (the answer's `diagnostics` is null).
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None
    inference_geo: str | None = Field(None, max_length=64)
    diagnostics: Diagnostics | None = None
    container: None = None  # a code-execution container: no server tools run here
    billing_policy: Any = None  # (beta) nothing is billed
    fallback_credit_token: Any = None  # (beta) nothing is refused for policy here

    @model_validator(mode="before")
    @classmethod
    def _no_container(cls, value: Any) -> Any:
        if isinstance(value, dict) and value.get("container") is not None:
            raise ValueError("container: no code-execution containers run here (server tools)")
        return value

    def sampling(self) -> dict[str, Any]:
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "stop": [stop for stop in self.stop_sequences or [] if stop],
        }

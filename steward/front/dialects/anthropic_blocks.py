"""Anthropic's content blocks and messages, validated, and how they meet a chat template.

`system` (string or text blocks) is a system turn; a message's text blocks are joined
with a newline; a `tool_use` block is an assistant's tool call (its `input` as the
arguments object templates expect); each `tool_result` is a `tool` turn of its own, in
place, named after the call it answers (`is_error`: its text begins "Error: "; a
`tool_reference` in it, a tool search's find, is the tool's definition); `thinking`
blocks sent back are the assistant's `reasoning_content`, which templates that render past
thinking read (`redacted_thinking` is opaque and left out). Images travel apart, as chat's
do (`Generate.images`), a placeholder in their place; an image in a tool's result (Claude
Code's screenshots and image files) is shown in a user turn after the tool turns, since chat
templates draw images in user turns only. A block type of Anthropic's that steward does not
serve (documents, search results, server tools' blocks) is a 400 naming it.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BeforeValidator, Discriminator, Field, Tag, model_validator

from steward.front.dialects.chat_schema import MAX_PARTS
from steward.front.dialects.openai import Schema

MAX_ID_CHARS = 256
TOOL_NAME = r"^[A-Za-z0-9_.-]{1,128}$"

Name = Annotated[str, Field(pattern=TOOL_NAME)]


def _blocks(value: Any) -> Any:
    """A string is shorthand for one text block (Anthropic's own rule)."""
    return [{"type": "text", "text": value}] if isinstance(value, str) else value


def _kind(known: tuple[str, ...]) -> Discriminator:
    """Blocks told apart by `type`; a type Anthropic has and steward does not serve gets
    the 400 that says so (`Unserved`), not a list of every tag."""

    def kind(value: Any) -> str:
        found = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
        return found if found in known else "unserved"

    return Discriminator(kind)


class CacheControl(Schema):
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class Cached(Schema):
    """`cache_control` is accepted wherever Anthropic takes it, and changes nothing: the
    prompt cache is automatic (every prompt's longest cached prefix is reused)."""

    cache_control: CacheControl | None = None


class Unserved(Schema):
    """A block type of Anthropic's that steward does not serve: a 400 naming it."""

    type: str
    served: ClassVar[str] = (
        "text, image, tool_use, tool_result, thinking and redacted_thinking blocks"
    )

    @model_validator(mode="before")
    @classmethod
    def _refuse(cls, value: Any) -> Any:
        found = value.get("type") if isinstance(value, dict) else None
        raise ValueError(f"{found!r} blocks are not served here (steward takes {cls.served})")


class UnservedResult(Unserved):
    served: ClassVar[str] = "text, image and tool_reference blocks in a tool's result"


class TextBlock(Cached):
    type: Literal["text"]
    text: str
    # Sent back with an earlier answer's text; the text is what the model reads.
    citations: list[dict[str, Any]] | None = Field(None, max_length=MAX_PARTS)


class Base64Source(Schema):
    type: Literal["base64"]
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    data: str


class URLSource(Schema):
    type: Literal["url"]
    url: str = Field(max_length=8192)


class ImageBlock(Cached):
    type: Literal["image"]
    source: Annotated[Base64Source | URLSource, Field(discriminator="type")]
    transformations: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _untransformed(self) -> ImageBlock:
        if self.transformations:  # an empty object is the same as none (Anthropic's rule)
            raise ValueError("transformations: not served; images are downscaled to --max-edge")
        return self

    def url(self) -> str:
        """As images.py takes it: a data URL, or (with --allow-image-urls) the URL."""
        source = self.source
        if isinstance(source, URLSource):
            return source.url
        return f"data:{source.media_type};base64,{source.data}"


class ToolUseBlock(Cached):
    type: Literal["tool_use"]
    id: str = Field(max_length=MAX_ID_CHARS)
    name: Name
    input: dict[str, Any]
    caller: dict[str, Any] | None = None
    toolset_name: None = None  # a server toolset's member: no server tools here

    @model_validator(mode="after")
    def _direct(self) -> ToolUseBlock:
        if self.caller is not None and self.caller.get("type") != "direct":
            raise ValueError("caller: only direct calls (no server tool calls tools here)")
        return self


class ToolReferenceBlock(Cached):
    """A tool a tool search found (Claude Code's `ToolSearch` answers with these), which
    Anthropic expands to the tool's definition: written as the `<function>` line that
    ToolSearch's own description promises (`ToolResultBlock.text`)."""

    type: Literal["tool_reference"]
    tool_name: Name


ResultBlock = Annotated[
    Annotated[TextBlock, Tag("text")]
    | Annotated[ImageBlock, Tag("image")]
    | Annotated[ToolReferenceBlock, Tag("tool_reference")]
    | Annotated[UnservedResult, Tag("unserved")],
    _kind(("text", "image", "tool_reference")),
]


class ToolResultBlock(Cached):
    type: Literal["tool_result"]
    tool_use_id: str = Field(max_length=MAX_ID_CHARS)
    content: Annotated[list[ResultBlock], BeforeValidator(_blocks)] = Field(
        default_factory=list, max_length=MAX_PARTS
    )
    is_error: bool = False
    toolset_name: None = None

    def text(self, tools: dict[str, dict[str, Any]] | None = None) -> str:
        """Its text; a tool reference as the `<function>` line of the tool's definition
        (`tools`: name -> the template's function), or of its name alone."""
        lines = []
        for block in self.content:
            if isinstance(block, ToolReferenceBlock):
                definition = (tools or {}).get(block.tool_name, {"name": block.tool_name})
                lines.append(f"<function>{json.dumps(definition)}</function>")
            elif isinstance(block, TextBlock):
                lines.append(block.text)
        text = "\n".join(lines)
        return "Error: " + text if self.is_error else text

    def images(self) -> list[ImageBlock]:
        return [block for block in self.content if isinstance(block, ImageBlock)]


class ThinkingBlock(Schema):
    type: Literal["thinking"]
    thinking: str
    signature: str  # steward's own, or another server's: not checked (module doc)


class RedactedThinkingBlock(Schema):
    type: Literal["redacted_thinking"]
    data: str


BLOCKS = ("text", "image", "tool_use", "tool_result", "thinking", "redacted_thinking")
Block = Annotated[
    Annotated[TextBlock, Tag("text")]
    | Annotated[ImageBlock, Tag("image")]
    | Annotated[ToolUseBlock, Tag("tool_use")]
    | Annotated[ToolResultBlock, Tag("tool_result")]
    | Annotated[ThinkingBlock, Tag("thinking")]
    | Annotated[RedactedThinkingBlock, Tag("redacted_thinking")]
    | Annotated[Unserved, Tag("unserved")],
    _kind(BLOCKS),
]
Blocks = Annotated[list[Block], BeforeValidator(_blocks), Field(min_length=1, max_length=MAX_PARTS)]
TextBlocks = Annotated[list[TextBlock], BeforeValidator(_blocks), Field(max_length=MAX_PARTS)]

ROLE_BLOCKS = {
    "user": (TextBlock, ImageBlock, ToolResultBlock),
    "assistant": (TextBlock, ToolUseBlock, ThinkingBlock, RedactedThinkingBlock),
    "system": (TextBlock,),
}


class MessageParam(Schema):
    role: Literal["user", "assistant", "system"]
    content: Blocks

    @model_validator(mode="after")
    def _role_blocks(self) -> MessageParam:
        allowed = ROLE_BLOCKS[self.role]
        for block in self.content:
            if not isinstance(block, allowed):
                raise ValueError(f"content: a {self.role} message has no {block.type} blocks")
        return self


def text_of(blocks: list[TextBlock]) -> str:
    return "\n".join(block.text for block in blocks)


def assistant_turn(message: MessageParam, thinking: bool, names: dict[str, str]) -> dict[str, Any]:
    turn: dict[str, Any] = {"role": "assistant", "content": text_of(blocks_of(message, TextBlock))}
    calls = []
    for block in blocks_of(message, ToolUseBlock):
        names[block.id] = block.name
        function = {"name": block.name, "arguments": block.input}
        calls.append({"id": block.id, "type": "function", "function": function})
    if calls:
        turn["tool_calls"] = calls
    if thinking:
        turn["reasoning_content"] = "\n".join(b.thinking for b in blocks_of(message, ThinkingBlock))
    return turn


def user_turns(
    message: MessageParam, names: dict[str, str], tools: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """A user (or system) message: its text and images as one turn, each tool result as a
    tool turn of its own, in the order given (`tools`: the functions tool references name).
    The images of a run of tool results open the user turn after the run (module doc)."""
    turns: list[dict[str, Any]] = []
    parts: list[TextBlock | ImageBlock] = []
    own = False  # whether `parts` holds the message's own blocks, not only tools' images

    def flush() -> None:
        nonlocal own
        own = False
        if not parts:
            return
        text = text_of([p for p in parts if isinstance(p, TextBlock)])
        content: Any = text
        if any(isinstance(p, ImageBlock) for p in parts):
            content = [
                {"type": "text", "text": p.text} if isinstance(p, TextBlock) else {"type": "image"}
                for p in parts
            ]
        turns.append({"role": message.role, "content": content})
        parts.clear()

    for block in message.content:
        if isinstance(block, ToolResultBlock):
            if own:
                flush()
            text = block.text(tools)
            turn = {"role": "tool", "tool_call_id": block.tool_use_id, "content": text}
            if name := names.get(block.tool_use_id):
                turn["name"] = name
            turns.append(turn)
            parts.extend(block.images())
        elif isinstance(block, TextBlock | ImageBlock):
            parts.append(block)
            own = True
    flush()
    return turns


def blocks_of(message: MessageParam, kind: type) -> list[Any]:
    return [block for block in message.content if isinstance(block, kind)]

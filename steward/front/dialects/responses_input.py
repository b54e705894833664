"""A Responses conversation read as the chat messages a template takes.

The conversation is items in their wire shape (responses_schema.py `canonical`): this
request's input after a stored response's whole history and output, or a stateless
client's whole history (Codex sends `store: false` and every item each turn). So the same
reading serves both, and steward's own output items read back exactly as a client's.

- `instructions` is the first, system message (a previous response's are not carried
  over, as OpenAI documents); a `developer` message is a system message (templates know
  no developer role).
- `function_call` items join the assistant message before them as its `tool_calls` (the
  arguments as an object, as templates expect them: chat_schema.py does the same; a
  namespace's function by its flat name, as the tools showed it), and a
  `function_call_output` is a `tool` message naming the call and its function.
- A `reasoning` item is the next assistant message's `reasoning_content`, for templates
  that render past thinking (Qwen3's does, for the current turn). steward's own reasoning
  items carry their text in `content`; a stateless client may send only the
  `encrypted_content` it was given, which is that text behind `ENCRYPTED` (steward
  encrypts nothing: there is no one to hide the thinking from on a local server).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from steward.front.dialects.responses_schema import flat_name

ENCRYPTED = "steward-reasoning:"  # `encrypted_content`: the thinking text, behind this


@dataclass
class Conversation:
    """The chat messages, and the images they hold, in order (each a placeholder part)."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    image_urls: list[str] = field(default_factory=list)
    chars: int = 0  # characters of text: a cheap context bound

    def add(self, message: dict[str, Any]) -> None:
        self.messages.append(message)
        content = message.get("content") or ""
        parts = [{"text": content}] if isinstance(content, str) else content
        self.chars += sum(len(part.get("text", "")) for part in parts)


def read(instructions: str | None, items: list[dict[str, Any]]) -> Conversation:
    conversation = Conversation()
    if instructions:
        conversation.add({"role": "system", "content": instructions})
    thinking: list[str] = []
    names: dict[str, str] = {}  # call_id -> function
    for item in items:
        kind = item["type"]
        if kind == "reasoning":
            thinking.append(thought(item))
        elif kind == "message":
            message = {"role": _role(item["role"]), "content": _content(item, conversation)}
            if message["role"] == "assistant" and thinking:
                message["reasoning_content"] = "".join(thinking)
                thinking = []
            conversation.add(message)
        elif kind == "function_call":
            names[item["call_id"]] = called(item)
            last = conversation.messages[-1] if conversation.messages else None
            if last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": ""}
                conversation.add(last)
            if thinking:
                last["reasoning_content"] = last.get("reasoning_content", "") + "".join(thinking)
                thinking = []
            last.setdefault("tool_calls", []).append(_call(item))
            conversation.chars += len(item["arguments"])
        elif kind == "function_call_output":
            output = item["output"]
            text = output if isinstance(output, str) else "".join(p["text"] for p in output)
            message = {"role": "tool", "tool_call_id": item["call_id"], "content": text}
            if name := item.get("name") or names.get(item["call_id"]):
                message["name"] = name
            conversation.add(message)
    return conversation


def thought(item: dict[str, Any]) -> str:
    """A reasoning item's thinking: its text, else steward's `encrypted_content`, else its
    summary."""
    if content := item.get("content"):
        return "".join(part["text"] for part in content)
    encrypted = item.get("encrypted_content") or ""
    if encrypted.startswith(ENCRYPTED):
        return encrypted.removeprefix(ENCRYPTED)
    return "\n".join(part["text"] for part in item.get("summary", []))


def _role(role: str) -> str:
    return "system" if role == "developer" else role


def _content(item: dict[str, Any], conversation: Conversation) -> str | list[dict[str, Any]]:
    """A string; with images, parts in order, each image a placeholder whose bytes travel
    separately (`Generate.images`, as in chat completions)."""
    content = item["content"]
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    for part in content:
        if part["type"] == "input_image":
            conversation.image_urls.append(part["image_url"])
            parts.append({"type": "image"})
        else:
            text = part["refusal"] if part["type"] == "refusal" else part["text"]
            parts.append({"type": "text", "text": text})
    if any(part["type"] == "image" for part in parts):
        return parts
    return "".join(part["text"] for part in parts)


def _call(item: dict[str, Any]) -> dict[str, Any]:
    try:
        arguments = json.loads(item["arguments"])
    except ValueError:
        arguments = item["arguments"]
    function = {"name": called(item), "arguments": arguments}
    return {"id": item["call_id"], "type": "function", "function": function}


def called(item: dict[str, Any]) -> str:
    """The function a `function_call` item called, as the template shows it: a namespace's
    by its flat name, as its tool was shown (responses_schema.py `NamespaceTool`)."""
    namespace = item.get("namespace")
    return flat_name(namespace, item["name"]) if namespace else item["name"]

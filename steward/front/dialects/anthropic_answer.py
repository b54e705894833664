"""An Anthropic `message`, whole or as its event stream, from the one answer stream.

A message's content is blocks: `thinking` (a thinking model's thinking, `Token.reasoning`),
`text`, then a `tool_use` per call. The stream writes each block as Anthropic's grammar
has it: `content_block_start`, its deltas (`thinking_delta` then `signature_delta`,
`text_delta`, `input_json_delta`), `content_block_stop`; a block opens when the first
token of its kind comes and closes when another kind does, so a resumed stream (the
supervisor's) just goes on: the same block takes the next delta, its index unchanged.
`message_start` carries no counts yet (the stream starts before the prompt's are known);
`message_delta` carries them all, and the SDK's accumulator takes them from there. A
silence of `PING_SECONDS` (a resume waiting for a new worker) is filled with `ping`.

A thinking block's `signature` is steward's digest of its thinking text: the same for the
same thinking (a resumed stream's equals the reference's), not a proof of anything;
signatures sent back are not checked.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
from typing import Any

from steward.errors import ANTHROPIC, ApiError
from steward.front.dialects.seam import Answer, sse
from steward.supervisor.jobs import Job
from steward.wire.protocol import CallDelta, Done, Token

PING_SECONDS = 10.0


def signature(thinking: str) -> str:
    digest = hashlib.sha256(b"steward-thinking\0" + thinking.encode()).digest()
    return base64.b64encode(digest).decode()


def tool_use_id() -> str:
    return "toolu_" + secrets.token_hex(12)


def event(body: dict[str, Any]) -> str:
    """An Anthropic SSE event: named by its type, as the SDK reads it."""
    return sse(body, event=body["type"])


class MessageAnswer(Answer):
    idle_seconds = PING_SECONDS

    def __init__(
        self,
        model: str,
        request_id: str,
        max_tokens: int,
        *,
        omit_thinking: bool = False,
    ) -> None:
        self.model = model
        self.id = "msg_" + request_id[:48]
        self.max_tokens = max_tokens  # the client's; 0 warms the cache and answers nothing
        self.omit_thinking = omit_thinking  # display: omitted
        self.blocks = BlockStream(omit_thinking)

    # -- the whole message ----------------------------------------------------------------

    def full(self, jobs: list[Job], dones: list[Done]) -> dict[str, Any]:
        (job,), (done,) = jobs, dones
        content: list[dict[str, Any]] = []
        if self.max_tokens:
            if thinking := "".join(job.reasoning):
                shown = "" if self.omit_thinking else thinking
                content.append(
                    {"type": "thinking", "thinking": shown, "signature": signature(thinking)}
                )
            if text := "".join(job.text):
                content.append({"type": "text", "text": text})
            content += [_tool_use(name, arguments) for name, arguments in self._calls(job.calls)]
        return {
            **self.message(content),
            "stop_reason": self.stop_reason(done),
            "stop_sequence": done.stop_sequence or None,
            "usage": self.usage(done) | {"service_tier": "standard"},
        }

    def message(self, content: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": None,
            "stop_sequence": None,
            "stop_details": None,
            "container": None,
            "diagnostics": None,
        }

    def _calls(self, parts: list[CallDelta]) -> list[tuple[str, str]]:
        calls: dict[int, list[str]] = {}
        for part in parts:
            call = calls.setdefault(part.index, ["", ""])
            call[0] += part.name or ""
            call[1] += part.arguments
        return [(name, arguments) for name, arguments in calls.values()]

    def stop_reason(self, done: Done) -> str:
        if not self.max_tokens:
            return "max_tokens"
        if done.finish_reason == "tool_calls":
            return "tool_use"
        if done.finish_reason == "length":  # the context ended it first (`Ask.fit_context`)
            short = done.completion_tokens < self.max_tokens
            return "model_context_window_exceeded" if short else "max_tokens"
        return "stop_sequence" if done.stop_sequence else "end_turn"

    def usage(self, done: Done) -> dict[str, Any]:
        """Anthropic counts the prompt in parts: read from the prompt cache, and the rest;
        nothing is written to a cache a client pays for (`cache_creation_input_tokens`)."""
        output = done.completion_tokens if self.max_tokens else 0
        return {
            "input_tokens": done.prompt_tokens - done.cached_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": done.cached_tokens,
            "output_tokens": output,
            "output_tokens_details": {"thinking_tokens": min(done.reasoning_tokens, output)},
        }

    # -- the stream -----------------------------------------------------------------------

    def opening(self) -> list[str]:
        usage = {"input_tokens": 0, "output_tokens": 0}
        start = {"type": "message_start", "message": {**self.message([]), "usage": usage}}
        return [event(start), *self.idle()]

    def delta(self, index: int, token: Token, first: bool) -> list[str]:
        if not self.max_tokens:
            return []
        frames = self.blocks.thinking(token.reasoning) + self.blocks.text(token.text)
        for part in token.calls:
            frames += self.blocks.call(part)
        return frames

    def finished(self, index: int, done: Done, first: bool) -> list[str]:
        stop = done.stop_sequence or None
        delta = {"stop_reason": self.stop_reason(done), "stop_sequence": stop}
        ending = {"type": "message_delta", "delta": delta, "usage": self.usage(done)}
        return [*self.blocks.close(), event(ending)]

    def closing(self, dones: list[Done]) -> list[str]:
        return [event({"type": "message_stop"})]

    def failed(self, error: ApiError, request_id: str) -> list[str]:
        return [sse(ANTHROPIC.body(error, request_id), event="error")]

    def idle(self) -> list[str]:
        return [event({"type": "ping"})]


class BlockStream:
    """The stream's content blocks: one open at a time, numbered in order."""

    def __init__(self, omit_thinking: bool) -> None:
        self.omit_thinking = omit_thinking
        self.kind = ""  # the open block's: "thinking", "text", "tool_use"; "" none
        self.index = -1  # the open (or last) block's
        self.calling = -1  # the open tool_use block's call index
        self.thought = ""  # the open thinking block's text, for its signature

    def thinking(self, text: str) -> list[str]:
        if not text:
            return []
        frames = self._open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
        self.thought += text
        if not self.omit_thinking:
            frames.append(self._delta({"type": "thinking_delta", "thinking": text}))
        return frames

    def text(self, text: str) -> list[str]:
        if not text:
            return []
        frames = self._open("text", {"type": "text", "text": ""})
        return [*frames, self._delta({"type": "text_delta", "text": text})]

    def call(self, part: CallDelta) -> list[str]:
        frames: list[str] = []
        if part.name is not None or part.index != self.calling:
            start = {"type": "tool_use", "id": tool_use_id(), "name": part.name or "", "input": {}}
            frames = self._open("tool_use", start, fresh=True)
            self.calling = part.index
        if part.arguments:
            frames.append(self._delta({"type": "input_json_delta", "partial_json": part.arguments}))
        return frames

    def close(self) -> list[str]:
        if not self.kind:
            return []
        frames = []
        if self.kind == "thinking":
            frames.append(
                self._delta({"type": "signature_delta", "signature": signature(self.thought)})
            )
            self.thought = ""
        frames.append(event({"type": "content_block_stop", "index": self.index}))
        self.kind, self.calling = "", -1
        return frames

    def _open(self, kind: str, block: dict[str, Any], fresh: bool = False) -> list[str]:
        if self.kind == kind and not fresh:
            return []
        frames = self.close()
        self.kind = kind
        self.index += 1
        start = {"type": "content_block_start", "index": self.index, "content_block": block}
        return [*frames, event(start)]

    def _delta(self, delta: dict[str, Any]) -> str:
        return event({"type": "content_block_delta", "index": self.index, "delta": delta})


def _tool_use(name: str, arguments: str) -> dict[str, Any]:
    """A whole call; arguments cut short by max_tokens are no object: the call's input is
    then empty (the stream sent what there was)."""
    try:
        given = json.loads(arguments) if arguments else {}
    except ValueError:
        given = {}
    return {
        "type": "tool_use",
        "id": tool_use_id(),
        "name": name,
        "input": given if isinstance(given, dict) else {},
    }


class TokenCount(Answer):
    """`count_tokens`: the prompt as the engine counted it (`Done.prompt_tokens` of a
    one-token answer that nobody sees)."""

    def full(self, jobs: list[Job], dones: list[Done]) -> dict[str, Any]:
        return {"input_tokens": dones[0].prompt_tokens}

    def delta(self, index: int, token: Token, first: bool) -> list[str]:
        return []

    def finished(self, index: int, done: Done, first: bool) -> list[str]:
        return []

    def closing(self, dones: list[Done]) -> list[str]:
        return []

    def failed(self, error: ApiError, request_id: str) -> list[str]:
        return []

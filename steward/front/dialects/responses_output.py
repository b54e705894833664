"""A Responses answer's output items as they grow, and the stream events each piece makes.

One `Output` per response, fed the answer's pieces in order (`add`: a token's thinking,
text and tool-call parts); a whole answer is fed as one piece, so a JSON answer and a
stream's last `response.completed` hold the same items. Items open and close in the
order the answer makes them: a `reasoning` item while the model thinks, a `message`
while it answers, a `function_call` per call; a new kind of piece closes the open item
(`*.done`, `content_part.done`, `output_item.done`).

Every event carries the next `sequence_number` of the one counter this object holds. A
stream resumed after a worker fault goes on feeding the same `Output` (the supervisor
continues the same answer), so the numbers continue with no gap and no repeat, and the
open item just goes on: one unbroken stream.

The worker carries out the rules about the answer (worker/toolcalls.py): a forced call's
text is never output, and without parallel calls only the first comes. A call to a
namespace's function (the model calls it by its flat name) is a `function_call` item with
its `namespace` and `name` apart, as OpenAI's API writes it and Codex dispatches it.
"""

from __future__ import annotations

import secrets
from typing import Any

from steward.front.dialects.openai import logprob_entry
from steward.front.dialects.responses_input import ENCRYPTED
from steward.front.dialects.seam import sse
from steward.wire.protocol import CallDelta, Done, Logprob


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


class Output:
    def __init__(
        self,
        *,
        logprobs: bool,
        encrypted: bool,
        namespaced: dict[str, tuple[str, str]] | None = None,
    ) -> None:
        self.namespaced = namespaced or {}  # a flat name -> its namespace and name
        self.logprobs = logprobs
        self.encrypted = encrypted  # `include` asked for `reasoning.encrypted_content`
        self.items: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None
        self.calls: dict[int, dict[str, Any]] = {}  # a call's index -> its item
        self.held: list[dict[str, Any]] = []  # log-probabilities not yet given with text
        self.sequence = 0
        self.frames: list[str] = []

    def event(self, kind: str, **fields: Any) -> None:
        body = {"type": kind, **fields, "sequence_number": self.sequence}
        self.sequence += 1
        self.frames.append(sse(body, event=kind))

    def take(self) -> list[str]:
        """The frames made since the last take."""
        frames, self.frames = self.frames, []
        return frames

    def add(
        self, text: str, reasoning: str, calls: list[CallDelta], logprobs: list[Logprob]
    ) -> None:
        """The answer's next piece (a token's, or the whole answer's)."""
        if self.logprobs:
            self.held += [logprob_entry(entry) for entry in logprobs]
        if reasoning:
            self._think(reasoning)
        if text:
            self._say(text)
        for part in calls:
            self._call(part)

    def finish(self, done: Done) -> None:
        """The answer ended: its last item closes, incomplete if the token budget cut it."""
        self.close("incomplete" if done.finish_reason == "length" else "completed")

    def close(self, status: str = "completed") -> None:
        item, self.open = self.open, None
        if item is None:
            return
        where = {"item_id": item["id"], "output_index": self.items.index(item)}
        if item["type"] == "reasoning":
            part = item["content"][0]
            self.event("response.reasoning_text.done", **where, content_index=0, text=part["text"])
            self.event("response.content_part.done", **where, content_index=0, part=part)
            if self.encrypted:
                item["encrypted_content"] = ENCRYPTED + part["text"]
        elif item["type"] == "message":
            part = item["content"][0]
            if self.held:
                part["logprobs"] += self.held
                self.held = []
            text, logprobs = part["text"], part["logprobs"]
            self.event(
                "response.output_text.done", **where, content_index=0, text=text, logprobs=logprobs
            )
            self.event("response.content_part.done", **where, content_index=0, part=part)
        else:
            self.event(
                "response.function_call_arguments.done",
                **where,
                name=item["name"],
                arguments=item["arguments"],
            )
        item["status"] = status
        self.event("response.output_item.done", output_index=where["output_index"], item=item)

    def _open(self, item: dict[str, Any]) -> dict[str, Any]:
        self.close()
        item["status"] = "in_progress"
        self.items.append(item)
        self.open = item
        self.event("response.output_item.added", output_index=len(self.items) - 1, item=item)
        return item

    def _where(self, item: dict[str, Any]) -> dict[str, Any]:
        return {"item_id": item["id"], "output_index": self.items.index(item)}

    def _think(self, text: str) -> None:
        item = self.open
        if item is None or item["type"] != "reasoning":
            item = self._open({"id": new_id("rs"), "type": "reasoning", "summary": []})
            part = {"type": "reasoning_text", "text": ""}
            self.event(
                "response.content_part.added", **self._where(item), content_index=0, part=part
            )
            item["content"] = [part]
        item["content"][0]["text"] += text
        self.event(
            "response.reasoning_text.delta", **self._where(item), content_index=0, delta=text
        )

    def _say(self, text: str) -> None:
        item = self.open
        if item is None or item["type"] != "message":
            shell = {"id": new_id("msg"), "type": "message", "role": "assistant", "content": []}
            item = self._open(shell)
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            self.event(
                "response.content_part.added", **self._where(item), content_index=0, part=part
            )
            item["content"].append(part)
        part = item["content"][0]
        part["text"] += text
        held, self.held = self.held, []
        part["logprobs"] += held
        self.event(
            "response.output_text.delta",
            **self._where(item),
            content_index=0,
            delta=text,
            logprobs=held,
        )

    def _call(self, part: CallDelta) -> None:
        if part.name is not None:
            item = {"id": new_id("fc"), "type": "function_call"}
            item["call_id"] = "call_" + secrets.token_hex(12)
            if part.name in self.namespaced:  # as the client dispatches it: apart
                item["namespace"], item["name"] = self.namespaced[part.name]
            else:
                item["name"] = part.name
            item["arguments"] = ""
            self.calls[part.index] = self._open(item)
        item = self.calls.get(part.index)
        if item is None or not part.arguments:
            return  # arguments before their call's name: the worker sends none
        item["arguments"] += part.arguments
        self.event(
            "response.function_call_arguments.delta", **self._where(item), delta=part.arguments
        )

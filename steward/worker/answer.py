"""An answer's text as the client gets it: held back and cut at stop strings, its tool
calls taken out, and the finish reason that follows (`tool_calls` once a call was made).
The same for a batch member (engine.py) and a request mlx-vlm runs alone (vision.py)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from steward.wire.protocol import CallDelta
from steward.worker.stops import StopMatcher
from steward.worker.toolcalls import ToolCalls


class Answer:
    def __init__(self, stops: list[str], calls: ToolCalls | None) -> None:
        forced = calls is not None and calls.mode != "auto"  # its JSON is no text to cut
        self.stops = StopMatcher([] if forced else stops)
        self.calls = calls

    def resume(self, segments: Iterable[str]) -> None:
        """The text of the tokens the client already has (a resumed stream): the state it
        leaves behind, not its text again."""
        for segment in segments:
            piece, _ = self.stops.feed(segment)
            if self.calls is not None:
                self.calls.feed(piece)

    def feed(self, segment: str, finish: str | None) -> tuple[str, list[CallDelta], str | None]:
        """A token's text (`finish`: the model ended, "stop" or "length"): the text to send,
        the tool calls found, and the answer's finish reason if it is done."""
        piece, stopped = self.stops.feed(segment)
        finish = "stop" if stopped else finish
        if finish and not stopped:
            piece += self.stops.flush()
        calls: list[CallDelta] = []
        if self.calls is not None:
            piece, calls = self.calls.feed(piece)
            if finish:
                rest, more = self.calls.finish()
                piece, calls = piece + rest, calls + more
            if finish == "stop" and self.calls.made:
                finish = "tool_calls"
        return piece, calls, finish


def segments(detokenizer: Any, tokens: Iterable[int]) -> Iterator[str]:
    """Each token's text, as mlx-lm's streaming `detokenizer` gives it."""
    for token in tokens:
        detokenizer.add_token(token)
        yield detokenizer.last_segment

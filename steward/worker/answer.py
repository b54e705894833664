"""An answer's text as the client gets it: a thinking model's thinking split off, the rest
held back and cut at stop strings, its tool calls taken out, and the finish reason that
follows (`tool_calls` once a call was made). The same for a batch member (engine.py) and a
request mlx-vlm runs alone (vision.py).

Stop strings and tool calls are looked for in the answer proper only: a model thinking
aloud about a stop string or a tool's format has not stopped or called anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from steward.wire.protocol import CallDelta, Logprob, Token
from steward.worker.reasoning import ReasoningSplit
from steward.worker.stops import StopMatcher
from steward.worker.toolcalls import ToolCalls


class Piece(NamedTuple):
    """What one token (or the final flush) adds: answer text, thinking text, tool calls,
    and the answer's finish reason if it is done."""

    text: str
    reasoning: str
    calls: list[CallDelta]
    finish: str | None

    @property
    def empty(self) -> bool:
        """Nothing for the client (a marker's token, text held back)."""
        return not (self.text or self.reasoning or self.calls)

    def token(self, req_id: int, token: int, logprob: Logprob | None) -> Token:
        """The piece as the front gets it (`token` -1: no token of its own)."""
        return Token(req_id, token, self.text, logprob, self.calls, self.reasoning)


class Answer:
    """One answer's text state: its streaming detokenizer (mlx-lm's), the reasoning split,
    the stop strings and the tool calls, fed token by token."""

    def __init__(
        self,
        detokenizer: Any,
        stops: list[str],
        calls: ToolCalls | None,
        split: ReasoningSplit | None = None,
    ) -> None:
        forced = calls is not None and calls.forced  # its JSON is no text to cut
        self.detokenizer = detokenizer
        self.stops = StopMatcher([] if forced else stops)
        self.calls = calls
        self.split = split

    @property
    def stop_sequence(self) -> str:
        """The stop string that ended the answer, if one did."""
        return self.stops.matched

    @property
    def reasoning_tokens(self) -> int:
        """Of the tokens fed (resumed ones included), those that were thinking."""
        return self.split.tokens if self.split is not None else 0

    def resume(self, tokens: Iterable[int]) -> None:
        """The tokens the client already has (a resumed stream): the state they leave
        behind (inside thinking or not, a stop string begun, a call begun), not their text
        again."""
        for segment in segments(self.detokenizer, tokens):
            _, text = self._split(segment, None, token=True)
            piece, _ = self.stops.feed(text)
            if self.calls is not None:
                self.calls.feed(piece)

    def feed(self, token: int | None, finish: str | None) -> Piece:
        """A generated token (None: no token, the end token or the final flush) and
        `finish`, set when the model ended ("stop" or "length")."""
        if token is not None:
            self.detokenizer.add_token(token)
        if finish:
            self.detokenizer.finalize()
        return self.feed_text(self.detokenizer.last_segment, finish, token is not None)

    def feed_text(self, segment: str, finish: str | None, token: bool = True) -> Piece:
        """`feed`, from the token's text (`token` False: text that is no token's own)."""
        reasoning, text = self._split(segment, finish, token)
        piece, stopped = self.stops.feed(text)
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
        return Piece(piece, reasoning, calls, finish)

    def _split(self, segment: str, finish: str | None, token: bool) -> tuple[str, str]:
        """(thinking text, answer text) of a segment; at the end, with what was held."""
        if self.split is None:
            return "", segment
        reasoning, text = self.split.feed(segment, token)
        if finish:
            held_reasoning, held_text = self.split.flush()
            reasoning, text = reasoning + held_reasoning, text + held_text
        return reasoning, text


def segments(detokenizer: Any, tokens: Iterable[int]) -> Iterator[str]:
    """Each token's text, as mlx-lm's streaming `detokenizer` gives it."""
    for token in tokens:
        detokenizer.add_token(token)
        yield detokenizer.last_segment

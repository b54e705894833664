"""A thinking model's answer split in two: the thinking text, and the answer proper.

mlx-lm's tokenizer says whether a model marks its thinking, and with what (`<think>` and
`</think>`, or a sequence of tokens such as `<|channel>thought`). The split is made on the
text, as mlx-lm's own server makes it, not on token ids: a streaming detokenizer may hold a
token's text back and give it with the next token's, so a marker's text can arrive together
with text on either side of it, or (a marker of several tokens) in pieces. Text that may be
the start of a marker is held back until it is known not to be, as stop strings are
(stops.py). The markers themselves are text of neither part.

What comes after a fault is told by the tokens the client already has (`resume`), fed
through the split again; whether an answer starts inside a thinking block, by its prompt:
some templates open the block in the generation prompt.
"""

from __future__ import annotations

from typing import Any

from steward.worker.stops import overlap


class ReasoningSplit:
    """The split of one answer. `inside`: in a thinking block now. `tokens`: how many
    of the tokens fed were thinking (their text thinking, or a marker's)."""

    def __init__(self, start: str, end: str, inside: bool) -> None:
        self.start = start
        self.end = end
        self.inside = inside
        self.pending = ""  # text that may be the start of the next marker
        self.tokens = 0

    def feed(self, text: str, token: bool = True) -> tuple[str, str]:
        """A token's text (`token` False: text that is no token of its own, a final flush):
        (its thinking text, its answer text), as far as they are known now."""
        thought = self.inside  # the token was thinking, or a marker's
        thinking, answer = [], []
        self.pending += text
        while (at := self.pending.find(marker := self._marker)) >= 0:
            (thinking if self.inside else answer).append(self.pending[:at])
            self.pending = self.pending[at + len(marker) :]
            self.inside = not self.inside
            thought = True
        cut = len(self.pending) - overlap(self.pending, self._marker)
        (thinking if self.inside else answer).append(self.pending[:cut])
        self.pending = self.pending[cut:]
        if token and thought:
            self.tokens += 1
        return "".join(thinking), "".join(answer)

    def flush(self) -> tuple[str, str]:
        """At the answer's end: the text held back is no marker after all."""
        held, self.pending = self.pending, ""
        return (held, "") if self.inside else ("", held)

    @property
    def _marker(self) -> str:
        return self.end if self.inside else self.start


def split_for(tokenizer: Any, prompt: list[int]) -> ReasoningSplit | None:
    """The split for an answer to `prompt` (token ids, after the chat template), None where
    the model marks no thinking; in a thinking block at once if the prompt opened one."""
    if not tokenizer.has_thinking:
        return None
    opened = tokenizer.rfind_think_start(prompt) > tokenizer.rfind_think_end(prompt)
    return ReasoningSplit(tokenizer.think_start, tokenizer.think_end, opened)

"""A request with its input encoded off the batch's loop (inbox.py), before the loop takes it.

Encoding a 13k-token prompt (chat template and tokenizer) is 30-50 ms of an H200 host's
CPU; three arriving together held the loop, and every member's next token, for 100-145 ms
(bench/agents.py). The tokenizer releases the GIL while it works, so done as each message
is read, it overlaps the batch's steps instead. What encoding raised is kept for `add`,
on the loop, where it means what it meant there: a request's 400, or a fault.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, eq=False)
class Prepared:
    req: Any  # the Generate or Embed
    encoded: Any  # what the engine's `prepare` made of it
    error: Exception | None = None

    @property
    def id(self) -> int:
        return self.req.id

    def value(self) -> Any:
        """What was made, or what encoding raised, raised again."""
        if self.error is not None:
            raise self.error
        return self.encoded


def prepared(req: Any, encode: Callable[[Any], Any]) -> Prepared:
    """`encode(req)`, kept with what it raised."""
    try:
        return Prepared(req, encode(req))
    except Exception as exc:
        return Prepared(req, None, exc)

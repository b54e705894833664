"""Prefill chunks sized by measured speed, not a fixed count of tokens.

Each engine step decodes one token for every member and prefills one chunk of the prompts
that are joining; the members decoding wait for that chunk. A fixed 512-token chunk is
both too small and too large: on a GPU each chunk pays a whole step's host cost, so long
prompts take 8-10 times what the device needs (three 13k-token prompts on an H200); on a
slow machine one chunk of a big model stalls every stream for seconds. So the chunk is
sized from the prefill speed the generator measures (mlx-lm counts the tokens and the
time of every chunk): as many tokens per prompt as the joining prompts together prefill in
`BUDGET` seconds, a power of two (few shapes: each new one is compiled once, warmup.py)
between `LOW` and `HIGH`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from steward.worker.batch import Batch

BUDGET = 0.1  # seconds a chunk may take: the stall a decoding member sees, less its step
LOW = 512  # mlx-lm's chunk before: below it, per-chunk costs dominate
HIGH = 4096  # a deep context's chunk costs more than the speed measured early in it
SMOOTHING = 0.5  # weight of the newest measurement


def power_of_two(tokens: float) -> int:
    """The largest power of two at most `tokens`, within [LOW, HIGH]."""
    size = LOW
    while size * 2 <= min(tokens, HIGH):
        size *= 2
    return size


class Chunks:
    """The chunk size for the next prefill, from the speed of the ones before."""

    def __init__(self) -> None:
        self.size = LOW
        self.rate = 0.0  # prompt tokens per second, smoothed
        self.timed = False  # the rate comes from a step that was not its shape's first
        self._seen = (0, 0.0)  # the generator's counters when last read

    def measured(self, batch: Batch, timed: bool = True) -> None:
        """After a step: fold in the chunk it prefilled, if any."""
        tokens, spent = batch.prefill_counters()
        new_tokens, new_time = tokens - self._seen[0], spent - self._seen[1]
        self._seen = (tokens, spent)
        self.observe(new_tokens, new_time, timed)

    def observe(self, tokens: int, seconds: float, timed: bool = True) -> None:
        """`tokens` prompt tokens prefilled in `seconds` (a batch's chunk, or a request's
        alone). Not `timed`: the first step of its shape, whose time is mostly kernels
        being built; it only stands in until a timed step comes."""
        if tokens < LOW // 2 or seconds <= 0:  # a prompt's tail: too small to time
            return
        rate = tokens / seconds
        if not timed:
            self.rate = self.rate or rate
            return
        smoothed = SMOOTHING * rate + (1 - SMOOTHING) * self.rate
        self.rate = smoothed if self.timed else rate
        self.timed = True

    def planned(self, batch: Batch) -> int:
        """The chunk for the prompts that will prefill in the batch's next step."""
        return sized(self.rate, max(1, batch.prompts_waiting()))

    def resize(self, batch: Batch) -> None:
        """Before a step: the chunk for the prompts that will prefill in it."""
        self.size = self.planned(batch)
        batch.chunk(self.size)

    def reset(self, batch: Batch) -> None:
        """A new batch (after a fault) starts with what was measured."""
        self._seen = (0, 0.0)
        self.resize(batch)


def sized(rate: float, prompts: int = 1) -> int:
    """The chunk per prompt when `prompts` prefill together at `rate` tokens/s (LOW while
    the speed is unknown)."""
    return power_of_two(rate * BUDGET / prompts) if rate else LOW

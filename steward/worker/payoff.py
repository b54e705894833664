"""Whether verify steps pay, on the worker's own clock (`--speculate auto`).

A verify step gives every row its fed token and the drafts it keeps, and costs more than a
decode step of the same rows: the positions it computes, the rows it rolls back, the
synchronous wait that a decode step overlaps with the next, the drafting, the kernels of
its shapes, and the output work of the tokens it gives (which the step after it waits for
where that work is the slower). Whether the tokens it gives are worth that depends on the
device, the model, the batch's width and what the members copy, so it is measured here
rather than assumed: speculation pays where verify steps' seconds per token a row are at
most decode steps' (a decode step gives one token a row).

Both are measured over windows of `WINDOW` steps of one sort, per kind of step (a request
alone on the single-sequence loop, or the batch with its rows rounded up to a power of
two: a step's cost grows with its rows), in wall-clock seconds from the end of the step
before to the end of the step: everything the worker does for a step counts, its waits
too. A per-step clock that leaves out what a step waits for, or a step's first shape,
judged verify steps paying on the H200 that made a request alone 0.6-0.7x as fast. No step
that prefills counts (its cost is the prompt's); a decode step of a shape met for the first
time does not either (plain decoding meets it too), a verify step's does (its kernels are
a cost of verifying).

A kind decodes until a window of its decode steps is measured. Then its verify steps are
judged a window at a time: where they cost more a token, the kind decodes plainly for a
pause, each pause twice as long as the last (a workload that never pays spends a window in
thousands of steps on trying), and is tried afresh after it; where they pay, the pauses
start short again, and every `FRESH` verify steps a window of decode steps is measured
anew. Decode steps taken meanwhile (members that drafted nothing) measure it too. A window
of verify steps that has taken the time of `OVERRUN` windows of decode steps is judged at
once, on the steps it has: a trial costs at most that, however dear its steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

WINDOW = 16  # steps of one sort a measure is taken over
FRESH = 256  # verify steps between two measures of the decode steps
FIRST_PAUSE = 64  # steps of a kind's first pause; each next one is twice as long
LONGEST_PAUSE = 4096
# A window of verify steps is judged early once it has taken the time of this many windows
# of decode steps: a verify step that costs tens of decode steps (a draft model drafting
# for eight members one after the other: 0.41x on the H200) is tried for a few steps, not
# sixteen.
OVERRUN = 2

Kind = tuple[bool, int]  # (alone, rows rounded up to a power of two)


def kind_of(alone: bool, rows: int) -> Kind:
    return alone, 1 << max(rows - 1, 0).bit_length()


class Taken(NamedTuple):
    """A step as judged: `tokens` given to `rows` rows in `seconds` (wall clock, since the
    step before); `verified`: drafts; `prefilled`: it prefilled too; `new`: its shape was
    met for the first time."""

    seconds: float
    rows: int
    tokens: int
    verified: bool
    prefilled: bool = False
    new: bool = False


@dataclass
class Window:
    """Steps of one sort being measured: their seconds, and their tokens a row."""

    seconds: float = 0.0
    tokens: float = 0.0
    steps: int = 0

    def add(self, seconds: float, tokens: float, budget: float = float("inf")) -> float | None:
        """One step; the window's seconds a token a row once it is full or has taken
        `budget` seconds (and it starts afresh), else None."""
        self.seconds += seconds
        self.tokens += tokens
        self.steps += 1
        if self.steps < WINDOW and self.seconds < budget:
            return None
        cost = self.seconds / self.tokens
        self.seconds, self.tokens, self.steps = 0.0, 0.0, 0
        return cost


@dataclass
class Ledger:
    """One kind's measures and where its judgement stands."""

    decode: float | None = None  # seconds a token a row of its decode steps (None: unknown)
    decoding: Window = field(default_factory=Window)
    verifying: Window = field(default_factory=Window)
    since_decode: int = 0  # verify steps since its decode steps were measured
    paused_until: int = 0  # the step count it decodes plainly until
    pause: int = FIRST_PAUSE  # steps of its next pause


class Payoff:
    """The judgements of one engine: `allows` before a step drafts, `measured` after it."""

    def __init__(self) -> None:
        self.ledgers: dict[Kind, Ledger] = {}
        self.steps = 0  # steps measured, of every kind: the clock of the pauses

    def allows(self, of: Kind) -> bool:
        """Whether a step of this kind may verify drafts."""
        ledger = self.ledgers.get(of)
        if ledger is None or ledger.decode is None or ledger.since_decode >= FRESH:
            return False
        return self.steps >= ledger.paused_until

    def measured(self, of: Kind, step: Taken) -> None:
        """A step of this kind taken."""
        self.steps += 1
        ledger = self.ledgers.setdefault(of, Ledger())
        if step.prefilled or not step.rows or not step.tokens:
            return
        per_row = step.tokens / step.rows
        if not step.verified:
            if not step.new and (cost := ledger.decoding.add(step.seconds, per_row)) is not None:
                ledger.decode, ledger.since_decode = cost, 0
            return
        ledger.since_decode += 1
        if ledger.since_decode == FRESH:  # measured anew: nothing of an older window
            ledger.decoding = Window()
        budget = OVERRUN * WINDOW * ledger.decode if ledger.decode else float("inf")
        if (cost := ledger.verifying.add(step.seconds, per_row, budget)) is not None:
            self._judge(ledger, cost)

    def paused(self) -> list[Kind]:
        """The kinds whose verify steps did not pay, decoding plainly now."""
        return [of for of, ledger in self.ledgers.items() if self.steps < ledger.paused_until]

    def _judge(self, ledger: Ledger, verify: float) -> None:
        """A window of verify steps at `verify` seconds a token a row, against decoding."""
        assert ledger.decode is not None
        if verify <= ledger.decode:
            ledger.pause = FIRST_PAUSE
            return
        ledger.paused_until = self.steps + ledger.pause
        ledger.pause = min(2 * ledger.pause, LONGEST_PAUSE)

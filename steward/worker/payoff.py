"""Whether drafting pays, on the worker's own clock (`--speculate auto`).

A verify step gives every row its fed token and the drafts it keeps, and costs more than a
decode step of the same rows: the positions it computes, the rows it rolls back, the
synchronous wait that a decode step overlaps with the next, the drafting, the kernels of
its shapes, and the output work of the tokens it gives. Some of that lands in the step
after it: the rows' caches are rolled back lazily, in the next step's graph, and that step
has nothing to overlap with. Whether the tokens are worth it depends on the device, the
model, the batch's width and what the members copy, so it is measured here rather than
assumed: drafting pays where the steps taken while members may draft cost at most what
plain steps cost, in seconds per token a row.

So the judgement compares modes, not single steps: windows of `WINDOW` steps taken while a
kind drafts (verify steps, and plain steps where no member had a draft) against windows of
steps taken while it does not, per kind of step (a request alone on the single-sequence
loop, or the batch with its rows rounded up to a power of two: a step's cost grows with its
rows), in wall-clock seconds from the end of the step before to the end of the step:
everything the worker does for a step counts, its waits too. The `AFTER` plain steps after
a verify step, of any kind, are no measure of plain steps (they carry its roll-back).
Judged per verify step instead, on the H200 at 32 members, a drafting engine's plain steps
cost 2.6 times a plain engine's, and verify steps looked paying while the mode ran at
0.44x. No step that prefills counts (its cost is the prompt's); a plain step of a shape met
for the first time does not either, in either mode (plain decoding meets it too), a verify
step's does (its kernels are a cost of verifying).

A kind decodes until a window of its plain steps is measured. Then its drafting steps are
judged a window at a time: where they cost more a token, the kind decodes plainly for a
pause, each pause twice as long as the last (a workload that never pays spends a window in
thousands of steps on trying), and is tried afresh after it; where they pay, the pauses
start short again, and every `FRESH` drafting steps a window of plain steps is measured
anew (pauses measure it too). A window of drafting steps that has taken the time of
`OVERRUN` windows of plain steps is judged at once, on the steps it has: a trial costs at
most that, however dear its steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

WINDOW = 16  # steps of one sort a measure is taken over
FRESH = 256  # drafting steps between two measures of the plain steps
FIRST_PAUSE = 64  # steps of a kind's first pause; each next one is twice as long
LONGEST_PAUSE = 4096
# A window of drafting steps is judged early once it has taken the time of this many windows
# of plain steps: a verify step that costs tens of decode steps (a draft model drafting
# for eight members one after the other: 0.41x on the H200) is tried for a few steps, not
# sixteen.
OVERRUN = 2
# Plain steps after a verify step that carry its cost: the first only queues its forward (its
# input came from the host), the second waits for that forward and the roll-back.
AFTER = 2

Kind = tuple[bool, int]  # (alone, rows rounded up to a power of two)


def kind_of(alone: bool, rows: int) -> Kind:
    return alone, 1 << max(rows - 1, 0).bit_length()


class Taken(NamedTuple):
    """A step as judged: `tokens` given to `rows` rows in `seconds` (wall clock, since the
    step before); `drafting`: taken while its kind drafts; `verified`: it verified drafts;
    `prefilled`: it prefilled too; `new`: its shape was met for the first time."""

    seconds: float
    rows: int
    tokens: int
    drafting: bool
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

    decode: float | None = None  # seconds a token a row of its plain steps (None: unknown)
    decoding: Window = field(default_factory=Window)
    drafting: Window = field(default_factory=Window)
    since_decode: int = 0  # drafting steps since its plain steps were measured
    paused_until: int = 0  # the step count it decodes plainly until
    pause: int = FIRST_PAUSE  # steps of its next pause


class Payoff:
    """The judgements of one engine: `allows` before a step drafts, `measured` after it."""

    def __init__(self) -> None:
        self.ledgers: dict[Kind, Ledger] = {}
        self.steps = 0  # steps measured, of every kind: the clock of the pauses
        self.plain = AFTER  # steps since the last verify step: its roll-back follows the engine

    def allows(self, of: Kind) -> bool:
        """Whether members may draft in a step of this kind."""
        ledger = self.ledgers.get(of)
        if ledger is None or ledger.decode is None or ledger.since_decode >= FRESH:
            return False
        return self.steps >= ledger.paused_until

    def measured(self, of: Kind, step: Taken) -> None:
        """A step of this kind taken."""
        self.steps += 1
        ledger = self.ledgers.setdefault(of, Ledger())
        carries = self.plain < AFTER  # the cost of the last verify step
        self.plain = 0 if step.verified else self.plain + 1
        if step.prefilled or not step.rows or not step.tokens:
            return
        if step.new and not step.verified:  # kernels that plain decoding builds too
            return
        per_row = step.tokens / step.rows
        if not step.drafting:
            if carries:
                return
            if (cost := ledger.decoding.add(step.seconds, per_row)) is not None:
                ledger.decode, ledger.since_decode = cost, 0
            return
        ledger.since_decode += 1
        if ledger.since_decode == FRESH:  # measured anew: nothing of an older window
            ledger.decoding = Window()
        budget = OVERRUN * WINDOW * ledger.decode if ledger.decode else float("inf")
        if (cost := ledger.drafting.add(step.seconds, per_row, budget)) is not None:
            self._judge(ledger, cost)

    def paused(self) -> list[Kind]:
        """The kinds whose drafting did not pay, decoding plainly now."""
        return [of for of, ledger in self.ledgers.items() if self.steps < ledger.paused_until]

    def _judge(self, ledger: Ledger, drafting: float) -> None:
        """A window of drafting steps at `drafting` seconds a token a row, against plain."""
        assert ledger.decode is not None
        if drafting <= ledger.decode:
            ledger.pause = FIRST_PAUSE
            return
        ledger.paused_until = self.steps + ledger.pause
        ledger.pause = min(2 * ledger.pause, LONGEST_PAUSE)

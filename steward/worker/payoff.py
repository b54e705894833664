"""Whether verify steps pay, on the worker's own step clock (`--speculate auto`).

A verify step gives every row its fed token and the drafts it keeps, and costs more than a
decode step of the same rows: the positions it computes, the rows it rolls back, the
synchronous wait that a decode step overlaps with the next. Whether the tokens it gives are
worth that depends on the device, the model, the batch's width and what the members copy,
so it is measured here rather than assumed: speculation pays where a verify step's seconds
per token a row are at most a decode step's seconds (a decode step gives one token a row).

Both are running means per kind of step: a request alone on the single-sequence loop, or
the batch with its rows rounded up to a power of two (a step's cost grows with its rows).
Only steady steps count: none that prefills, none of a shape met for the first time (MLX
builds its kernels then), and none right after a step of the other sort. A decode step
queues the next one before it reads its token, and a verify step waits for its samples: so
the first verify step after decoding also waits for the last decode step's work, and the
first decode step after verifying waits for nothing. A kind's first steps decode until its
decode step is known; while verify steps pay, every `FRESH`-th step of the kind decodes
twice more to keep that mean current. Every `TRIAL` verify steps the two are
compared: where verifying costs more a token, the kind decodes plainly for a pause, each
pause twice as long as the last (a workload that never pays spends a few trial steps in a
thousand), and is tried afresh after it; where it pays, the pauses start short again.
"""

from __future__ import annotations

from dataclasses import dataclass

WEIGHT = 0.25  # of the latest step in a running mean
TRIAL = 4  # verify steps between two judgements
FRESH = 32  # verify steps between two refreshes of the decode step's mean
FIRST_PAUSE = 32  # steps of a kind's first pause; each next one is twice as long
LONGEST_PAUSE = 2048

Kind = tuple[bool, int]  # (alone, rows rounded up to a power of two)


def kind_of(alone: bool, rows: int) -> Kind:
    return alone, 1 << max(rows - 1, 0).bit_length()


@dataclass
class Ledger:
    """One kind's measured steps and where its judgement stands."""

    decode: float | None = None  # seconds of a steady decode step (a token a row)
    verify: float | None = None  # seconds a token a row of a verify step
    last: str = ""  # the sort of its last steady step: "decode", "verify" ("" none)
    trials: int = 0  # verify steps since the last judgement
    since_decode: int = 0  # verify steps since its decode step was measured
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

    def measured(
        self, of: Kind, seconds: float, rows: int, tokens: int, verified: bool, steady: bool
    ) -> None:
        """A step of this kind: `tokens` given to `rows` rows in `seconds`, `verified`:
        drafts; `steady`: it prefilled nothing and its shape was met before."""
        self.steps += 1
        ledger = self.ledgers.setdefault(of, Ledger())
        sort = "verify" if verified else "decode"
        if steady and rows and tokens and ledger.last == sort:
            if verified:
                ledger.verify = _mean(ledger.verify, seconds * rows / tokens)
                ledger.trials += 1
                if ledger.trials >= TRIAL:
                    self._judge(ledger)
            else:
                ledger.decode = _mean(ledger.decode, seconds)
                ledger.since_decode = 0
        ledger.since_decode += verified
        ledger.last = sort if steady else ""

    def paused(self) -> list[Kind]:
        """The kinds whose verify steps did not pay, decoding plainly now."""
        return [of for of, ledger in self.ledgers.items() if self.steps < ledger.paused_until]

    def _judge(self, ledger: Ledger) -> None:
        assert ledger.decode is not None and ledger.verify is not None
        ledger.trials = 0
        if ledger.verify <= ledger.decode:
            ledger.pause = FIRST_PAUSE
            return
        ledger.paused_until = self.steps + ledger.pause
        ledger.pause = min(2 * ledger.pause, LONGEST_PAUSE)
        ledger.verify = None  # judged afresh after the pause


def _mean(old: float | None, new: float) -> float:
    return new if old is None else old + WEIGHT * (new - old)

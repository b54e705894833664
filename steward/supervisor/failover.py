"""Failover on suspicion, verdict on evidence: the decisions about a busy worker whose
silence has overrun its bound (bounds.py), as pure functions.

A silence past the bound is a suspicion, not a verdict: a slow step and a hung one look the
same until one of them ends. What is done about it depends on what a failover would cost:

- A hot spare is ready (`PROMOTE`): it serves at once, the suspects replay or resume on it,
  and the suspected worker is kept aside, not killed, until the ceiling (`--stall-timeout`,
  from its last progress). A false suspicion costs a replay on the spare, nothing more.
- A replacement can come up beside the suspect (`RACE`): a spare is starting, or another
  copy of the model fits (the standby's memory rule), a warm spare's load included. It
  starts at once while the suspect keeps its batch: if the suspect steps first, nothing is
  replayed and the replacement stays as the spare (or stops, where the standby mode keeps
  none); if the replacement is ready first, it is promoted as a hot spare would be.
- No other copy fits (`WAIT`): a failover needs the suspect's memory, so it is given as
  long as its replacement would take (ski rental: waiting costs clients no more than the
  alternative), within the ceiling, then killed and replaced.
- The restart budget cannot pay for a failover (`WAIT` until the ceiling): a healthy worker
  must never exit the process (75) for being slow.

The verdict on a worker kept aside: a step before the ceiling proves it slow, not hung (no
fault counted, the restart it cost and the strikes its suspicion made withdrawn); silence
to the ceiling is a hang (`stall`, counted, killed); a failure meanwhile is that fault.
"""

from __future__ import annotations

from enum import StrEnum


class Move(StrEnum):
    PROMOTE = "promote"  # a hot spare serves now; the suspect waits aside for its verdict
    RACE = "race"  # a replacement comes up beside the suspect: the first to progress wins
    WAIT = "wait"  # no room for a replacement: wait, then kill the suspect and replace it


class Verdict(StrEnum):
    SLOW = "slow"  # it stepped before the ceiling: no fault
    HUNG = "hung"  # silent to the ceiling: a `stall` fault
    FAILED = "failed"  # it failed (raised, exited) while suspected: that fault


def on_suspicion(hot_ready: bool, on_its_way: bool, room: bool, affordable: bool) -> Move:
    """What a suspected hang gets. `hot_ready`: a hot spare is ready to serve; `on_its_way`:
    a spare that will hold the model is starting (its copy is counted already); `room`:
    another copy of the model fits beside the suspect and what else holds one; `affordable`:
    the restart budget allows one more."""
    if not affordable:
        return Move.WAIT
    if hot_ready:
        return Move.PROMOTE
    return Move.RACE if on_its_way or room else Move.WAIT


def patience(move: Move, bound: float, bring_up: float, ceiling: float, affordable: bool) -> float:
    """Seconds of silence (from its last progress) a suspect keeps its batch for: to the
    ceiling while a replacement races it or nothing can be afforded, else as long as its
    replacement would take, at least its bound."""
    if move is not Move.WAIT or not affordable:
        return ceiling
    return min(ceiling, max(bound, bring_up))


def verdict(stepped_at: float, deadline: float, failed: bool) -> Verdict:
    """A suspect's verdict: `stepped_at` when it last stepped (0: not since), `deadline`
    its ceiling, `failed` whether it failed meanwhile. Times decide, not the order in
    which the news arrived."""
    if stepped_at and stepped_at <= deadline:
        return Verdict.SLOW
    return Verdict.FAILED if failed else Verdict.HUNG

"""The recovery decisions, as pure functions: from a fault, the canary's word, the suspects
and the budget left, to a plan the supervision loop carries out.

The worker: a fault the canary may clear is kept when the canary passes; otherwise the
worker is replaced (or, with `--on-fault exit`, the process exits 75). The suspects (the
members in flight at the fault): a payload the faults now name twice is quarantined
(quarantine.py); an allocation failure that the canary proved request-scoped is a 507 for a
request that ran alone, and a halved batch for one that did not (its members go back to
the head of the queue, as they were first in line); every other suspect runs again in the
groups that group testing chooses (groups.py), a stream that already sent tokens resuming
after them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from steward.supervisor import groups
from steward.supervisor.faults import CANARY_DECIDES, FaultClass
from steward.supervisor.jobs import Job


class Verdict(StrEnum):
    KEEP = "keep"
    REPLACE = "replace"
    EXIT = "exit"


def worker(cls: FaultClass, canary_passed: bool | None, on_fault: str) -> Verdict:
    """What becomes of the worker. `canary_passed` is None when no canary ran."""
    if cls in CANARY_DECIDES and canary_passed:
        return Verdict.KEEP
    return Verdict.EXIT if on_fault == "exit" else Verdict.REPLACE


def needs_canary(cls: FaultClass) -> bool:
    return cls in CANARY_DECIDES


@dataclass(frozen=True)
class Plan:
    quarantined: list[Job] = field(default_factory=list)  # 422 request_quarantined
    too_big: list[Job] = field(default_factory=list)  # 507 insufficient_memory
    requeue: list[Job] = field(default_factory=list)  # back to the queue's head, in order
    groups: list[list[Job]] = field(default_factory=list)  # probation, tried in order
    shrink: bool = False  # halve the batch limit for the restart window


def suspects(
    jobs: Sequence[Job],
    cls: FaultClass,
    kept: bool,
    regroup: bool,
    convicted: set[str],
    affordable: int | None,
) -> Plan:
    """What each suspect gets. `regroup`: they were a probation group already; `convicted`:
    the payloads the quarantine refuses now; `affordable`: restarts left (None when a fault
    costs no worker)."""
    live = [j for j in jobs if not j.finished]
    quarantined = [j for j in live if j.digest in convicted]
    rest = [j for j in live if j.digest not in convicted]
    if cls == FaultClass.OOM and kept:
        if len(jobs) == 1:
            return Plan(quarantined, too_big=rest)
        return Plan(quarantined, requeue=rest, shrink=True)
    # struck in its prefill or its first decode step (the prefill's token is its only one)
    primes = [j for j in rest if j.fresh <= 1]
    tried = [g for g in groups.after_fault(rest, primes, regroup, affordable) if g]
    return Plan(quarantined, groups=tried)

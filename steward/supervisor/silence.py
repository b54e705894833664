"""Whether a worker's silence is nothing yet, a suspected hang, or a hang.

A busy worker must show progress (a step, an admission) within the bound its own step
clock sets for the work in hand (bounds.py), counted from its last progress or from the
moment the batch became busy. Silent past that bound it is suspected of a hang (what is done
about it: failover.py); silent to `--stall-timeout`, the ceiling, it is hung. An idle worker
must answer its heartbeat within the ceiling. A worker that measures its calibration between
requests (worker/calibrating.py) may be inside a measuring step when a request comes, one
whose kernels are being built: until it shows progress on the request, only the ceiling
bounds it (on a machine's first start alone: the calibration is kept). Likewise a worker
that said its next step is of a shape it has not run (`Shaping`: a verify step's number of
positions a row, speculation.py), until that step ends.

A suspicion also needs a heartbeat since the last progress, and a fresh one: it is sent
every second by a thread of its own, which MLX leaves free while a step runs on the device
(it releases the GIL while it evaluates), so it says the process runs while its step does
not end. Without one the machine (or this loop) is starved, and starving is not hanging: no
suspicion then, only the ceiling. (A hang that holds the GIL is caught at the ceiling.)
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass
from enum import StrEnum

from steward.supervisor.bounds import StepBounds, Work
from steward.supervisor.jobs import Job
from steward.supervisor.line import Link

FRESH = 1.5  # seconds: a heartbeat at most this old (one is sent every second)
RECHECK = 0.1  # seconds: past its bound, a silence is judged again this soon


class Judged(StrEnum):
    SUSPECT = "suspect"  # silent past its bound: fail over as the cost allows
    HUNG = "hung"  # silent to the ceiling


@dataclass(frozen=True)
class Silence:
    since: float  # monotonic: its last progress (an idle worker: its last heartbeat)
    allowed: float  # seconds: the bound on it now
    ceiling: float
    busy: bool

    @property
    def deadline(self) -> float:
        """When it next needs judging: the bound's end; once past it (a suspicion waiting
        for a heartbeat), soon again; the ceiling's end at the latest."""
        now = time.monotonic()
        bound, ceiling = self.since + self.allowed, self.since + self.ceiling
        if bound > now:
            return bound
        return min(now + RECHECK, ceiling) if self.busy else ceiling

    def judge(self, heartbeat: float) -> Judged | None:
        """`heartbeat`: when the worker last said anything at all."""
        now = time.monotonic()
        silent = now - self.since
        if silent >= self.ceiling:
            return Judged.HUNG
        alive = self.since < heartbeat and now - heartbeat <= FRESH
        if self.busy and silent >= self.allowed and alive:
            return Judged.SUSPECT
        return None

    def message(self) -> str:
        silent = time.monotonic() - self.since
        if not self.busy:
            return f"no heartbeat for {silent:.1f} s while idle"
        limit = "ceiling" if silent >= self.ceiling else "bound"
        allowed = self.ceiling if limit == "ceiling" else self.allowed
        return f"no progress on the batch for {silent:.1f} s ({limit} {allowed:.1f} s)"


def work_in_hand(running: Collection[Job]) -> Work:
    """What the worker holds: its members, the prompts it still prefills (as it said when
    it admitted them), and the prompts it has not admitted yet (their characters)."""
    waiting = [job for job in running if not job.started]
    prompts = tuple(job.prefill for job in waiting if job.prefill)
    unadmitted = sum(job.prompt_chars for job in waiting if not job.prefill)
    return Work(len(running), prompts, unadmitted)


def silence(link: Link, running: Collection[Job], busy_since: float, bounds: StepBounds) -> Silence:
    """The serving worker's silence now, and its bounds."""
    if not running:
        return Silence(link.heartbeat, bounds.ceiling, bounds.ceiling, busy=False)
    allowed = bounds.allowed(work_in_hand(running))
    if link.calibrating and link.progress < busy_since:  # it may be in a measuring step,
        allowed = bounds.ceiling  # building kernels: what it takes is known to no clock
    if link.shaping:  # its step is of a shape it said it has not run: kernels being built
        allowed = bounds.ceiling
    return Silence(max(link.progress, busy_since), allowed, bounds.ceiling, busy=True)

"""What the supervisor's parts share (`Context`): built once by the supervisor, its one
owner, and handed whole to the parts that use all of it, admission and the job path. Each
field has one writer: the scheduler its jobs, the quarantine its strikes, the fault log its
faults, the job path the pace, the bring-up its facts (read here through `facts`), the
supervisor its state."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from steward.config import ServeConfig
from steward.supervisor.events import Observers
from steward.supervisor.facts import Facts
from steward.supervisor.faultlog import FaultLog
from steward.supervisor.pace import Pace
from steward.supervisor.quarantine import Quarantine
from steward.supervisor.scheduler import Scheduler
from steward.supervisor.state import State


@dataclass(frozen=True, kw_only=True)
class Context:
    config: ServeConfig
    scheduler: Scheduler
    quarantine: Quarantine
    fault_log: FaultLog
    events: Observers
    pace: Pace
    wake: asyncio.Event  # set when the supervision loop has something to decide
    facts: Callable[[], Facts]  # what the bring-up knows now
    state: Callable[[], State]  # the supervisor's state now

"""The faults of one model's supervisor: numbered, counted, logged once and told to the
observers (events.py) when their action is decided. Apart from faults.py, which classifies,
so that the observers' module and the faults' need not import each other."""

from __future__ import annotations

import itertools
import logging
from collections import deque

from steward.supervisor.events import Observer
from steward.supervisor.faults import Fault

log = logging.getLogger("steward.faults")


def log_fault(fault: Fault) -> None:
    """Once per fault, when its action is known: text for people, fields for machines."""
    log.error(
        "fault %s class=%s request=%s generation=%d action=%s: %s",
        fault.id,
        fault.cls,
        fault.request_id,
        fault.generation,
        fault.action,
        fault.message,
        extra={
            "fault": fault.summary(),
            "request_id": fault.request_id,
            "traceback": fault.traceback,
        },
    )


class FaultLog:
    """Every fault, numbered (`f-N`, one by one) as it is first named, counted once it is
    recorded; the recent ones kept. A suspected hang is named when a spare takes over (its
    clients' errors may name it) and recorded only if its verdict is a fault: a worker that
    was slow, not hung, leaves its number unused and nothing counted."""

    def __init__(self, events: Observer) -> None:
        self.events = events
        self.recent: deque[Fault] = deque(maxlen=64)
        self.total = 0
        self._ids = itertools.count(1)

    @property
    def last(self) -> Fault | None:
        return self.recent[-1] if self.recent else None

    def name(self, fault: Fault) -> None:
        if not fault.id:
            fault.id = f"f-{next(self._ids)}"

    def record(self, fault: Fault) -> None:
        self.name(fault)
        if fault not in self.recent:
            self.total += 1
            self.recent.append(fault)

    def report(self, fault: Fault) -> None:
        """Its action is decided (`Fault.decide`): log it once, tell the observers."""
        self.record(fault)
        log_fault(fault)
        self.events.fault_settled(fault)

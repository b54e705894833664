"""What the supervisor tells the world: metrics, systemd notify and the like subscribe here.

The supervisor calls these as things happen, on its event loop. Observers must be quick
and must not raise; `Observers` logs and swallows what they raise anyway, so a bug in an
observer can never take the backend's supervision down with it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from steward.supervisor.faults import Fault
    from steward.supervisor.state import State
    from steward.wire.protocol import Done

log = logging.getLogger("steward.events")


class Observer:
    """Override what you need; every method is a no-op here."""

    def state_changed(self, old: State, new: State, reason: str) -> None:
        """Every transition, with a short human reason ("canary passed", "fault f-3 ...")."""

    def fault_settled(self, fault: Fault) -> None:
        """A fault whose action is decided (`fault.action`, `fault.recovery_s` when recovered)."""

    def worker_started(self, generation: int) -> None:
        """A worker process was spawned; generation > 1 is a restart."""

    def canary_ran(self, passed: bool, seconds: float) -> None:
        pass

    def request_done(self, done: Done) -> None:
        """A generation finished: its TTFT and decode speed, as the worker measured them."""

    def request_quarantined(self) -> None:
        """A request was refused as quarantined (first time or a twin)."""

    def suspicion_judged(self, verdict: str) -> None:
        """A worker suspected of a hang proved `slow`, `hung`, or `failed`."""


class Observers(Observer):
    """Fans each call out to every observer, isolating their failures."""

    def __init__(self) -> None:
        self._observers: list[Observer] = []

    def add(self, observer: Observer) -> None:
        self._observers.append(observer)

    def _each(self, name: str, *args: object) -> None:
        for observer in self._observers:
            try:
                getattr(observer, name)(*args)
            except Exception:
                log.exception("observer %s failed on %s", type(observer).__name__, name)

    def state_changed(self, old: State, new: State, reason: str) -> None:
        self._each("state_changed", old, new, reason)

    def fault_settled(self, fault: Fault) -> None:
        self._each("fault_settled", fault)

    def worker_started(self, generation: int) -> None:
        self._each("worker_started", generation)

    def canary_ran(self, passed: bool, seconds: float) -> None:
        self._each("canary_ran", passed, seconds)

    def request_done(self, done: Done) -> None:
        self._each("request_done", done)

    def request_quarantined(self) -> None:
        self._each("request_quarantined")

    def suspicion_judged(self, verdict: str) -> None:
        self._each("suspicion_judged", verdict)

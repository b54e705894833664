"""One configured model's place in the pool: its supervisor while resident, and what
outlives it (loads, the measured need, the last bring-up's time, what its first worker
measured on the device, a failure, and the quarantine: an idle model may be evicted in its
restart window, and a payload it refused must not get a fresh worker to crash after the
reload).

A slot has at most one supervisor at a time; an evicted supervisor is handed to the pool
to stop (its memory is counted as freed at once: every load waits for such stops).
"""

from __future__ import annotations

import time

from steward.config import ServeConfig
from steward.model import kind
from steward.model.resolve import is_vision
from steward.pool import budget
from steward.pool.catalog import ModelEntry
from steward.pool.snapshot import OF_SUPERVISOR, ModelSnapshot, ModelState
from steward.supervisor.quarantine import Quarantine
from steward.supervisor.supervisor import Supervisor
from steward.wire.protocol import Calibration


class Slot:
    def __init__(self, entry: ModelEntry, config: ServeConfig) -> None:
        self.entry = entry
        self.name = entry.name
        self.aliases = entry.aliases  # names.py reads a slot like an entry
        self.source = entry.source
        self.config = entry.config(config)
        self.supervisor: Supervisor | None = None
        self.loads = 0
        self.evictions = 0
        self.unloading = 0  # its evicted supervisors still stopping
        self.last_used = time.monotonic()
        self.weights = 0 if self.source is None else budget.weight_bytes(self.source)
        self.vision = (
            self.source is not None and self.source.kind == "mlx" and is_vision(self.source.path)
        )  # takes images
        self.measured = 0  # model bytes its last worker reported
        self.load_s: float | None = None
        self.context_length = kind.declared_context(self.source)  # a load measures it again
        self.failure: str | None = None
        self.hot = False  # its standby chose a hot spare
        self.calibration: Calibration | None = None  # what its first worker measured
        self.quarantine = Quarantine(self.config.restart_window)

    @property
    def copies(self) -> int:
        """A hot spare (asked for, or `auto`'s choice once it loaded) holds a second copy."""
        return 2 if self.config.standby == "hot" or self.hot else 1

    @property
    def known_context_length(self) -> int | None:
        """Its worker's context length, else what its last load measured, else what its
        files declare (None: a GGUF never imported)."""
        return (self.supervisor and self.supervisor.context_length) or self.context_length

    def need(self) -> int:
        weights = self.measured or self.weights
        return budget.need(weights, self.config.prompt_cache_bytes, self.copies)

    def state(self, stopping: bool) -> ModelState:
        if self.failure is not None:
            return ModelState.FAILED
        if stopping:
            return ModelState.STOPPING
        if self.supervisor is not None:
            return OF_SUPERVISOR[self.supervisor.status()]
        return ModelState.UNLOADING if self.unloading else ModelState.UNLOADED

    def busy(self) -> bool:
        """Requests wait for it or run on it."""
        if self.supervisor is None:
            return False
        snap = self.supervisor.snapshot()
        return bool(snap.queue_depth or snap.batch_size or snap.probation)

    def evictable(self) -> bool:
        """Idle and serving: a polite stop loses nothing."""
        if self.entry.pin or self.supervisor is None or self.busy():
            return False
        return self.supervisor.status().serving

    def adopt(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor
        self.loads += 1
        self.last_used = time.monotonic()

    def release(self) -> Supervisor:
        """Its supervisor, to be stopped; what it learnt of the model stays."""
        supervisor = self.supervisor
        assert supervisor is not None
        self.remember()
        self.supervisor = None
        self.evictions += 1
        return supervisor

    def remember(self) -> None:
        """What the resident supervisor measured: the next load's need and Retry-After."""
        if self.supervisor is None:
            return
        snap = self.supervisor.snapshot()
        self.measured = snap.model_bytes or self.measured
        self.context_length = snap.context_length or self.context_length
        self.hot = snap.standby.get("mode") == "hot"
        self.calibration = self.supervisor.bringup.calibration or self.calibration
        if snap.status.serving:
            self.load_s = snap.bring_up_s

    def snapshot(self, stopping: bool, created: float, detail: bool) -> ModelSnapshot:
        """Its record; `detail`: with its supervisor's own snapshot (health, metrics),
        else from the supervisor's cheap public fields alone (the models list)."""
        supervisor = self.supervisor
        if detail:
            self.remember()
        full = supervisor.snapshot() if detail and supervisor is not None else None
        return ModelSnapshot(
            self.name,
            self.aliases,
            self.entry.kind or "chat",
            self.state(stopping),
            self.entry.pin,
            self.entry.idle_ttl,
            self.loads,
            self.evictions,
            self.need(),
            bool(self.measured),
            None if supervisor is None else time.monotonic() - self.last_used,
            self.load_s,
            self.known_context_length,
            int(supervisor.started_at if supervisor is not None else created),
            supervisor.retry_after() if supervisor else max(1, round(self.load_s or 10.0)),
            self.failure,
            full,
        )

"""One configured model's place in the pool: its supervisor while resident, and what
outlives it (loads, the measured need, the last bring-up's time, what its first worker
measured on the device, a failure, and the quarantine: an idle model may be evicted in its
restart window, and a payload it refused must not get a fresh worker to crash after the
reload).

A slot has at most one supervisor at a time; an evicted supervisor is handed to the pool
to stop (its memory is counted as freed at once: every load waits for such stops). Only
the slot writes its fields: the pool calls its methods. What its workers measured is
learnt once per bring-up, when its supervisor starts serving (`Learn`), never on a read:
`/health`, `/metrics` and the budget's plans read what the slot already holds.
"""

from __future__ import annotations

import time

from steward.config import ServeConfig
from steward.model import kind
from steward.model.resolve import is_vision
from steward.pool import budget
from steward.pool.catalog import ModelEntry
from steward.pool.groups import here
from steward.pool.snapshot import OF_SUPERVISOR, ModelSnapshot, ModelState
from steward.supervisor.events import Observer
from steward.supervisor.facts import GUESS
from steward.supervisor.quarantine import Quarantine
from steward.supervisor.state import State
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
        self.vision = (  # takes images: the front refuses them for any other model
            self.source is not None and self.source.kind == "mlx" and is_vision(self.source.path)
        )
        self.failure: str | None = None
        # what its workers measured, learnt as each bring-up ends (`learn`)
        self.measured = 0  # model bytes
        self.device_bytes = 0  # the device's memory, or its recommended working set
        self.load_s: float | None = None  # the last bring-up that loaded the model
        self.context_length = kind.declared_context(self.source)  # its files' until then
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
        """What its workers take of this machine's memory: for a group, one rank's part
        (rank 0's measure, else the files' share) for each of its ranks here."""
        weights = self.measured or -(-self.weights // self.config.ranks)
        one = budget.need(weights, self.config.prompt_cache_bytes, self.copies)
        return one * here(self.config)

    def retry_after(self) -> int:
        """What a 503 for it says now: its supervisor's estimate while resident, else what
        a load takes (its last bring-up, else the supervisor's guess for one)."""
        if self.supervisor is not None:
            return self.supervisor.retry_after()
        return max(1, round(self.load_s or GUESS))

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

    def in_use(self) -> bool:
        """Resident and busy, or not serving (loading, recovering): its idle time starts
        when it serves and nothing waits for it."""
        supervisor = self.supervisor
        return supervisor is not None and (self.busy() or not supervisor.status().serving)

    def evictable(self) -> bool:
        """Idle and serving: a polite stop loses nothing."""
        if self.entry.pin or self.supervisor is None or self.busy():
            return False
        return self.supervisor.status().serving

    # -- what the pool does to it ---------------------------------------------------------

    def touch(self, now: float | None = None) -> None:
        """Used now: the last to be evicted, its idle time starting again."""
        self.last_used = time.monotonic() if now is None else now

    def adopt(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor
        self.loads += 1
        self.touch()

    def release(self) -> Supervisor:
        """Its supervisor, to be stopped (`unloaded` once it has); what it learnt of the
        model stays."""
        supervisor = self.supervisor
        assert supervisor is not None
        self.supervisor = None
        self.evictions += 1
        self.unloading += 1
        return supervisor

    def unloaded(self) -> None:
        """A supervisor `release` handed out has stopped: its memory is free."""
        self.unloading -= 1

    def fail(self, supervisor: Supervisor, why: str) -> None:
        """`supervisor` gave up: the model is failed for good (503s; the others serve)."""
        self.failure = why
        if self.supervisor is supervisor:
            self.supervisor = None

    def learn(self, supervisor: Supervisor) -> None:
        """A bring-up of `supervisor` has ended and it serves: what its worker measured is
        the next load's need, calibration and Retry-After (a fact it did not report keeps
        the last one's)."""
        snap = supervisor.snapshot()
        self.measured = snap.model_bytes or self.measured
        self.device_bytes = snap.device_bytes or self.device_bytes
        self.context_length = snap.context_length or self.context_length
        self.load_s = supervisor.loading_s
        self.hot = supervisor.hot
        self.calibration = supervisor.calibration or self.calibration

    # -- what it publishes ----------------------------------------------------------------

    def snapshot(self, stopping: bool, created: float, detail: bool) -> ModelSnapshot:
        """Its record; `detail`: with its supervisor's own snapshot (health, metrics),
        else from the supervisor's cheap public fields alone (the models list)."""
        supervisor = self.supervisor
        return ModelSnapshot(
            name=self.name,
            aliases=self.aliases,
            kind=self.entry.kind or "chat",
            state=self.state(stopping),
            pinned=self.entry.pin,
            idle_ttl=self.entry.idle_ttl,
            loads=self.loads,
            evictions=self.evictions,
            need_bytes=self.need(),
            measured=bool(self.measured),
            idle_s=None if supervisor is None else time.monotonic() - self.last_used,
            load_s=self.load_s,
            context_length=self.known_context_length,
            created=int(supervisor.started_at if supervisor is not None else created),
            retry_after=self.retry_after(),
            failure=self.failure,
            detail=supervisor.snapshot() if detail and supervisor is not None else None,
        )


class Learn(Observer):
    """A supervisor's bring-ups ending (the first worker's, a replacement's, a spare's
    promotion: each ends in a move to serving): its slot learns what was measured."""

    def __init__(self, slot: Slot, supervisor: Supervisor) -> None:
        self.slot, self.supervisor = slot, supervisor

    def state_changed(self, old: State, new: State, reason: str) -> None:
        if new.serving and not old.serving:
            self.slot.learn(self.supervisor)

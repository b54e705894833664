"""The pool: one supervisor per configured model, loaded on demand under a memory budget.

OTP's one-for-one: each model has its own supervisor (worker, canary, standby, queue,
quarantine, restart budget), and a fault in one never reaches another; the pool only
routes, loads, evicts and escalates. Handlers ask `find` for the model a request names and
`supervisor` for its supervisor, which loads an unloaded model there and then: the
supervisor exists at once (state `starting`) and the request waits in its queue, so two
requests for one unloaded model load it once. A load that does not fit the budget first
evicts the least recently used idle, unpinned models (a polite stop); one that cannot fit
even then is a 507. Every load waits for the stops under way, so the budget is never
overrun by a model whose memory is still held.

A model whose supervisor gives up (its restart budget spent: 75; a model that cannot load:
78) is `failed`: by `--on-model-failed serve` (the default with several models) it gets
503s and the others serve on; the process exits 75 once every model has failed. By
`exit` (the default with one model: today's behaviour) the process exits with its code.
A bug in steward's own loop (70) always exits.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any

from steward.config import ServeConfig
from steward.errors import ApiError
from steward.pool import budget, names
from steward.pool.catalog import CatalogError, ModelEntry
from steward.pool.slot import Learn, Slot
from steward.pool.snapshot import ModelState, PoolSnapshot, overall
from steward.supervisor.bringup import Spawn
from steward.supervisor.events import Observer, Observers
from steward.supervisor.exits import EX_CONFIG, EX_SOFTWARE, EX_TEMPFAIL
from steward.supervisor.link import WorkerLink
from steward.supervisor.state import State
from steward.supervisor.supervisor import Supervisor
from steward.wire.faultspec import FaultSpec

log = logging.getLogger("steward.pool")

TICK = 0.5  # seconds between looks at idle models
WHY_FAILED = {EX_TEMPFAIL: "its restart budget is spent", EX_CONFIG: "it cannot be loaded"}

Observe = Callable[[str], list[Observer]]  # a model's name -> what watches its supervisor


class Pool:
    def __init__(
        self,
        config: ServeConfig,
        entries: list[ModelEntry],
        faults: list[FaultSpec],
        spawn: Spawn = WorkerLink.spawn,  # tests of the pool's decisions pass fake workers
    ) -> None:
        self.config = config
        self.spawn = spawn
        self.slots = [Slot(entry, config) for entry in entries]
        self.single = len(self.slots) == 1
        self.faults = faults
        self.observe: Observe = lambda name: []  # the server's: metrics
        self.budget = config.memory_budget  # None: the device's, once a worker said it
        self.on_failed = config.on_model_failed
        if self.on_failed == "auto":
            self.on_failed = "exit" if self.single else "serve"
        self.events = Observers()  # the server's own state: systemd
        self.exit_code: int | None = None  # set once, with `exited`: the process's code
        self.exited = asyncio.Event()
        self.started_at = time.time()
        self.stopping = False
        self._state = State.STARTING
        self._up = False  # the models loaded at start have come up
        self._starters: list[Slot] = []
        self._unloads: set[asyncio.Task[None]] = set()  # evicted supervisors stopping
        self._closing: set[asyncio.Task[None]] = set()  # failed supervisors closing
        self._waiting: set[asyncio.Task[None]] = set()  # loads waiting for memory, the tender

    @classmethod
    def around(cls, config: ServeConfig, supervisor: Supervisor) -> Pool:
        """A pool of the one supervisor given, already running (an app over a stand-in:
        its model has no source, so no images unless a test says its slot takes them)."""
        model_id, aliases = supervisor.source.model_id, tuple(config.served_model_name)
        entry = ModelEntry(model_id, None, aliases, pin=True)
        pool = cls(config, [entry], [])
        pool.slots[0].adopt(supervisor)
        return pool

    def check(self) -> None:
        """The models loaded at start must fit the budget together: exit 78 otherwise."""
        if not self.budgeted():
            return
        starters = [s for i, s in enumerate(self.slots) if i == 0 or s.entry.pin]
        need, limit = sum(s.need() for s in starters), self.memory_budget()
        if need > limit:
            listed = ", ".join(f"{s.name} {budget.mib(s.need())}" for s in starters)
            raise CatalogError(
                f"the models loaded at start (the first and the pinned: {listed}) need "
                f"{budget.mib(need)}, over the {budget.mib(limit)} memory budget"
            )

    def budgeted(self) -> bool:
        """One model with no --memory-budget loads whatever it takes, as it always did."""
        return not self.single or self.budget is not None

    # -- routing ------------------------------------------------------------------------

    def find(self, name: str | None) -> Slot:
        """The model `name` names, or 404 `model_not_found` (nothing loads)."""
        return names.find(name, self.slots)

    def supervisor(self, slot: Slot) -> Supervisor:
        """The model's supervisor, loading it now if it is not resident."""
        slot.touch()
        if slot.failure is not None:
            raise ApiError(
                "backend_unavailable",
                f"The model {slot.name!r} has failed ({slot.failure}); "
                "the other models are served.",
            )
        if slot.supervisor is None:
            if self.stopping:
                raise ApiError("server_shutdown", "The server is shutting down.", 1)
            self._load(slot, self._room_for(slot))
        assert slot.supervisor is not None
        return slot.supervisor

    def _room_for(self, slot: Slot) -> list[Slot]:
        """The models to evict so that `slot` fits, or the error that says why it cannot."""
        if not self.budgeted():
            return []
        holders = self._resident()
        by_name = {s.name: s for s in holders}
        need, limit = slot.need(), self.memory_budget()
        plan = budget.room(
            need,
            limit,
            [budget.Holder(s.name, s.need(), s.evictable(), s.last_used) for s in holders],
        )
        if plan is not None:
            return [by_name[name] for name in plan]
        resident = ", ".join(f"{s.name} {budget.mib(s.need())}" for s in holders) or "none"
        pinned = sum(s.need() for s in holders if s.entry.pin)
        words = (
            f"The model {slot.name!r} needs {budget.mib(need)} of the "
            f"{budget.mib(limit)} memory budget; resident: {resident}"
        )
        if need > limit - pinned:
            raise ApiError("insufficient_storage", words + ", pinned or too big to evict.")
        raise ApiError(
            "backend_unavailable",
            words + "; they are busy or loading. Retry once they are idle.",
            slot.retry_after(),
        )

    def memory_budget(self) -> int:
        """`--memory-budget`, else the device's memory with headroom (the machine's until a
        worker has said what the device has; then the device's, even with none resident)."""
        if self.budget is not None:
            return self.budget
        return budget.default_budget(max(s.device_bytes for s in self.slots))

    # -- loading and unloading ----------------------------------------------------------

    def start(self) -> None:
        """Load the default model and the pinned ones; look after idle models from now on."""
        self._starters = [s for i, s in enumerate(self.slots) if i == 0 or s.entry.pin]
        for slot in self._starters:
            self.supervisor(slot)
        self._spawn(self._waiting, self._tend())

    def _load(self, slot: Slot, victims: list[Slot]) -> None:
        for victim in victims:
            self._unload(victim, f"to make room for {slot.name}")
        assert slot.source is not None
        specs = [f for f in self.faults if f.model in (None, slot.name)]
        supervisor = Supervisor(
            slot.config,
            slot.source,
            specs,
            self.spawn,
            bring_up_s=slot.load_s,
            quarantine=slot.quarantine,
            calibration=slot.calibration,
            unbudgeted=not self.budgeted(),
        )
        supervisor.events.add(Learn(slot, supervisor))  # what each bring-up measured
        supervisor.events.add(self._Watch(self, slot.name))
        for observer in self.observe(slot.name):
            supervisor.events.add(observer)
        supervisor.exit_code.add_done_callback(partial(self._ended, slot, supervisor))
        slot.adopt(supervisor)
        log.info(
            "loading model %s (load %d, needs %s of %s)",
            slot.name,
            slot.loads,
            budget.mib(slot.need()),
            budget.mib(self.memory_budget()),
        )
        self._spawn(self._waiting, self._bring_up(supervisor))
        self._changed("", f"loading {slot.name}")

    async def _bring_up(self, supervisor: Supervisor) -> None:
        """Start the supervisor once the memory of every model unloading is free."""
        while self._unloads or self._closing:  # a failed model's workers may still retire
            await asyncio.wait(self._unloads | self._closing)
        if not self.stopping:
            supervisor.start()

    def _unload(self, slot: Slot, why: str) -> None:
        supervisor = slot.release()
        log.info("unloading model %s: %s", slot.name, why)
        self._spawn(self._unloads, self._stop(slot, supervisor))

    async def _stop(self, slot: Slot, supervisor: Supervisor) -> None:
        """A polite stop: nothing waits for an idle model; its workers are asked to exit."""
        try:
            try:
                await supervisor.stop(0.0, asyncio.Event())
            finally:
                await supervisor.close()  # whatever stop raised: no worker stays behind
        finally:
            slot.unloaded()
            self._changed("", f"unloaded {slot.name}")

    async def _tend(self) -> None:
        """Unload models nobody used for their `idle_ttl`; a busy model counts as used, and
        so does one still loading (its idle time starts when it serves)."""
        while True:
            await asyncio.sleep(TICK)
            now = time.monotonic()
            for slot in self._resident():
                if slot.in_use():
                    slot.touch(now)
                ttl = slot.entry.idle_ttl
                if ttl is not None and now - slot.last_used >= ttl and slot.evictable():
                    self._unload(slot, f"idle for {ttl:g} s (idle_ttl)")

    def _ended(self, slot: Slot, supervisor: Supervisor, done: asyncio.Future[int]) -> None:
        """A supervisor gave up: escalate, or mark its model failed and serve the others."""
        code = done.result()
        if self.exit_code is not None:
            return
        if code == EX_SOFTWARE or self.on_failed == "exit":
            self._exit(code)
            return
        slot.fail(supervisor, f"{WHY_FAILED.get(code, 'its supervisor exited')}: exit {code}")
        log.critical("model %s failed (%s); the other models are served", slot.name, code)
        self._spawn(self._closing, supervisor.close())
        self._changed("", f"model {slot.name} failed")
        if all(s.failure is not None for s in self.slots):
            log.critical("every model has failed")
            self._exit(EX_TEMPFAIL)

    def _exit(self, code: int) -> None:
        self.exit_code = code
        self.exited.set()

    @staticmethod
    def _spawn(tasks: set[asyncio.Task[None]], work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def _resident(self) -> list[Slot]:
        return [s for s in self.slots if s.supervisor is not None]

    # -- the server's state -------------------------------------------------------------

    class _Watch(Observer):
        """A model's transitions, for the server's own state."""

        def __init__(self, pool: Pool, model: str) -> None:
            self.pool, self.model = pool, model

        def state_changed(self, old: State, new: State, reason: str) -> None:
            self.pool._changed(self.model, reason)

    def _changed(self, model: str, reason: str) -> None:
        """Tell the server's observers when its own state changed (one model: its state)."""
        new = self.status()
        if new is not self._state:
            old, self._state = self._state, new
            self.events.state_changed(old, new, reason if self.single else f"{model}: {reason}")

    def alive(self) -> bool:
        """Every resident supervision loop still runs (what the systemd watchdog vouches)."""
        return all(s.supervisor.alive() for s in self._resident())  # type: ignore[union-attr]

    def status(self) -> State:
        only = self.slots[0].supervisor
        if self.single and only is not None:
            return only.status()
        if not self._up:
            self._up = all(s.state(False) is not ModelState.LOADING for s in self._starters)
        states = [s.state(self.stopping) for s in self.slots]
        return overall(states, not self._up, self.exit_code is not None, self.stopping)

    def snapshot(self, detail: bool = True) -> PoolSnapshot:
        models = tuple(s.snapshot(self.stopping, self.started_at, detail) for s in self.slots)
        loading = [m.retry_after for m in models if m.state is ModelState.LOADING]
        return PoolSnapshot(
            status=self.status(),
            models=models,
            single=self.single,
            budget_bytes=self.memory_budget() if detail else 0,
            resident_bytes=sum(m.need_bytes for m in models if m.detail is not None),
            retry_after=max(loading, default=1),
            uptime_s=time.time() - self.started_at,
        )

    # -- stopping -----------------------------------------------------------------------

    async def stop(self, drain_timeout: float, cut: asyncio.Event) -> None:
        """Drain every model at once; then nothing more loads."""
        self.stopping = True
        resident = [s.supervisor for s in self._resident()]
        await asyncio.gather(*(sup.stop(drain_timeout, cut) for sup in resident if sup))

    async def close(self) -> None:
        """No worker of any model outlives the front."""
        self.stopping = True
        for task in list(self._waiting):
            task.cancel()
        for slot in self._resident():
            await slot.supervisor.close()  # type: ignore[union-attr]
        while self._unloads or self._closing:
            await asyncio.wait(self._unloads | self._closing)

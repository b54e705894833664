"""Bringing workers up: the first one, a replacement, or the spare promoted; the canary.

A worker serves only once its model is loaded and its canary has answered the golden
tokens, recorded when the first worker came up. Replacing one is bounded by the restart
intensity (OTP-style): past it, or when a replacement fails to come up twice, the process
exits 75. The worker replaced is stopped politely when it still answers (Shutdown, then
SIGKILL after `POLITE` s) and killed at once when it is dead or hung; a hot spare takes over
first, since it holds its own copy of the model, and the old worker stops meanwhile. A
worker suspected of a hang (failover.py) is not stopped but kept aside for its verdict; it
holds a copy of the model meanwhile, which `room` counts.

Every later worker of the model (a replacement, a spare) is given what the first one
measured on the device (`Calibration`: the batch width, the prefill speed and chunk) and
warms only the shapes. Each bring-up's phases are logged and kept for `/health`.

What it learns (the model's bounds, when a bring-up began and how long the last took) it
publishes whole as `Facts` (facts.py), which it alone writes; a recovery that may need a
bring-up says so (`began`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from steward.config import ServeConfig
from steward.model.resolve import ModelSource
from steward.supervisor import canary
from steward.supervisor.bounds import StepBounds
from steward.supervisor.events import Observers
from steward.supervisor.exits import EX_CONFIG, EX_TEMPFAIL, Exit
from steward.supervisor.facts import Facts, Model
from steward.supervisor.faults import DEVICE_FAULTS, Fault, FaultClass, Outcome, classify
from steward.supervisor.intensity import RestartIntensity
from steward.supervisor.line import FaultError, Link
from steward.supervisor.phases import Phases
from steward.supervisor.speeds import Speeds
from steward.supervisor.standby import Standby
from steward.wire.faultspec import FaultSpec
from steward.wire.protocol import Calibration, Load, LoadFailed, Ready, Room
from steward.wire.settings import WorkerSettings

log = logging.getLogger("steward.supervisor")

Spawn = Callable[[WorkerSettings], Awaitable[Link]]
POLITE = 2.0  # seconds a worker being replaced has to exit on its own
HUNG = frozenset({FaultClass.WORKER_CRASH, FaultClass.STALL})  # nothing to ask politely


@dataclass
class Aside:
    """A worker suspected of a hang, kept (not killed) until its verdict (failover.py)."""

    link: Link
    fault: Fault  # named; recorded only if the verdict is a fault
    charge: float  # the restart its failover cost (withdrawn if it was slow)
    strike: int  # the quarantine's strike of its suspects (likewise)
    since: float  # its last progress (monotonic): its ceiling counts from here


class BringUp:
    def __init__(
        self,
        config: ServeConfig,
        source: ModelSource,
        spawn: Spawn,
        *,
        specs: list[FaultSpec],  # what --inject-fault asks of its workers
        bounds: StepBounds,  # each worker's step clock feeds them; the canary's ceiling
        speeds: Speeds,  # the canary's decode speed
        events: Observers,
        report: Callable[[Fault], None],  # a bring-up fault, decided: log and count it
        calibration: Calibration | None = None,  # what an earlier load of the model measured
        unbudgeted: bool = True,  # no pool budget counts this model's copies of the model
    ) -> None:
        self.config = config
        self.source = source
        self.specs = specs
        self.spawn = spawn
        self.bounds = bounds
        self.speeds = speeds
        self.events = events
        self.report = report
        self.intensity = RestartIntensity(config.max_restarts, config.restart_window)
        self.standby = Standby(
            config.standby, self._spawn, self.check, config.load_timeout, unbudgeted
        )
        self.facts = Facts(since=time.monotonic())  # what it knows: its own to write
        self.link: Link | None = None  # the serving worker's line
        self.asides: list[Aside] = []  # suspects awaiting their verdict
        self.golden: tuple[float, ...] | None = None  # the canary's tokens, or its vector
        self.calibration = calibration  # what the model's first worker measured
        self.generation = 0  # workers started so far, spares included
        self._retiring: set[asyncio.Task[None]] = set()

    def measured(self, seconds: float, loaded: bool = True) -> None:
        """A bring-up took `seconds` (`loaded`: the model's load included, not a swap)."""
        facts = replace(self.facts, seconds=seconds)
        self.facts = replace(facts, loading_s=seconds, known=True) if loaded else facts

    def began(self) -> None:
        """A bring-up, or a recovery that may need one, begins now: Retry-After and the
        recovery's expected end count from here."""
        self.facts = replace(self.facts, since=time.monotonic())

    async def first(self) -> None:
        """The first worker, or its replacement if it cannot come up."""
        if not await self._start_worker():
            await self.replace(None)

    async def replace(self, fault: Fault | None) -> Outcome:
        """Put another worker in place of this one, the spare if there is one, within the
        restart intensity (a promotion counts as a restart)."""
        old, self.link = self.link, None
        self.began()
        if old is not None and self.standby.holding:  # the spare holds its own copy
            self.retire_later(old, fault)
        elif old is not None:
            await self.retire(old, fault)  # its memory is wanted for the next copy
        for _attempt in range(2):
            if not self.intensity.allow():
                raise self._spent()
            if await self._promote(fault):
                return Outcome.PROMOTED
            if await self._start_worker():
                return Outcome.REPLACED
        raise Exit(EX_TEMPFAIL, "a replacement worker failed to come up twice")

    async def fail_over(self, fault: Fault) -> float:
        """The hot spare, ready, serves in place of the worker suspected of a hang, which
        the caller keeps aside; the restart this costs (to withdraw if it was slow)."""
        charge = self.intensity.charge()
        if charge is None:
            raise self._spent()
        self.link = None
        self.began()
        promoted = await self._promote(fault)
        assert promoted, "a ready hot spare's promotion is a swap"
        return charge

    def _spent(self) -> Exit:
        limit, window = self.config.max_restarts, self.config.restart_window
        return Exit(EX_TEMPFAIL, f"more than {limit} restarts in {window:.0f} s")

    def room(self) -> bool:
        """Another copy of the model fits beside those held now: the serving worker's, the
        suspects' aside, a spare's that holds the model (two where the standby's memory
        rule allows two, else one)."""
        held = 1 + len(self.asides) + self.standby.holding
        return held < (2 if self.standby.two_fit else 1)

    def refill(self) -> None:
        self.standby.refill(self.room())

    def retire_later(self, link: Link, fault: Fault | None) -> None:
        """Retire a worker while the loop goes on (its memory is not wanted now)."""
        task = asyncio.ensure_future(self.retire(link, fault))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def retire(self, link: Link, fault: Fault | None) -> None:
        """Stop a worker that is being replaced (`fault`: why, None for a worker that
        did nothing wrong): politely if it still answers."""
        if (fault is not None and fault.cls in HUNG) or not link.alive:
            await link.kill()
        else:
            await link.stop(POLITE)

    async def close(self) -> None:
        """No worker may outlive the front: the serving one, the spare, those aside, those
        retiring."""
        await self.standby.close()
        for aside in self.asides:
            await aside.link.kill()
        for task in list(self._retiring):
            await task
        if self.link is not None:
            await self.link.kill()

    async def check(self, link: Link | None = None) -> Fault | None:
        """Run the canary on a worker (the serving one by default): None if it passed."""
        link = link or self.link
        assert link is not None
        started = time.monotonic()
        dimensions, ceiling = self.facts.model.dimensions, self.bounds.ceiling
        try:
            if dimensions:
                answer, done = await canary.embed(link, ceiling, dimensions)
            else:
                answer, done = await canary.run(link, ceiling)
        except FaultError as err:
            self.events.canary_ran(False, time.monotonic() - started)
            return err.fault
        seconds = time.monotonic() - started
        self.events.canary_ran(canary.same(answer, self.golden or answer), seconds)
        self.speeds.canary(done)
        shown = list(answer[: canary.MAX_TOKENS])  # a vector's first values
        if self.golden is None:
            self.golden = answer
            log.info("canary golden %s, decode %.1f tok/s", shown, done.decode_tps)
        elif not canary.same(answer, self.golden):
            golden = list(self.golden[: canary.MAX_TOKENS])
            return canary.mismatch(link, f"canary {shown} differs from {golden}")
        return None

    async def _spawn(self, warm: bool) -> Link:
        link = await self.spawn(self._settings(warm))
        link.clocks = self.bounds.measured
        link.calibrated = self._calibrated
        return link

    def _calibrated(self, calibration: Calibration) -> None:
        """The serving worker measured the model's calibration between requests: later
        workers are given it, and the batch may be as wide as it says."""
        self.calibration = calibration
        model = replace(self.facts.model, max_batch=calibration.max_batch)
        self.facts = replace(self.facts, model=model)
        log.info(
            "calibrated between requests: batch width %d, prefill %.0f tokens/s",
            calibration.max_batch,
            calibration.prefill_tps,
        )

    def _settings(self, warm: bool) -> WorkerSettings:
        self.generation += 1
        return WorkerSettings(
            source=self.source,
            generation=self.generation,
            specs=self.specs,
            parent_pid=os.getpid(),
            memory_limit=self.config.worker_memory_limit,
            max_batch=self.config.max_batch,
            prompt_cache_bytes=self.config.prompt_cache_bytes,
            speculate=self.config.speculate,
            draft_model=self.config.draft_model,
            warm=warm,
            kind=self.config.model_kind,
            max_embedding_tokens=self.config.max_embedding_tokens,
            prompt_cache_dir=self.config.prompt_cache_dir,
            prompt_cache_disk_bytes=self.config.prompt_cache_disk_bytes,
            calibration=self.calibration,
            ranks=self.config.ranks,
            hostfile=self.config.rank_hosts,
            distributed_backend=self.config.distributed_backend,
            rank_join_timeout=self.config.rank_join_timeout,
            parallel=self.config.parallel,
        )

    async def _start_worker(self) -> bool:
        """Spawn, load, canary. False (fault recorded) when this worker cannot serve."""
        self.began()
        phases = Phases()
        self.link = link = await self._spawn(warm=False)
        phases.lap("spawn")
        log.info("worker %d started (pid %d)", link.generation, link.pid)
        self.events.worker_started(link.generation)
        return await self._bring_up(link, phases, load=True, check=True)

    async def _promote(self, fault: Fault | None) -> bool:
        """The spare serves: a warm one loads the model first; a hot one runs the canary
        again when the fault may be the device's, which it shares."""
        spare = await self.standby.take()
        if spare is None:
            return False
        link, warm = spare
        self.link = link
        log.info("promoting the %s spare (worker %d)", "warm" if warm else "hot", link.generation)
        self.events.worker_started(link.generation)
        phases = Phases(None if warm else self.standby.phases)
        if warm:
            link.send(Load())
        device = fault is not None and fault.cls in DEVICE_FAULTS
        return await self._bring_up(link, phases, load=warm, check=warm or device)

    async def _bring_up(self, link: Link, phases: Phases, load: bool, check: bool) -> bool:
        """Its model loaded, its canary passed: False (fault recorded) if it cannot serve."""
        try:
            if load:
                msg = await link.loaded(self.config.load_timeout)
                if isinstance(msg, LoadFailed):
                    if msg.config:
                        raise Exit(EX_CONFIG, f"model unusable: {msg.message}")
                    fault = link.fault(classify(msg.message), msg.message, msg.traceback)
                    raise FaultError(fault)
                assert isinstance(msg, Ready)
                phases.ready(msg.phases)
                self._adopt(msg)
            if check:
                if (failure := await self.check(link)) is not None:
                    raise FaultError(failure)
                phases.lap("canary")
        except FaultError as err:
            err.fault.decide(Outcome.DISCARDED, "worker discarded (failed to come up)")
            self.report(err.fault)
            await link.kill()
            self.link = None
            return False
        seconds = time.monotonic() - self.facts.since
        self.measured(seconds, loaded=load)
        self.facts = replace(self.facts, phases=phases.seconds)
        log.info("worker %d ready in %.2f s (%s)", link.generation, seconds, phases.text())
        return True

    def _adopt(self, msg: Ready) -> None:
        """What the worker said of the model: its bounds, and whether two copies fit."""
        device = msg.working_set_bytes or msg.memory_bytes
        model = Model(
            context_length=msg.context_length,
            max_token_chars=msg.max_token_chars,
            max_batch=msg.max_batch,
            thinking=msg.thinking,
            dimensions=msg.dimensions,
            model_bytes=msg.model_bytes,
            device_bytes=device,
            gpu=msg.device == "gpu",
        )
        self.facts = replace(self.facts, model=model)
        hosts = self.config.rank_hosts
        self.bounds.device(model.gpu, len(hosts.hosts) if hosts else self.config.ranks)
        if self.golden is None:  # the first worker: the standby is chosen once, and what
            # it measured serves every later one; a group says where a copy is tightest
            room = msg.room or Room(msg.model_bytes, device, "")
            self.standby.choose(room.copy_bytes, room.memory_bytes, room.where)
            self.calibration = msg.calibration

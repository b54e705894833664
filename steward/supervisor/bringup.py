"""Bringing workers up: a new one, or the spare promoted; the canary and its golden tokens.

A worker serves only once its model is loaded and its canary has answered the golden
tokens, recorded when the first worker came up. Replacing one is bounded by the restart
intensity (OTP-style): past it, or when a replacement fails to come up twice, the process
exits 75. Part of `Supervisor` (supervisor.py), whose state it reads and sets.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable

from steward.supervisor import canary
from steward.supervisor.exits import EX_CONFIG, EX_TEMPFAIL, Exit
from steward.supervisor.faults import DEVICE_FAULTS, Fault, FaultClass, Outcome, classify
from steward.supervisor.link import FaultError, WorkerLink
from steward.wire.protocol import Load, LoadFailed, Ready
from steward.wire.settings import WorkerSettings

log = logging.getLogger("steward.supervisor")

Spawn = Callable[[WorkerSettings], Awaitable[WorkerLink]]


class BringUp:
    async def _replace(self, fault: Fault | None = None) -> Outcome:
        """Kill the worker and put another in its place, the spare if there is one, within
        the restart intensity (a promotion counts as a restart)."""
        for _attempt in range(2):
            await self._kill_worker()
            if not self.intensity.allow():
                raise Exit(
                    EX_TEMPFAIL,
                    f"more than {self.config.max_restarts} restarts in "
                    f"{self.config.restart_window:.0f} s",
                )
            if await self._promote(fault):
                return Outcome.PROMOTED
            if await self._start_worker():
                return Outcome.REPLACED
        raise Exit(EX_TEMPFAIL, "a replacement worker failed to come up twice")

    def _settings(self, warm: bool) -> WorkerSettings:
        self.generation += 1
        return WorkerSettings(
            self.source,
            self.generation,
            self.fault_specs,
            os.getpid(),
            self.config.worker_memory_limit,
            self.config.max_batch,
            self.config.prompt_cache_bytes,
            warm,
        )

    async def _spawn_spare(self, warm: bool) -> WorkerLink:
        return await self.spawn(self._settings(warm))

    async def _start_worker(self) -> bool:
        """Spawn, load, canary. False (fault recorded) when this worker cannot serve."""
        self._recovery_since = time.monotonic()
        self.link = link = await self.spawn(self._settings(warm=False))
        log.info("worker %d started (pid %d)", link.generation, link.pid)
        self.events.worker_started(link.generation)
        return await self._bring_up(link, load=True, canary=True)

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
        if warm:
            link.send(Load())
        device = fault is not None and fault.cls in DEVICE_FAULTS
        return await self._bring_up(link, load=warm, canary=warm or device)

    async def _bring_up(self, link: WorkerLink, load: bool, canary: bool) -> bool:
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
                self._adopt(msg)
            if canary and (failure := await self._canary(link)) is not None:
                raise FaultError(failure)
        except FaultError as err:
            err.fault.settle(Outcome.DISCARDED, "worker discarded (failed to come up)")
            self._record(err.fault)
            self._settle(err.fault)
            await self._kill_worker()
            return False
        self.bring_up_seconds = time.monotonic() - self._recovery_since
        log.info("worker %d ready in %.2f s", link.generation, self.bring_up_seconds)
        self.standby.refill()
        return True

    def _adopt(self, msg: Ready) -> None:
        """What the worker said of the model: its bounds, and whether two copies fit."""
        self.context_length = msg.context_length
        self.max_token_chars = msg.max_token_chars
        self.batch.worker_max = msg.max_batch
        if self.standby.mode == "hot" and 2 * msg.model_bytes > 0.9 * msg.memory_bytes:
            log.warning(
                "--standby hot needs room for a second copy of the model (%.1f GiB) beside "
                "this one, in %.1f GiB of device memory: keeping a warm spare instead",
                msg.model_bytes / 2**30,
                msg.memory_bytes / 2**30,
            )
            self.standby.demote()

    async def _canary(self, link: WorkerLink | None = None) -> Fault | None:
        """Run the canary on a worker (the serving one by default), bounded by the stall
        timeout: None if it passed, else the fault."""
        link = link or self.link
        assert link is not None
        started = time.monotonic()
        try:
            tokens, tps = await canary.run(link, self.config.stall_timeout)
        except FaultError as err:
            self.events.canary_ran(False, time.monotonic() - started)
            return err.fault
        self.events.canary_ran(tokens == (self.golden or tokens), time.monotonic() - started)
        if self.golden is None:
            self.golden, self.baseline_tps = tokens, tps
            log.info("canary golden tokens %s, decode %.1f tok/s", tokens, tps)
        elif tokens != self.golden:
            return link.fault(
                FaultClass.CANARY_MISMATCH,
                f"canary tokens {list(tokens)} differ from {list(self.golden)}",
            )
        return None

    async def _kill_worker(self) -> None:
        if self.link is not None:
            await self.link.kill()

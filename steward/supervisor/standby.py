"""The spare worker (`--standby`): recovery faster than any restart.

`warm`: a process that has imported the runtime and initialised the device, with no model;
promoting it costs the model load and the canary. `hot`: the spare has loaded the model and
passed the canary; promoting it is a swap. `auto` picks `hot` where two copies of the model
take at most `HOT_SHARE` of the device's memory (its recommended working set where it has
one, as Metal does, else its total), so KV caches keep room; else `warm`: on CUDA a warm
spare recovers no faster than a restart (the load dominates), on a small Mac a hot one
would not fit. The spare starts only once a worker serves (it never competes with a load
that clients wait for) and again behind each promotion. Its own faults are logged, never
shown to clients; after three in a row it is given up until the next promotion. It dies
with the front like any worker (the same lifeline).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from steward.supervisor.faults import Fault
from steward.supervisor.link import FaultError, WorkerLink
from steward.wire.protocol import LoadFailed, Ready, Warm

log = logging.getLogger("steward.standby")

MODES = ("auto", "none", "warm", "hot")
HOT_SHARE = 0.5  # `auto`: two copies within this share of the device's memory
HOT_FITS = 0.9  # `hot` asked for: two copies must fit this share at least
GIVE_UP = 3  # failed spares in a row
BACKOFF = 5.0  # seconds before another try, times the failures so far

Spawn = Callable[[bool], Awaitable[WorkerLink]]  # warm -> a new spare's line
Check = Callable[[WorkerLink], Awaitable[Fault | None]]  # the canary against golden tokens


class Standby:
    def __init__(self, mode: str, spawn: Spawn, check: Check, load_timeout: float) -> None:
        self.asked = mode
        self.mode = "none" if mode == "none" else "warm"  # until the model's size is known
        self.why = "not chosen yet: the model's size is known once it loads"
        self.link: WorkerLink | None = None
        self.warm = False  # the spare in `link` has no model yet
        self.state: str | None = None  # starting, ready, failed; None without a spare
        self._spawn = spawn
        self._check = check
        self._load_timeout = load_timeout
        self._task: asyncio.Task[None] | None = None
        self._settled = asyncio.Event()  # the spare starting now is ready, or failed
        self._failures = 0

    def summary(self) -> dict[str, object]:
        return {
            "mode": self.mode,
            "asked": self.asked,
            "why": self.why,
            "state": self.state,
            "pid": self.link.pid if self.link else None,
        }

    def choose(self, model_bytes: int, memory_bytes: int) -> None:
        """Settle the mode once the model's size is known (`memory_bytes`: the device's,
        or its recommended working set)."""
        self.mode, self.why = choose(self.asked, model_bytes, memory_bytes)
        log.info("standby %s: %s", self.mode, self.why)

    def refill(self) -> None:
        """Start a spare unless one is there or on its way."""
        if self.mode == "none" or self.link is not None or self._failures >= GIVE_UP:
            return
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._bring_up())

    async def take(self) -> tuple[WorkerLink, bool] | None:
        """The spare ready to be promoted, and whether it is warm, or None. One still
        starting is waited for: it began before the fault, so it is ready sooner than a
        worker started now would be (bounded by --load-timeout, like any load)."""
        if self.state == "starting":
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._settled.wait(), self._load_timeout)
        if self.state != "ready" or self.link is None or self.link.failure.done():
            return None
        if self._task is not None:
            self._task.cancel()  # it watches this spare, which is the serving worker now
            self._task = None
        link, self.link, self.state = self.link, None, None
        self._failures = 0
        return link, self.warm

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self.link is not None:
            await self.link.kill()

    async def _bring_up(self) -> None:
        """Start a spare, then watch it while it waits: a spare that dies is replaced."""
        while self._failures < GIVE_UP:
            self.state = "starting"
            self._settled.clear()
            try:
                self.warm = self.mode == "warm"
                self.link = link = await self._spawn(self.warm)
                msg = await link.loaded(self._load_timeout, "spare's start")
                if isinstance(msg, LoadFailed):
                    raise FaultError(link.fault("backend_error", msg.message, msg.traceback))
                if isinstance(msg, Ready) and (fault := await self._check(link)) is not None:
                    raise FaultError(fault)
                assert isinstance(msg, Warm | Ready)
                self.state = "ready"
                self._settled.set()
                log.info("standby %s spare ready (pid %d)", self.mode, link.pid)
                # shielded: cancelling this watch at promotion must not cancel the future
                # that the supervision loop watches from then on
                raise FaultError(await asyncio.shield(link.failure))
            except FaultError as err:
                self._failures += 1
                log.warning("standby spare failed (%s): %s", err.fault.cls, err.fault.message)
                if self.link is not None:
                    await self.link.kill()
                self.link, self.state = None, "failed"
                self._settled.set()
                await asyncio.sleep(BACKOFF * self._failures)


def choose(asked: str, model_bytes: int, memory_bytes: int) -> tuple[str, str]:
    """The standby mode to run and why, from what was asked and the sizes."""
    two, gib = 2 * model_bytes, 2**30
    sizes = f"two copies of the model take {two / gib:.1f} of {memory_bytes / gib:.1f} GiB"
    if asked == "none":
        return "none", "asked for none"
    if asked == "warm":
        return "warm", "asked for warm"
    if asked == "hot":
        if two > HOT_FITS * memory_bytes:
            return "warm", f"asked for hot, but {sizes}: a warm spare instead"
        return "hot", "asked for hot"
    if two <= HOT_SHARE * memory_bytes:
        return "hot", f"auto: {sizes}, within {HOT_SHARE:.0%}"
    return "warm", f"auto: {sizes}, over {HOT_SHARE:.0%}"

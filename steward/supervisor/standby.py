"""The spare worker (`--standby`): recovery faster than any restart.

`warm`: a process that has imported the runtime and initialised the device, with no model;
promoting it costs the model load and the canary. `hot`: the spare has loaded the model and
passed the canary; promoting it is a swap. `auto` picks `hot` where two copies of the model
take at most `HOT_SHARE` of the device's memory (its recommended working set where it has
one, as Metal does, else its total; for a group of ranks, on the host where a copy is
tightest, which its worker says: ranks/room.py), so KV caches keep room; else `warm`: on
CUDA a warm spare recovers no faster than a restart (the load dominates), on a small Mac a
hot one would not fit. A group's spare is a whole spare group, which nothing here knows.
The spare starts only once a worker serves (it never competes with a load that clients
wait for) and again behind each promotion. Its own faults are logged, never shown to
clients; after three in a row it is given up until the next promotion. It dies with the
front like any worker (the same lifeline).

A suspected hang (failover.py) may want a copy of the model beside the suspect before the
mode would have one: `rush` has the spare hold the model (a warm one loads it, a new one
starts with it); once the suspect proves slow, `unrush` lets the mode's own spare stand
again. Two copies may be held where the mode is `hot`, or where they fit as `auto` would
have them and no pool's memory budget counts this model's copies (several models, or
`--memory-budget`: a copy the budget does not count could crowd out another model). A
suspect proven slow may be kept as the hot spare (`adopt`): it holds the model in the
memory a spare would take, and a canary checks it first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from steward.supervisor.faults import Fault
from steward.supervisor.line import FaultError, Link
from steward.supervisor.phases import Phases
from steward.wire.protocol import Load, LoadFailed, Ready, Warm

log = logging.getLogger("steward.standby")

MODES = ("auto", "none", "warm", "hot")
HOT_SHARE = 0.5  # `auto`: two copies within this share of the device's memory
HOT_FITS = 0.9  # `hot` asked for: two copies must fit this share at least
GIVE_UP = 3  # failed spares in a row
BACKOFF = 5.0  # seconds before another try, times the failures so far

Spawn = Callable[[bool], Awaitable[Link]]  # warm -> a new spare's line
Check = Callable[[Link], Awaitable[Fault | None]]  # the canary against golden tokens


class Standby:
    def __init__(
        self, mode: str, spawn: Spawn, check: Check, load_timeout: float, unbudgeted: bool
    ) -> None:
        self.asked = mode
        self.unbudgeted = unbudgeted  # no pool budget counts this model's copies
        self.mode = "none" if mode == "none" else "warm"  # until the model's size is known
        self.why = "not chosen yet: the model's size is known once it loads"
        self.two_fit = False  # two copies may be held (the standby's memory rule)
        self.link: Link | None = None
        self.warm = False  # the spare in `link` has no model yet
        self.state: str | None = None  # starting, ready, failed; None without a spare
        self.phases: dict[str, float] = {}  # the last spare's bring-up
        self.rushed = False  # a suspected hang wants the spare to hold the model now
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
            "phases": self.phases,
            "ranks": self.link.ranks if self.link else [],
        }

    def choose(self, model_bytes: int, memory_bytes: int, where: str = "") -> None:
        """Settle the mode once the model's size is known (`memory_bytes`: the device's,
        or its recommended working set; for a group, those of the host `where` a copy is
        tightest)."""
        self.mode, self.why = choose(self.asked, model_bytes, memory_bytes, where)
        fits = 2 * model_bytes <= HOT_SHARE * memory_bytes  # `auto`'s rule
        self.two_fit = self.mode == "hot" or (self.unbudgeted and fits)
        log.info("standby %s: %s", self.mode, self.why)

    @property
    def holding(self) -> bool:
        """The spare holds a copy of the model, or is starting to."""
        return self.state in ("starting", "ready") and not self.warm

    @property
    def hot_ready(self) -> bool:
        """A spare that holds the model is ready to serve (`take` returns it)."""
        link = self.link
        ready = self.state == "ready" and not self.warm
        return ready and link is not None and link.alive and not link.failure.done()

    @property
    def netted(self) -> bool:
        """A fault now would cost no wait for a spare on its way: one is ready, or none is
        starting (a suspect tried alone waits for this: scheduler.py)."""
        return self.state != "starting"

    def refill(self, room: bool) -> None:
        """Start a spare unless one is there or on its way; one that holds the model only
        where `room` is left for its copy."""
        if (self.mode == "none" and not self.rushed) or self._failures >= GIVE_UP:
            return
        warm = self.mode == "warm" and not self.rushed
        if self.link is not None or not (warm or room):
            return
        if self._task is None or self._task.done():
            self.state, self.warm = "starting", warm
            self._task = asyncio.ensure_future(self._bring_up())

    def rush(self, room: bool) -> None:
        """A suspected hang: the spare is to hold the model now (a warm one loads it)."""
        self.rushed = True
        if self.state == "ready" and self.warm and self.link is not None:
            self._restart(self._bring_up(self.link))  # heated
        elif self.state != "starting":  # one starting warm is heated once it is up
            self.refill(room)

    async def unrush(self) -> None:
        """The suspect proved slow: a spare that holds the model where the mode keeps none
        that does is stopped (the mode's own spare comes back with the next refill)."""
        self.rushed = False
        if self.mode == "hot" or not self.holding:
            return
        link, self.link, self.state = self.link, None, None
        self._restart(None)
        if link is not None:
            await link.stop(2.0)

    def adopt(self, link: Link) -> bool:
        """Keep `link`, a worker that holds the model, as the hot spare (after a canary),
        if the mode keeps one and none is there."""
        if self.mode != "hot" or self.link is not None or self.state == "starting":
            return False
        self.link, self.warm = link, False
        self._restart(self._bring_up(link))
        return True

    def settled(self) -> asyncio.Future[bool]:
        """Resolved once the spare starting now is ready or has failed."""
        return asyncio.ensure_future(self._settled.wait())

    async def take(self) -> tuple[Link, bool] | None:
        """The spare ready to be promoted, and whether it is warm, or None. One still
        starting is waited for: it began before the fault, so it is ready sooner than a
        worker started now would be (bounded by --load-timeout, like any load)."""
        if self.state == "starting":
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._settled.wait(), self._load_timeout)
        if self.state != "ready" or self.link is None or self.link.failure.done():
            return None
        self._restart(None)  # its watch ends: it is the serving worker now
        link, self.link, self.state = self.link, None, None
        self._failures = 0
        self.rushed = False
        return link, self.warm

    async def close(self) -> None:
        self._restart(None)
        if self.link is not None:
            await self.link.kill()

    def _restart(self, work: Awaitable[None] | None) -> None:
        if self._task is not None:
            self._task.cancel()
        self._task = None if work is None else asyncio.ensure_future(work)

    async def _bring_up(self, link: Link | None = None) -> None:
        """Start a spare (or have `link` hold the model: a warm spare heated, or a worker
        kept as the spare), then watch it while it waits: a spare that dies is replaced."""
        while self._failures < GIVE_UP:
            self.state = "starting"
            self._settled.clear()
            phases = Phases()
            try:
                if link is None:
                    self.warm = self.mode == "warm" and not self.rushed
                    self.link = link = await self._spawn(self.warm)
                    phases.lap("spawn")
                    await self._loaded(link, phases)
                if self.warm and self.rushed:  # heated: a suspected hang wants the model
                    self.warm = False
                    link.send(Load())
                    await self._loaded(link, phases)
                if not self.warm:
                    if (fault := await self._check(link)) is not None:
                        raise FaultError(fault)
                    phases.lap("canary")
                self.state, self.phases = "ready", phases.seconds
                self._settled.set()
                log.info(
                    "standby %s spare ready (pid %d): %s",
                    "warm" if self.warm else "hot",
                    link.pid,
                    phases.text(),
                )
                # shielded: cancelling this watch at promotion must not cancel the future
                # that the supervision loop watches from then on
                raise FaultError(await asyncio.shield(link.failure))
            except FaultError as err:
                self._failures += 1
                log.warning("standby spare failed (%s): %s", err.fault.cls, err.fault.message)
                if self.link is not None:
                    await self.link.kill()
                link = self.link = None
                self.state = "failed"
                self._settled.set()
                await asyncio.sleep(BACKOFF * self._failures)

    async def _loaded(self, link: Link, phases: Phases) -> None:
        msg = await link.loaded(self._load_timeout, "spare's start")
        if isinstance(msg, LoadFailed):
            raise FaultError(link.fault("backend_error", msg.message, msg.traceback))
        assert isinstance(msg, Warm | Ready)
        phases.ready(msg.phases if isinstance(msg, Ready) else {})


def choose(asked: str, model_bytes: int, memory_bytes: int, where: str = "") -> tuple[str, str]:
    """The standby mode to run and why, from what was asked and the sizes (`where`: the
    host they are of, for a group)."""
    two, gib = 2 * model_bytes, 2**30
    sizes = f"two copies of the model take {two / gib:.1f} of {memory_bytes / gib:.1f} GiB"
    sizes += f" {where}" if where else ""
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

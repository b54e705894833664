"""A worker suspected of a hang: what the supervision loop does (failover.py decides), and
the verdict on a suspect kept aside.

`PROMOTE`: the hot spare serves at once; the suspects are taken off the suspect and replay or
resume on the spare as after any fault (recovery.py), their payloads struck at once, so
that a poison that hangs every worker it runs on is still named and quarantined while the
first verdict is pending. The suspect, its requests cancelled (in its inbox, if it is hung),
is kept aside until its verdict. `RACE` and `WAIT`: the suspect keeps its batch and its
clients keep their streams while it is watched: for a replacement coming up beside it (then
promoted as a hot spare is), or for as long as a replacement would take (then killed and
replaced, a `stall`); a step first ends the suspicion with nothing done.

The verdict on a suspect aside: a step before the ceiling proves it slow, not hung: no
fault is counted, the restart its failover cost and the strikes its suspicion made are
withdrawn, its late answers go nowhere (its requests' sinks are gone), and it is kept as the
next hot spare where the mode keeps one and none is there (it holds the model in the memory
a spare would take, and passes a canary first), else stopped politely. Silence to the
ceiling is a hang: the `stall` fault is counted and the suspect killed (SIGKILL: a hung
worker gets no polite stop). A failure meanwhile is that fault, counted, and it is killed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from steward.supervisor import failover
from steward.supervisor.bringup import Aside
from steward.supervisor.exits import Exit
from steward.supervisor.failover import Move, Verdict
from steward.supervisor.faults import Fault, Outcome
from steward.supervisor.line import Link
from steward.supervisor.silence import Silence
from steward.supervisor.state import State

if TYPE_CHECKING:
    from steward.supervisor.supervisor import Supervisor

log = logging.getLogger("steward.supervisor")


class Suspicions:
    def __init__(self, supervisor: Supervisor) -> None:
        self.sup = supervisor
        self._judging: set[asyncio.Task[None]] = set()

    def summary(self) -> list[dict[str, object]]:
        """The suspects aside, for `/health`."""
        now, ceiling = time.monotonic(), self.sup.config.stall_timeout
        return [
            {
                "pid": aside.link.pid,
                "generation": aside.link.generation,
                "fault": aside.fault.id,
                "silent_s": round(now - aside.since, 1),
                "verdict_in_s": round(max(0.0, aside.since + ceiling - now), 1),
            }
            for aside in self.sup.bringup.asides
        ]

    def pending(self) -> str | None:
        """Why the state is `degraded` while a suspect awaits its verdict."""
        asides = self.sup.bringup.asides
        if not asides:
            return None
        return f"worker {asides[0].link.generation} suspected of a hang, aside until its verdict"

    async def suspect(self, fault: Fault, quiet: Silence) -> None:
        """The serving worker is silent past its bound (`quiet`)."""
        sup = self.sup
        link, bringup = sup.link, sup.bringup
        assert link is not None
        standby = bringup.standby
        affordable = bringup.intensity.affordable()
        starting = standby.state == "starting" and standby.holding
        move = failover.on_suspicion(standby.hot_ready, starting, bringup.room(), affordable)
        log.warning("worker %d suspected of a hang (%s): %s", link.generation, move, fault.message)
        if move is Move.PROMOTE:
            await self._fail_over(fault, quiet.since)
            return
        if move is Move.RACE:
            standby.rush(bringup.room())
        limit = failover.patience(
            move, quiet.allowed, bringup.facts.loading_s, quiet.ceiling, affordable
        )
        sup.set_state(State.RECOVERING, f"worker {link.generation} suspected of a hang")
        bringup.began()
        await self._watch(link, fault, quiet.since, quiet.since + limit, move is Move.RACE)

    async def close(self) -> None:
        """The process stops: no verdict is waited for, no suspect outlives it."""
        for task in list(self._judging):
            task.cancel()
        asides, self.sup.bringup.asides = self.sup.bringup.asides, []
        for aside in asides:
            await aside.link.kill()

    async def _watch(
        self, link: Link, fault: Fault, since: float, deadline: float, race: bool
    ) -> None:
        """The suspect keeps its batch until it steps (nothing done), fails (that fault),
        the replacement racing it is ready (promoted), or `deadline` (a `stall`)."""
        sup, standby = self.sup, self.sup.bringup.standby
        while True:
            waits: set[asyncio.Future[object]] = {link.stepped(), link.failure}
            if standby.state == "starting":
                waits.add(standby.settled())
            timeout = max(0.0, deadline - time.monotonic())
            try:
                await asyncio.wait(waits, timeout=timeout, return_when="FIRST_COMPLETED")
            finally:
                for waited in waits - {link.failure}:
                    waited.cancel()
            if link.last_step >= fault.detected:
                await self._lifted(link, since)
            elif link.failure.done():
                await sup.recover(link.failure.result())
            elif race and standby.hot_ready:
                await self._fail_over(fault, since)
            elif time.monotonic() >= deadline:
                silent = time.monotonic() - since
                fault.message = f"no progress on the batch for {silent:.1f} s (suspected hang)"
                await sup.recover(fault)
            else:
                continue
            return

    async def _lifted(self, link: Link, since: float) -> None:
        """It stepped before anything was done: slow, not hung."""
        log.warning(
            "worker %d stepped after %.1f s of silence: slow, not hung; nothing replayed",
            link.generation,
            link.last_step - since,
        )
        self.sup.events.suspicion_judged(Verdict.SLOW)
        await self.sup.bringup.standby.unrush()
        self.sup.serving()

    async def _fail_over(self, fault: Fault, since: float) -> None:
        """The hot spare serves; the suspects replay or resume there; the suspect waits
        aside for its verdict."""
        sup = self.sup
        old = sup.link
        assert old is not None
        sup.fault_log.name(fault)
        suspects, regroup = sup.seize(fault)
        strike = sup.quarantine.fault(job.digest for job in suspects)
        try:
            charge = await sup.bringup.fail_over(fault)
        except Exit as exc:
            sup.give_up(fault, suspects, f"exit {exc.code}")
            raise
        aside = Aside(old, fault, charge, strike, since)
        sup.bringup.asides.append(aside)
        generation = sup.link.generation if sup.link else 0
        fault.decide(
            Outcome.PROMOTED,
            f"promoted standby (generation {generation}); worker {old.generation} aside until "
            "its verdict",
        )
        sup.plan(fault, suspects, regroup, kept=False)
        log.warning("fault %s: %s", fault.id, fault.action)
        task = asyncio.ensure_future(self._judge(aside))
        self._judging.add(task)
        task.add_done_callback(self._judging.discard)

    async def _judge(self, aside: Aside) -> None:
        """Wait for the suspect's evidence: a step, a failure, or the ceiling."""
        link = aside.link
        deadline = aside.since + self.sup.config.stall_timeout
        stepped = link.stepped()
        try:
            timeout = max(0.0, deadline - time.monotonic())
            if link.last_step < aside.fault.detected:  # else it stepped while the spare took over
                await asyncio.wait(
                    {stepped, link.failure}, timeout=timeout, return_when="FIRST_COMPLETED"
                )
        finally:
            stepped.cancel()
        stepped_at = link.last_step if link.last_step >= aside.fault.detected else 0.0
        verdict = failover.verdict(stepped_at, deadline, link.failure.done())
        await self._judged(aside, verdict)
        self.sup.context.wake.set()  # the state, the next spare: the loop decides

    async def _judged(self, aside: Aside, verdict: Verdict) -> None:
        """Acts on the verdict; the suspect leaves the asides (the memory it held is free
        for the next spare, or for a replacement) as it becomes the spare, retires or dies."""
        sup, link, fault = self.sup, aside.link, aside.fault
        sup.events.suspicion_judged(verdict)
        if verdict is Verdict.SLOW:
            sup.bringup.asides.remove(aside)
            sup.bringup.intensity.withdraw(aside.charge)
            sup.quarantine.withdraw(aside.strike)
            log.warning(
                "fault %s withdrawn: worker %d stepped %.1f s after its last progress: slow, "
                "not hung (no fault counted, no restart spent)",
                fault.id,
                link.generation,
                link.last_step - aside.since,
            )
            if sup.bringup.standby.adopt(link):
                log.info("worker %d kept as the hot spare", link.generation)
            else:
                sup.bringup.retire_later(link, None)
            return
        if verdict is Verdict.FAILED:
            failure = link.failure.result()
            fault.cls, fault.message, fault.traceback = (
                failure.cls,
                failure.message,
                failure.traceback,
            )
            fault.action += "; it failed while aside: killed"
        else:
            fault.message += f"; silent to the ceiling ({sup.config.stall_timeout:.0f} s)"
            fault.action += "; hung: killed at the ceiling"
        sup.fault_log.report(fault)
        sup.bringup.asides.remove(aside)  # its memory is free as it dies
        await link.kill()

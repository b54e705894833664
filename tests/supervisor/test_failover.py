"""Failover on suspicion, verdict on evidence (failover.py, suspicions.py), against fake
worker lines: every branch of what a suspected hang gets, and every verdict.

The fake's steps take milliseconds, so its floor is scaled to them (a GPU's is 1 s, a
CPU's 3 s: bounds.py); the ceiling (`--stall-timeout`) is two seconds, ample for a loop
that a busy machine delays by tenths of a second. A hang is a request
silent after its first token (`pause`: for that long, once; `hang`: for good, on every
worker), and the batch with it, since the fake's other members wait for the `gate`.
"""

from __future__ import annotations

import asyncio

import pytest

from steward.errors import ApiError
from steward.supervisor import bounds
from steward.supervisor.faults import FaultClass, Outcome
from steward.supervisor.jobs import Job
from steward.supervisor.quarantine import Quarantine
from steward.supervisor.state import State
from steward.supervisor.supervisor import Supervisor
from steward.wire.protocol import Done
from tests.supervisor.fakelink import TOKENS, FakeLink, Script
from tests.supervisor.harness import outcome, run, start, submit, until

FLOOR = 0.1
CEILING = 2.0
HUNG = 30.0  # a pause no test waits for
GIB = 2**30


@pytest.fixture(autouse=True)
def floor_of_the_fake(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bounds, "FLOOR_GPU", FLOOR)


async def serving(
    script: Script, standby: str = "hot", ceiling: float = CEILING, **config: object
) -> Supervisor:
    supervisor = await start(script, standby=standby, stall_timeout=ceiling, **config)
    if standby != "none":
        await until(lambda: supervisor.bringup.standby.state == "ready")
    return supervisor


async def batch(supervisor: Supervisor, script: Script, n: int) -> tuple[list[Job], FakeLink]:
    """`n` streams decoding on the serving worker (the fake's first, or the one named)."""
    jobs = [submit(supervisor, i, stream=True) for i in range(1, n + 1)]
    await until(lambda: all(job.started for job in jobs))
    link = supervisor.link
    assert isinstance(link, FakeLink)
    return jobs, link


async def whole(jobs: list[Job]) -> None:
    """Every stream got its whole answer, unbroken: no token lost or repeated."""
    for job in jobs:
        tokens, end = await outcome(job)
        assert isinstance(end, Done) and end.completion_tokens == TOKENS, end
        assert tokens == list(range(100, 100 + TOKENS)), tokens


def aside(supervisor: Supervisor) -> FakeLink:
    (one,) = supervisor.bringup.asides
    assert isinstance(one.link, FakeLink)
    return one.link


async def suspected(supervisor: Supervisor, script: Script, n: int = 4) -> tuple[list, FakeLink]:
    """A batch of `n` whose third member's step stops: failed over, its suspect aside."""
    jobs, first = await batch(supervisor, script, n)
    await until(lambda: bool(supervisor.bringup.asides), within=CEILING)  # before the ceiling
    assert aside(supervisor) is first and supervisor.link is not first
    assert supervisor.fault_log.total == 0  # a suspicion is no fault yet
    assert supervisor.snapshot().suspects[0]["pid"] == first.pid
    return jobs, first


def test_a_suspect_is_failed_over_to_the_hot_spare_and_killed_silent_at_the_ceiling():
    async def scenario() -> None:
        gate = asyncio.Event()
        script = Script(pause={3: HUNG}, gate=gate)
        supervisor = await serving(script)
        spare = supervisor.bringup.standby.link
        jobs, first = await suspected(supervisor, script)
        assert supervisor.link is spare and supervisor.state is State.DEGRADED
        assert supervisor.snapshot().restarts_in_window == 1  # the promotion, charged
        gate.set()
        await whole(jobs)  # resumed on the spare
        await until(lambda: not supervisor.bringup.asides, within=2 * CEILING)
        fault = supervisor.fault_log.last
        assert (fault.cls, fault.outcome, supervisor.fault_log.total) == (
            FaultClass.STALL,
            Outcome.PROMOTED,
            1,
        )
        assert "hung: killed at the ceiling" in fault.action
        assert first.killed and not first.stopped  # SIGKILL: a hung worker gets no polite stop
        assert supervisor.snapshot().restarts_in_window == 1

    run(scenario)


def test_a_suspect_that_steps_after_its_spare_took_over_was_slow_and_costs_nothing():
    async def scenario() -> None:
        gate = asyncio.Event()
        script = Script(pause={3: CEILING / 2}, gate=gate)
        supervisor = await serving(script)
        jobs, first = await suspected(supervisor, script)
        gate.set()
        await whole(jobs)  # answered by the spare; the suspect's late answer went nowhere
        await until(lambda: supervisor.bringup.standby.link is first)  # kept as the spare
        await until(lambda: supervisor.bringup.standby.state == "ready")
        snap = supervisor.snapshot()
        assert (snap.faults_total, snap.restarts_in_window) == (0, 0)
        assert not supervisor.quarantine.struck("payload-3")  # its strike withdrawn
        assert not first.killed and len(first.canaries) == 2  # checked again to stand by
        supervisor.serving()
        assert supervisor.state is State.READY

    run(scenario)


def test_a_suspect_that_stepped_before_its_verdict_was_awaited_is_judged_at_once():
    """Its step may land while the spare takes over, before the verdict is waited for:
    it was slow, and that is known then, not at the ceiling."""

    async def scenario() -> None:
        gate = asyncio.Event()
        script = Script(pause={3: CEILING / 4}, gate=gate)
        supervisor = await serving(script)
        jobs, first = await suspected(supervisor, script)
        for judging in list(supervisor.suspicions._judging):
            judging.cancel()  # the verdict not yet awaited when the step lands
        gate.set()
        (pending,) = supervisor.bringup.asides
        await until(lambda: first.last_step >= pending.fault.detected, within=CEILING)
        judged = asyncio.ensure_future(supervisor.suspicions._judge(pending))
        await until(judged.done, within=CEILING / 4)
        await whole(jobs)
        snap = supervisor.snapshot()
        assert (snap.faults_total, snap.restarts_in_window) == (0, 0)
        assert not supervisor.bringup.asides and not first.killed

    run(scenario)


def test_a_suspect_that_steps_only_after_the_ceiling_is_still_hung():
    async def scenario() -> None:
        gate = asyncio.Event()
        script = Script(pause={3: 1.5 * CEILING}, gate=gate)
        supervisor = await serving(script)
        jobs, first = await suspected(supervisor, script)
        gate.set()
        await whole(jobs)
        await until(lambda: first.killed, within=2 * CEILING)
        steps = first.steps
        await until(lambda: first.steps > steps, within=CEILING)  # its late words
        assert supervisor.fault_log.total == 1 and supervisor.fault_log.last.cls == FaultClass.STALL
        assert supervisor.snapshot().restarts_in_window == 1
        assert supervisor.bringup.standby.link is not first

    run(scenario)


def test_without_a_spare_a_replacement_races_the_suspect_and_takes_over():
    """`--standby none` where another copy fits: the replacement starts at once."""

    async def scenario() -> None:
        gate = asyncio.Event()
        script = Script(pause={3: HUNG}, gate=gate)
        supervisor = await serving(script, standby="none")
        jobs, first = await suspected(supervisor, script)
        assert supervisor.link.generation == 2
        gate.set()
        await whole(jobs)
        await until(lambda: first.killed, within=2 * CEILING)
        assert supervisor.fault_log.total == 1
        assert supervisor.bringup.standby.link is None  # the mode keeps no spare

    run(scenario)


def test_a_suspect_that_steps_before_its_racing_replacement_is_up_keeps_its_batch():
    async def scenario() -> None:
        gate, loads = asyncio.Event(), asyncio.Event()
        script = Script(pause={3: CEILING / 2}, gate=gate, replacements=loads)
        supervisor = await serving(script, standby="none")
        jobs, first = await batch(supervisor, script, 4)
        await until(lambda: supervisor.state is State.RECOVERING)  # suspected: the race on
        await until(lambda: supervisor.state.serving, within=CEILING)  # it stepped
        gate.set()
        await whole(jobs)
        assert [r.seq for r in script.started].count(3) == 1  # nothing replayed
        assert supervisor.link is first and script.links == [first]  # the racer stopped
        assert supervisor.fault_log.total == 0 and supervisor.bringup.standby.state is None

    run(scenario)


def test_without_room_for_a_replacement_a_suspect_gets_what_a_bring_up_takes():
    """Two copies do not fit: wait as long as a replacement would take, then kill."""

    async def scenario() -> None:
        gate = asyncio.Event()
        script = Script(pause={3: HUNG}, gate=gate, model_bytes=60 * GIB, memory_bytes=100 * GIB)
        supervisor = await serving(script, standby="none")
        supervisor.bringup.measured(0.5)  # the last bring-up took this long
        jobs, first = await batch(supervisor, script, 4)
        await until(lambda: supervisor.state is State.RECOVERING)
        assert not first.killed  # the wait: no other copy fits
        await until(lambda: first.killed, within=CEILING)  # before the ceiling
        gate.set()
        await whole(jobs)  # replayed on the replacement
        fault = supervisor.fault_log.last
        assert fault.cls == FaultClass.STALL and fault.outcome is Outcome.REPLACED
        assert "suspected hang" in fault.message and supervisor.link.generation == 2

    run(scenario)


def test_without_room_a_suspect_that_steps_within_the_wait_keeps_its_batch():
    async def scenario() -> None:
        gate = asyncio.Event()
        script = Script(pause={3: 0.2}, gate=gate, model_bytes=60 * GIB, memory_bytes=100 * GIB)
        supervisor = await serving(script, standby="none")
        supervisor.bringup.measured(0.6)
        jobs, first = await batch(supervisor, script, 4)
        gate.set()
        await whole(jobs)
        assert supervisor.link is first and supervisor.fault_log.total == 0
        assert [r.seq for r in script.started].count(3) == 1

    run(scenario)


def test_a_suspicion_while_the_spare_is_still_starting_waits_for_it_and_fails_over():
    async def scenario() -> None:
        gate, loads = asyncio.Event(), asyncio.Event()
        script = Script(pause={3: HUNG}, gate=gate, replacements=loads)
        supervisor = await start(script, standby="hot", stall_timeout=CEILING)
        assert supervisor.bringup.standby.state == "starting"  # held in its spawn
        jobs, first = await batch(supervisor, script, 4)
        await until(lambda: supervisor.state is State.RECOVERING)
        assert not supervisor.bringup.asides
        loads.set()  # the spare comes up: it takes over
        await until(lambda: bool(supervisor.bringup.asides))
        assert aside(supervisor) is first and supervisor.link.generation == 2
        gate.set()
        await whole(jobs)

    run(scenario)


def test_a_poison_that_hangs_every_worker_is_found_and_the_innocents_answered():
    async def scenario() -> None:
        gate = asyncio.Event()
        script = Script(hang={8}, gate=gate)
        supervisor = await serving(script)
        innocents, _ = await batch(supervisor, script, 7)
        poison = submit(supervisor, 8, stream=True, digest="poison")
        await until(lambda: bool(supervisor.bringup.asides), within=CEILING)
        gate.set()  # the innocents decode again, on the spare, together
        await whole(innocents)
        tokens, end = await outcome(poison)
        assert isinstance(end, ApiError) and end.type == "request_quarantined", end
        assert tokens == [100, 101]  # its stream ends in the error after what it had sent
        await until(lambda: not supervisor.bringup.asides, within=2 * CEILING)
        assert supervisor.state.serving and not supervisor.exit_code.done()
        assert supervisor.snapshot().restarts_in_window <= supervisor.config.max_restarts
        assert {f.cls for f in supervisor.fault_log.recent} == {FaultClass.STALL}
        assert len(supervisor.quarantine) == 1 and not supervisor.quarantine.struck("q")

    run(scenario)


def test_a_drain_with_a_suspect_aside_answers_everyone_and_kills_the_suspect():
    async def scenario() -> None:
        gate = asyncio.Event()
        script = Script(pause={3: HUNG}, gate=gate)
        supervisor = await serving(script, ceiling=HUNG)  # no verdict before the stop
        jobs, first = await suspected(supervisor, script)
        draining = asyncio.ensure_future(supervisor.stop(30.0, asyncio.Event()))
        gate.set()
        await whole(jobs)
        await asyncio.wait_for(draining, 5)
        assert first.killed and supervisor.fault_log.total == 0  # no verdict at a stop

    run(scenario)


def test_slow_verdicts_leave_the_restart_budget_as_it_was():
    """Each slow step is failed over, charged, and withdrawn: one restart allowed, two
    suspicions, no exit, nothing spent. (The second at another width: a slow step raises
    its own width's bound for a while.)"""

    async def scenario() -> None:
        gate = asyncio.Event()
        script = Script(pause={3: CEILING / 2, 5: CEILING / 2}, gate=gate)
        supervisor = await serving(script, max_restarts=1)
        jobs, first = await suspected(supervisor, script)
        gate.set()
        await whole(jobs)
        await until(lambda: supervisor.bringup.standby.link is first)
        await until(lambda: supervisor.bringup.standby.state == "ready")
        await whole([submit(supervisor, 5, stream=True)])  # alone: slow again
        assert supervisor.link is first  # failed over to it, kept as the spare
        await until(lambda: not supervisor.bringup.asides)
        snap = supervisor.snapshot()
        assert (snap.faults_total, snap.restarts_in_window) == (0, 0)
        assert not supervisor.exit_code.done()

    run(scenario)


def test_a_suspicion_the_restart_budget_cannot_pay_for_waits_to_the_ceiling():
    async def scenario() -> None:
        gate = asyncio.Event()
        gate.set()
        script = Script(pause={1: CEILING / 2}, gate=gate)
        supervisor = await serving(script, max_restarts=0)
        await whole([submit(supervisor, 1, stream=True)])
        assert not supervisor.exit_code.done() and supervisor.fault_log.total == 0
        assert supervisor.link is script.links[0]

    run(scenario)


def test_a_starved_worker_is_not_suspected_before_the_ceiling():
    """No heartbeat either: the machine does not run the worker, which is no hang."""

    async def scenario() -> None:
        gate = asyncio.Event()
        gate.set()
        script = Script(pause={1: CEILING / 2}, gate=gate, starved=True)
        supervisor = await serving(script)
        await whole([submit(supervisor, 1, stream=True)])
        assert supervisor.link is script.links[0] and supervisor.fault_log.total == 0

    run(scenario)


def test_a_withdrawn_strike_lifts_a_quarantine_that_rested_on_it():
    """A suspicion proven wrong names no payload, and frees one its strike convicted."""
    quarantine = Quarantine(600)
    quarantine.fault(["p", "q"])
    strike = quarantine.fault(["p"])  # alone: named; with the first, once "q" finishes
    quarantine.acquit("q")
    assert quarantine.blocked("p")
    quarantine.withdraw(strike)
    assert not quarantine.blocked("p") and quarantine.named("p") == 1

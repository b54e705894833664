"""Group testing of a batch's suspects, strikes that follow the evidence, the stall
ceiling, the standby's choice and the polite stop: against fake worker lines, in
milliseconds. Each interleaving is forced by the script (a gate that holds answers after
their first token, a poison that strikes a worker at a request's first step), never by
timing, so every run takes the same path.
"""

from __future__ import annotations

import asyncio

import pytest

from steward.errors import ApiError
from steward.supervisor.faults import FaultClass, Outcome
from steward.supervisor.jobs import Job, JobStatus
from steward.supervisor.supervisor import Supervisor
from steward.wire.protocol import Done
from tests.supervisor.fakelink import TOKENS, Script
from tests.supervisor.harness import outcome, run, start, submit, until

C = FaultClass
WORKER_SPENT = (Outcome.REPLACED, Outcome.PROMOTED)


def replacements(supervisor: Supervisor) -> int:
    return sum(f.outcome in WORKER_SPENT for f in supervisor.fault_log.recent)


async def decoding(supervisor: Supervisor, n: int, same: bool, stream: bool = True) -> list[Job]:
    """`n` clients whose answers have begun (each has its first token)."""
    jobs = [submit(supervisor, i, stream, "q" if same else "") for i in range(1, n + 1)]
    await until(lambda: all(job.started for job in jobs))
    return jobs


async def replayed(supervisor: Supervisor, jobs: list[Job]) -> None:
    """Held until a fault has struck and these have begun again (or more faults struck)."""
    await until(
        lambda: (
            supervisor.fault_log.total >= 2
            or (
                supervisor.fault_log.total == 1 and all(j.attempts == 2 and j.started for j in jobs)
            )
        )
    )


def answered(end: Done | ApiError) -> bool:
    return isinstance(end, Done) and end.completion_tokens == TOKENS


def quarantined(end: Done | ApiError) -> bool:
    return isinstance(end, ApiError) and end.type == "request_quarantined"


@pytest.mark.parametrize("standby", ["none", "warm", "hot"])
@pytest.mark.parametrize("same", [True, False], ids=["same-question", "distinct"])
def test_a_poison_joining_a_decoding_batch_costs_two_workers_and_no_innocent(standby, same):
    async def scenario() -> None:
        gate = asyncio.Event()
        script = Script(poison={8}, gate=gate)
        supervisor = await start(script, standby=standby)
        innocents = await decoding(supervisor, 7, same)
        poison = submit(supervisor, 8, digest="poison")
        await replayed(supervisor, innocents)
        gate.set()
        ends = [end for _, end in [await outcome(job) for job in innocents]]
        assert all(answered(end) for end in ends)
        assert quarantined((await outcome(poison))[1])
        assert replacements(supervisor) == 2
        assert supervisor.state.serving and not supervisor.exit_code.done()
        assert not supervisor.quarantine.struck("q") and len(supervisor.quarantine) == 1
        # the innocents ran again together at once, on the first replacement, and only once
        first = script.faulted_at[0]
        assert script.in_flight[first : first + 7] == list(range(1, 8))
        assert [r.seq for r in script.started].count(1) == 2

    run(scenario)


def test_a_suspect_tried_alone_waits_for_the_next_spare_while_new_requests_are_served():
    """After the first fault the hot spare serves and the next one starts; the poison's
    trial alone waits for that one to be ready, so a request arriving meanwhile is answered
    at once, and the poison's second fault is a swap, not a bring-up that it waits for."""

    async def scenario() -> None:
        gate, spares = asyncio.Event(), asyncio.Event()
        spares.set()
        script = Script(poison={8}, gate=gate, replacements=spares)
        supervisor = await start(script, standby="hot")
        await until(lambda: supervisor.bringup.standby.hot_ready)
        spares.clear()  # the spare after the first one is slow to come
        innocents = await decoding(supervisor, 7, same=False)
        poison = submit(supervisor, 8, digest="poison")
        await replayed(supervisor, innocents)
        gate.set()
        assert all(answered(end) for _, end in [await outcome(job) for job in innocents])
        late = submit(supervisor, 9)
        assert answered((await outcome(late))[1])  # on the promoted spare, the trial held
        assert [r.seq for r in script.started].count(8) == 1 and supervisor.fault_log.total == 1
        assert supervisor.snapshot().probation == 1  # the poison, waiting for its net
        spares.set()
        assert quarantined((await outcome(poison))[1])
        assert [f.outcome for f in supervisor.fault_log.recent] == [Outcome.PROMOTED] * 2

    run(scenario)


@pytest.mark.parametrize("sent", [2, 1], ids=["mid-decode", "at-its-first-step"])
def test_a_transient_crash_in_a_decoding_batch_costs_one_worker_and_no_answer(sent):
    """Struck past every member's first step, the batch runs again as one group; struck at
    one member's first step, the others run again together and then it alone."""

    async def scenario() -> None:
        gate = asyncio.Event()
        script = Script(faults={8: [C.WORKER_CRASH]}, gate=gate, sent_before_fault=sent)
        supervisor = await start(script, max_batch=8)
        jobs = await decoding(supervisor, 7, same=False)
        jobs.append(submit(supervisor, 8, stream=True))
        await until(lambda: supervisor.fault_log.total == 1)
        gate.set()
        results = [await outcome(job) for job in jobs]
        assert all(answered(end) for _, end in results)
        assert all(tokens == list(range(100, 100 + TOKENS)) for tokens, _ in results)
        assert replacements(supervisor) == 1
        first = script.faulted_at[0]
        groups = list(range(1, 9)) if sent == 2 else [*range(1, 8), 1]
        assert script.in_flight[first:] == groups
        assert len(supervisor.quarantine) == 0

    run(scenario)


def test_a_poison_with_no_evidence_is_found_by_splitting_within_the_budget():
    async def scenario() -> None:
        script = Script(poison={5})  # all eight start together: the fault names no one
        supervisor = await start(script, max_batch=8)
        jobs = [submit(supervisor, i) for i in range(1, 9)]
        ends = [end for _, end in [await outcome(job) for job in jobs]]
        assert quarantined(ends[4])
        assert all(answered(end) for i, end in enumerate(ends) if i != 4)
        assert replacements(supervisor) <= supervisor.config.max_restarts
        assert supervisor.state.serving and not supervisor.exit_code.done()

    run(scenario)


def test_a_resumed_poison_stream_ends_in_its_quarantine_after_the_tokens_it_sent():
    async def scenario() -> None:
        gate = asyncio.Event()
        script = Script(poison={8}, poison_after=2, gate=gate)
        supervisor = await start(script, max_batch=8)
        innocents = await decoding(supervisor, 7, same=True)
        poison = submit(supervisor, 8, stream=True, digest="poison")
        await until(lambda: supervisor.fault_log.total >= 1)
        gate.set()
        assert all(answered(end) for _, end in [await outcome(job) for job in innocents])
        tokens, end = await outcome(poison)
        assert tokens == [100, 101] and quarantined(end)
        assert supervisor.state.serving and not supervisor.exit_code.done()

    run(scenario)


def test_copies_arriving_during_probation_wait_and_share_the_verdict():
    async def scenario() -> None:
        gate = asyncio.Event()
        script = Script(poison={8}, gate=gate)
        supervisor = await start(script)
        innocents = await decoding(supervisor, 7, same=True)
        poison = submit(supervisor, 8, digest="poison")
        await until(lambda: supervisor.fault_log.total >= 1)
        copy = submit(supervisor, 9, digest="poison")  # a client's retry, while on probation
        twin = submit(supervisor, 10, digest="q")  # the innocent question, asked again
        gate.set()
        assert quarantined((await outcome(poison))[1])
        assert quarantined((await outcome(copy))[1])
        assert answered((await outcome(twin))[1])
        assert all(answered(end) for _, end in [await outcome(job) for job in innocents])
        assert 9 not in [r.seq for r in script.started]  # the copy never reached a worker
        with pytest.raises(ApiError) as later:
            submit(supervisor, 11, digest="poison")
        assert later.value.type == "request_quarantined"

    run(scenario)


def test_a_client_leaving_while_its_group_waits_changes_no_verdict():
    """The race of a cancel against recovery: the one who left never finishes, so it
    acquits nobody, and the poison is still found and quarantined within the budget."""

    async def scenario() -> None:
        gate = asyncio.Event()
        script = Script(poison={8}, gate=gate)
        supervisor = await start(script)
        innocents = await decoding(supervisor, 7, same=False)
        poison = submit(supervisor, 8, digest="poison")
        await until(lambda: supervisor.fault_log.total >= 1)
        leaving = innocents.pop()
        supervisor.cancel(leaving)  # while it waits for its group
        gate.set()
        assert all(answered(end) for _, end in [await outcome(job) for job in innocents])
        assert quarantined((await outcome(poison))[1])
        assert leaving.status is JobStatus.CANCELLED
        assert supervisor.state.serving and not supervisor.exit_code.done()

    run(scenario)


def test_a_second_fault_during_the_first_canary_replaces_the_worker_once():
    async def scenario() -> None:
        script = Script(canaries=["pass", "fail"], faults={2: [C.GPU_TIMEOUT]})
        supervisor = await start(script)
        jobs = [submit(supervisor, i) for i in range(1, 4)]
        assert all(answered(end) for _, end in [await outcome(job) for job in jobs])
        assert replacements(supervisor) == 1
        assert "canary failed (gpu_timeout)" in supervisor.fault_log.last.action

    run(scenario)


def test_a_fault_that_keeps_its_worker_is_halved_down_to_its_payload():
    async def scenario() -> None:
        script = Script(faults={5: [C.GPU_TIMEOUT] * 8}, sent_before_fault=0)
        supervisor = await start(script, max_batch=8)
        jobs = [submit(supervisor, i) for i in range(1, 9)]
        ends = [end for _, end in [await outcome(job) for job in jobs]]
        assert quarantined(ends[4])
        assert all(answered(end) for i, end in enumerate(ends) if i != 4)
        assert replacements(supervisor) == 0
        assert {f.outcome for f in supervisor.fault_log.recent} == {Outcome.KEPT}

    run(scenario)


def test_silence_to_the_ceiling_is_a_stall():
    async def scenario() -> None:
        script = Script(faults={2: [C.STALL]}, sent_before_fault=0)
        supervisor = await start(script, stall_timeout=0.3)
        assert answered((await outcome(submit(supervisor, 1)))[1])
        assert answered((await outcome(submit(supervisor, 2)))[1])  # replayed
        assert supervisor.fault_log.last.cls == C.STALL
        assert "ceiling 0.3 s" in supervisor.fault_log.last.message

    run(scenario)


@pytest.mark.parametrize(
    ("model_gib", "memory_gib", "mode"), [(1, 24, "hot"), (8, 24, "warm"), (60, 100, "warm")]
)
def test_standby_auto_chooses_hot_only_where_two_copies_fit_with_room(model_gib, memory_gib, mode):
    async def scenario() -> None:
        script = Script(model_bytes=model_gib * 2**30, memory_bytes=memory_gib * 2**30)
        supervisor = await start(script, standby="auto")
        standby = supervisor.snapshot().standby
        assert (standby["mode"], standby["asked"]) == (mode, "auto")
        assert "two copies" in standby["why"]
        await until(lambda: supervisor.bringup.standby.state == "ready")
        assert script.links[-1].warm is (mode == "warm")

    run(scenario)


@pytest.mark.parametrize(("cls", "polite"), [(C.GPU_TIMEOUT, True), (C.WORKER_CRASH, False)])
def test_a_worker_being_replaced_is_asked_to_stop_unless_dead_or_hung(cls, polite):
    async def scenario() -> None:
        script = Script(canaries=["pass", "fail"], faults={1: [cls]})
        supervisor = await start(script)
        assert answered((await outcome(submit(supervisor, 1)))[1])
        old = script.links[0]
        assert old.killed and old.stopped is polite

    run(scenario)

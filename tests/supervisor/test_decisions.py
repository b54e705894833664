"""The recovery decision table, against a fake worker line, in milliseconds: fault class x
canary result x recovery budget x alone or batched x streamed and sent -> what becomes of the
worker and what each client gets. The end-to-end tests beside this one show the same with
real processes and MLX; these cover every branch.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from steward.errors import ApiError
from steward.supervisor.faults import FaultClass, Outcome
from steward.supervisor.jobs import Job
from steward.supervisor.state import State
from steward.supervisor.supervisor import Supervisor
from steward.wire.protocol import Done
from tests.supervisor.fakelink import CALIBRATION, PROVISIONAL, TOKENS, Script
from tests.supervisor.harness import answered, outcome, run, start, submit, until

C = FaultClass


@pytest.mark.parametrize(
    ("cls", "canary", "worker", "generation"),
    [
        (C.GPU_TIMEOUT, "pass", Outcome.KEPT, 1),
        (C.GPU_ERROR, "pass", Outcome.KEPT, 1),
        (C.BACKEND_ERROR, "pass", Outcome.KEPT, 1),
        (C.GPU_TIMEOUT, "fail", Outcome.REPLACED, 2),
        (C.GPU_TIMEOUT, "mismatch", Outcome.REPLACED, 2),
        (C.OOM, "fail", Outcome.REPLACED, 2),
        (C.WORKER_CRASH, None, Outcome.REPLACED, 2),  # no canary of a dead worker
        (C.STALL, None, Outcome.REPLACED, 2),
    ],
)
def test_a_fault_alone_is_replayed_on_a_kept_or_new_worker(cls, canary, worker, generation):
    async def scenario() -> None:
        script = Script(canaries=["pass"] + ([canary] if canary else []), faults={1: [cls]})
        supervisor = await start(script)
        _, end = await outcome(submit(supervisor, 1))
        assert isinstance(end, Done) and end.completion_tokens == TOKENS  # replayed
        fault = supervisor.fault_log.last
        assert (fault.cls, fault.outcome, supervisor.link.generation) == (cls, worker, generation)
        assert fault.request_id == "req-1"
        assert supervisor.state is State.DEGRADED

    run(scenario)


def test_an_allocation_failure_alone_that_the_canary_clears_is_507():
    async def scenario() -> None:
        supervisor = await start(Script(faults={1: [C.OOM]}))
        _, end = await outcome(submit(supervisor, 1))
        assert isinstance(end, ApiError) and end.type == "insufficient_memory"
        assert supervisor.fault_log.last.outcome is Outcome.KEPT

    run(scenario)


def test_an_allocation_failure_in_a_batch_halves_it_and_replays_all():
    async def scenario() -> None:
        script = Script(faults={2: [C.OOM]})
        supervisor = await start(script)
        jobs = [submit(supervisor, i) for i in range(1, 4)]
        ends = [end for _, end in [await outcome(job) for job in jobs]]
        assert all(isinstance(end, Done) for end in ends)
        assert supervisor.scheduler.limit == 16
        assert supervisor.fault_log.last.outcome is Outcome.KEPT

    run(scenario)


def test_a_payload_at_its_second_fault_is_quarantined_with_its_twins():
    async def scenario() -> None:
        script = Script(faults={1: [C.GPU_TIMEOUT, C.GPU_TIMEOUT]})
        supervisor = await start(script)
        _, end = await outcome(submit(supervisor, 1, digest="poison"))
        assert isinstance(end, ApiError) and end.type == "request_quarantined"
        with pytest.raises(ApiError) as twin:
            submit(supervisor, 2, digest="poison")
        assert twin.value.type == "request_quarantined"
        assert supervisor.fault_log.total == 2 and supervisor.link.generation == 1

    run(scenario)


def test_a_poison_stream_is_resumed_once_then_quarantined_and_its_retries_refused():
    async def scenario() -> None:
        script = Script(faults={1: [C.GPU_TIMEOUT, C.GPU_TIMEOUT]})
        supervisor = await start(script)
        tokens, end = await outcome(submit(supervisor, 1, stream=True, digest="poison"))
        assert tokens == [100, 101]  # one before each fault: the resume went on from 101
        assert isinstance(end, ApiError) and end.type == "request_quarantined"
        with pytest.raises(ApiError) as retry:  # the client retries: a new request
            submit(supervisor, 2, stream=True, digest="poison")
        assert retry.value.type == "request_quarantined"
        assert not supervisor.exit_code.done() and supervisor.state.serving

    run(scenario)


def test_a_stream_that_sent_tokens_resumes_after_them():
    async def scenario() -> None:
        script = Script(faults={1: [C.WORKER_CRASH]}, sent_before_fault=2)
        supervisor = await start(script)
        tokens, end = await outcome(submit(supervisor, 1, stream=True))
        assert isinstance(end, Done) and end.completion_tokens == TOKENS
        assert tokens == list(range(100, 100 + TOKENS))  # no gap, no repeat
        assert script.started[-1].resume == [100, 101]

    run(scenario)


def test_a_spent_recovery_budget_exits_75_and_says_so_to_every_client():
    async def scenario() -> None:
        script = Script(faults={1: [C.WORKER_CRASH]})
        supervisor = await start(script, max_restarts=0)
        job = submit(supervisor, 1)
        _, end = await outcome(job)
        assert isinstance(end, ApiError) and end.type == "backend_unavailable"
        assert await asyncio.wait_for(supervisor.exit_code, 5) == 75
        assert supervisor.status() is State.FAILED
        assert supervisor.fault_log.last.outcome is Outcome.EXIT

    run(scenario)


def test_on_fault_exit_exits_75_when_the_canary_fails():
    async def scenario() -> None:
        script = Script(canaries=["pass", "fail"], faults={1: [C.GPU_TIMEOUT]})
        supervisor = await start(script, on_fault="exit")
        _, end = await outcome(submit(supervisor, 1))
        assert isinstance(end, ApiError) and end.type == "backend_unavailable"
        assert await asyncio.wait_for(supervisor.exit_code, 5) == 75

    run(scenario)


def test_a_replacement_that_cannot_pass_its_canary_twice_exits_75():
    async def scenario() -> None:
        script = Script(canaries=["pass", "fail", "fail", "fail"], faults={1: [C.GPU_TIMEOUT]})
        supervisor = await start(script)
        _, end = await outcome(submit(supervisor, 1))
        assert isinstance(end, ApiError)
        assert await asyncio.wait_for(supervisor.exit_code, 5) == 75
        outcomes = [fault.outcome for fault in supervisor.fault_log.recent]
        assert outcomes.count(Outcome.DISCARDED) == 2

    run(scenario)


def test_queued_requests_are_untouched_by_a_fault():
    async def scenario() -> None:
        script = Script(faults={1: [C.WORKER_CRASH]})
        supervisor = await start(script, max_batch=1)
        jobs = [submit(supervisor, i) for i in range(1, 4)]
        ends = [end for _, end in [await outcome(job) for job in jobs]]
        assert all(isinstance(end, Done) for end in ends)
        assert [r.seq for r in script.started] == [1, 1, 2, 3]  # the replay first, in order

    run(scenario)


async def struck_while_replaced() -> tuple[Supervisor, Job, asyncio.Event]:
    """A request whose fault needs a new worker, held in recovery until the event is set."""
    loads = asyncio.Event()
    supervisor = await start(Script(faults={1: [C.WORKER_CRASH]}, replacements=loads))
    struck = submit(supervisor, 1)
    await until(lambda: supervisor.state is State.RECOVERING)
    return supervisor, struck, loads


def test_a_suspect_waits_for_its_replacement_bounded_by_its_deadline_alone():
    """--queue-timeout bounds a first turn; a request the fault struck is owed its replay,
    however long the replacement takes (the order of events decides, not their timing)."""

    async def scenario() -> None:
        _, struck, loads = await struck_while_replaced()
        far = time.monotonic() + 1000
        assert struck.waits_until(queue_timeout=0.0, deadline=far) == far
        loads.set()
        await answered(struck)

    run(scenario)


def test_a_request_that_meets_a_recovery_waits_for_it_when_it_can_end_in_time():
    """No request is refused because a recovery is slow: its first turn's --queue-timeout
    counts from the recovery's expected end (twice the last bring-up), when that is within
    its deadline, and from the recovery's real end once it is over."""

    async def scenario() -> None:
        supervisor, struck, loads = await struck_while_replaced()
        supervisor.bringup.measured(10.0)  # the last bring-up took 10 s
        waiting = submit(supervisor, 2)
        expected = supervisor.bringup.facts.since + 2 * 10.0
        far, near = time.monotonic() + 1000, time.monotonic() + 5
        assert waiting.waits_until(queue_timeout=1.0, deadline=far) == expected + 1.0
        assert waiting.waits_until(1.0, near) == waiting.queued_at + 1.0  # not in time
        loads.set()
        await answered(struck)
        await answered(waiting)
        ended = supervisor.admission.recovery_end()  # serving: when it ended
        assert waiting.queued_at < ended < expected  # the recovery ended sooner
        later = submit(supervisor, 3)
        assert later.waits_until(1.0, far) == later.queued_at + 1.0  # none met
        await answered(later)

    run(scenario)


def test_a_drain_waits_for_the_suspects_of_a_fault_being_handled():
    """Between a fault and its plan the suspects are in no queue; a SIGTERM then must not
    take the drain for finished and leave them unanswered."""

    async def scenario() -> None:
        supervisor, struck, loads = await struck_while_replaced()
        draining = asyncio.ensure_future(supervisor.stop(30.0, asyncio.Event()))
        await until(lambda: supervisor.state is State.STOPPING)  # it has looked for work left
        assert not draining.done() and not struck.finished
        loads.set()
        await answered(struck)
        await draining

    run(scenario)


def test_closing_tells_what_it_still_holds_that_the_process_is_exiting():
    """Another model's failure exits the process: this model's requests get a retryable
    503, not a cut connection."""

    async def scenario() -> None:
        script = Script(gate=asyncio.Event())
        supervisor = await start(script, max_batch=1)
        running, queued = submit(supervisor, 1, stream=True), submit(supervisor, 2)
        await until(lambda: len(script.started) == 1)
        await supervisor.close()
        for job in (running, queued):
            _, end = await outcome(job)
            assert isinstance(end, ApiError) and end.type == "backend_unavailable"
            assert end.retryable
        assert supervisor.status() is State.STOPPING  # told to stop: no loop failure

    run(scenario)


# -- the spare (--standby) ---------------------------------------------------------------


@pytest.mark.parametrize(("mode", "canaries"), [("warm", 2), ("hot", 3)])
def test_a_crash_promotes_the_spare_and_a_new_one_starts_behind(mode, canaries):
    async def scenario() -> None:
        script = Script(faults={1: [C.WORKER_CRASH]})
        supervisor = await start(script, standby=mode)
        await until(lambda: supervisor.bringup.standby.state == "ready")
        spare = supervisor.bringup.standby.link
        _, end = await outcome(submit(supervisor, 1))
        assert isinstance(end, Done)
        assert supervisor.link is spare and supervisor.fault_log.last.outcome is Outcome.PROMOTED
        assert "promoted standby" in supervisor.fault_log.last.action
        await until(lambda: supervisor.bringup.standby.state == "ready")  # a new one behind it
        assert supervisor.bringup.standby.link is not spare
        # warm: the first worker's and the promoted spare's once loaded; hot: the first
        # worker's and each spare's at its start (a crash is no device fault: no more)
        assert sum(len(link.canaries) for link in script.links) == canaries

    run(scenario)


def test_a_first_worker_measuring_between_requests_serves_narrow_and_holds_the_spare():
    """No calibration yet (a machine's first start on a GPU): the worker serves at its
    provisional width, and no spare starts (it would measure too, on the same device) until
    the worker says what it measured; then the batch widens, and every later worker is
    given the calibration."""

    async def scenario() -> None:
        script = Script(calibrating=True)
        supervisor = await start(script, standby="hot")
        first = script.links[0]
        await answered(submit(supervisor, 1))  # the loop decided on a spare before starting it
        assert supervisor.scheduler.limit == PROVISIONAL and supervisor.calibration is None
        assert supervisor.bringup.standby.state is None and len(script.links) == 1
        first.measured()
        await until(lambda: supervisor.bringup.standby.hot_ready)
        assert supervisor.scheduler.limit == CALIBRATION.max_batch
        assert script.settings[1].calibration == CALIBRATION  # the spare measures nothing

    run(scenario)


def test_a_hot_spare_runs_the_canary_again_after_a_device_fault():
    async def scenario() -> None:
        script = Script(canaries=["pass", "pass", "fail"], faults={1: [C.GPU_TIMEOUT]})
        supervisor = await start(script, standby="hot")
        await until(lambda: supervisor.bringup.standby.state == "ready")
        spare = supervisor.bringup.standby.link
        _, end = await outcome(submit(supervisor, 1))
        assert isinstance(end, Done)
        assert supervisor.link is spare
        assert len(spare.canaries) == 2  # at its start, and before serving after gpu_timeout

    run(scenario)


def test_hot_falls_back_to_warm_when_two_copies_do_not_fit():
    async def scenario() -> None:
        script = Script(model_bytes=60 * 2**30, memory_bytes=100 * 2**30)
        supervisor = await start(script, standby="hot")
        assert supervisor.bringup.standby.mode == "warm"
        await until(lambda: supervisor.bringup.standby.state == "ready")
        assert script.links[-1].warm  # the spare holds no model

    run(scenario)


def test_a_promotion_counts_against_the_restart_budget():
    async def scenario() -> None:
        script = Script(faults={1: [C.WORKER_CRASH]})
        supervisor = await start(script, standby="hot", max_restarts=0)
        await until(lambda: supervisor.bringup.standby.state == "ready")
        _, end = await outcome(submit(supervisor, 1))
        assert isinstance(end, ApiError) and end.type == "backend_unavailable"
        assert await asyncio.wait_for(supervisor.exit_code, 5) == 75

    run(scenario)


def test_a_spare_that_fails_is_never_shown_to_clients():
    async def scenario() -> None:
        script = Script(canaries=["pass", "mismatch", "mismatch", "mismatch"])
        supervisor = await start(script, standby="hot")
        await until(lambda: supervisor.bringup.standby.state == "failed")
        _, end = await outcome(submit(supervisor, 1))
        assert isinstance(end, Done)
        assert supervisor.fault_log.total == 0 and supervisor.state is State.READY

    run(scenario)

"""Stall bounds from the worker's own step clock (bounds.py), and the failover decisions
(failover.py): pure functions of what was measured and what is in hand."""

from __future__ import annotations

import pytest

from steward.supervisor import failover
from steward.supervisor.bounds import FLOOR_CPU, FLOOR_GPU, HEADROOM, TIMED, StepBounds, Work
from steward.supervisor.failover import Move, Verdict
from steward.wire.protocol import StepClock

CEILING = 60.0


def measured(*clocks: StepClock, gpu: bool = True) -> StepBounds:
    bounds = StepBounds(CEILING)
    bounds.device(gpu)
    for clock in clocks:
        bounds.measured(clock)
    return bounds


def test_nothing_measured_is_bounded_by_the_ceiling_alone():
    """The first worker's first canary: kernels compile, nothing says how long."""
    assert StepBounds(CEILING).allowed(Work(1, (6,))) == CEILING
    assert StepBounds(CEILING).allowed(Work(8)) == CEILING


def test_a_decode_step_is_bounded_by_the_slowest_recent_one_with_headroom():
    steps = [StepClock(n, 0, seconds) for n, seconds in ((8, 0.5), (8, 0.9), (5, 0.6))]
    bounds = measured(*steps)
    assert bounds.allowed(Work(8)) == pytest.approx(HEADROOM * 0.9)
    assert bounds.allowed(Work(5)) == pytest.approx(HEADROOM * 0.9)  # same power of two


def test_the_floor_and_the_ceiling_hold_whatever_was_measured():
    fast = measured(StepClock(32, 0, 0.01))
    assert fast.allowed(Work(32)) == FLOOR_GPU  # a 10 ms GPU step: the floor
    assert measured(StepClock(32, 0, 0.01), gpu=False).allowed(Work(32)) == FLOOR_CPU
    slow = measured(StepClock(32, 0, 40.0))
    assert slow.allowed(Work(32)) == CEILING  # nothing measured exceeds the ceiling


def test_a_group_on_a_cpu_has_the_floor_of_each_rank_a_gpu_one_the_gpus():
    """Ranks sharing a CPU's cores wait at every collective for the one scheduled last."""
    group = StepBounds(CEILING)
    group.device(False, ranks=2)
    group.measured(StepClock(32, 0, 0.01))
    assert group.allowed(Work(32)) == 2 * FLOOR_CPU
    group.device(True, ranks=2)
    assert group.allowed(Work(32)) == FLOOR_GPU


def test_a_wider_batch_grows_from_the_widest_measured_and_is_a_new_shape():
    bounds = measured(StepClock(4, 0, 0.5, new_shape=True), StepClock(4, 0, 0.5))
    # 16 wide: never seen; its step at most 4x the 4-wide one's, and maybe new kernels
    assert bounds.allowed(Work(16)) == pytest.approx(HEADROOM * (0.5 * 16 / 4 + 0.5))
    assert bounds.allowed(Work(4)) == pytest.approx(HEADROOM * 0.5)
    assert bounds.allowed(Work(2)) == pytest.approx(HEADROOM * (0.5 + 0.5))  # a wider one's


def test_prompts_prefilling_are_bounded_per_token_at_the_chunk_announced():
    chunk = 512
    bounds = measured(
        StepClock(1, 0, 0.01, new_shape=True, chunk=chunk),
        StepClock(1, 0, 0.01),
        StepClock(0, chunk, 0.5, chunk=chunk),  # one chunk: ~1 ms per token
    )
    per_token = 0.5 / chunk
    long_prompt = Work(1, (20_000,))  # chunked: the next step computes 512 of them
    expected = 0.01 + chunk * per_token + 0.01  # a step of 1, a chunk, maybe a new shape
    assert bounds.allowed(long_prompt) == pytest.approx(HEADROOM * expected)
    tail = Work(1, (3,))  # a prompt's tail is timed as TIMED tokens at least
    assert bounds.next_step(tail) == pytest.approx(0.01 + TIMED * per_token + 0.01)


def test_a_prompt_not_yet_admitted_counts_its_characters_as_tokens():
    bounds = measured(
        StepClock(1, 0, 0.01, new_shape=True), StepClock(1, 0, 0.01), StepClock(0, 1000, 1.0)
    )
    assert bounds.next_step(Work(1, unadmitted=4000)) == pytest.approx(0.01 * 2 + 4.0)
    assert StepBounds(CEILING).allowed(Work(1, unadmitted=4000)) == CEILING  # unmeasured


def test_new_shapes_do_not_feed_the_bound_of_ordinary_steps():
    bounds = measured(StepClock(8, 0, 3.0, new_shape=True), StepClock(8, 0, 0.01))
    assert bounds.next_step(Work(8)) == pytest.approx(0.01)


@pytest.mark.parametrize(
    ("hot_ready", "on_its_way", "room", "affordable", "move"),
    [
        (True, False, False, True, Move.PROMOTE),
        (False, True, False, True, Move.RACE),  # a spare already starting
        (False, False, True, True, Move.RACE),  # another copy fits
        (False, False, False, True, Move.WAIT),
        (True, True, True, False, Move.WAIT),  # the budget cannot pay for a failover
    ],
)
def test_what_a_suspicion_gets(hot_ready, on_its_way, room, affordable, move):
    assert failover.on_suspicion(hot_ready, on_its_way, room, affordable) is move


def test_without_room_a_suspect_is_given_what_its_replacement_would_take():
    assert failover.patience(Move.WAIT, 1.0, 5.0, CEILING, True) == 5.0  # ski rental
    assert failover.patience(Move.WAIT, 8.0, 5.0, CEILING, True) == 8.0  # at least its bound
    assert failover.patience(Move.WAIT, 1.0, 500.0, CEILING, True) == CEILING
    assert failover.patience(Move.WAIT, 1.0, 5.0, CEILING, False) == CEILING  # no budget
    assert failover.patience(Move.RACE, 1.0, 5.0, CEILING, True) == CEILING


def test_the_verdict_is_read_from_times_not_from_the_order_news_came():
    assert failover.verdict(stepped_at=9.0, deadline=10.0, failed=False) is Verdict.SLOW
    assert failover.verdict(stepped_at=11.0, deadline=10.0, failed=False) is Verdict.HUNG
    assert failover.verdict(stepped_at=0.0, deadline=10.0, failed=False) is Verdict.HUNG
    assert failover.verdict(stepped_at=0.0, deadline=10.0, failed=True) is Verdict.FAILED


def test_a_worker_measuring_between_requests_has_the_ceiling_until_it_shows_progress():
    """It may be in a measuring step that builds kernels when a request comes: no clock
    says how long that takes, so the first silence of a busy spell is the ceiling's alone;
    from its first progress on the request, the bounds hold again."""
    from types import SimpleNamespace

    from steward.supervisor.silence import silence

    bounds = measured(
        StepClock(1, 0, 0.01, new_shape=True), StepClock(1, 0, 0.01), StepClock(0, 1000, 0.1)
    )
    job = SimpleNamespace(started=False, prefill=0, prompt_chars=40)
    for calibrating, allowed in ((False, FLOOR_GPU), (True, CEILING)):
        link = SimpleNamespace(
            calibrating=calibrating, shaping=False, progress=10.0, heartbeat=10.0
        )
        assert silence(link, [job], 20.0, bounds).allowed == allowed  # no progress since 20
        assert silence(link, [job], 5.0, bounds).allowed == FLOOR_GPU  # progress at 10


def test_a_worker_that_said_its_step_is_of_a_new_shape_has_the_ceiling_until_that_step():
    """`Shaping` comes before a verify step whose number of positions a row the worker has
    not run: MLX builds its kernels first (on the H200, seconds, taken for a hang before).
    The line marks it, without counting it as progress, and its next step ends it."""
    import asyncio
    from types import SimpleNamespace

    from steward.supervisor.link import WorkerLink
    from steward.supervisor.silence import silence
    from steward.wire.protocol import Shaping, Step

    bounds = measured(StepClock(1, 0, 0.01, new_shape=True), StepClock(1, 0, 0.01))
    job = SimpleNamespace(started=True, prefill=0, prompt_chars=0)

    class Worker:  # what the line reads from: the messages a test puts
        pid, exitcode = 1, None

        def __init__(self) -> None:
            self.said: asyncio.Queue = asyncio.Queue()

        async def recv(self):
            return await self.said.get()

    async def told(link: WorkerLink, worker: Worker, msg) -> None:
        await worker.said.put(msg)
        while not worker.said.empty():
            await asyncio.sleep(0)
        await asyncio.sleep(0)  # the line routes what it read

    async def main() -> None:
        worker = Worker()
        link = WorkerLink(worker, 1)
        await told(link, worker, Step(clock=StepClock(1, 0, 0.01)))
        stepped = link.progress
        assert silence(link, [job], 0.0, bounds).allowed == FLOOR_GPU
        await told(link, worker, Shaping())
        assert link.shaping and link.progress == stepped  # no progress: a step to come
        assert silence(link, [job], 0.0, bounds).allowed == CEILING
        await told(link, worker, Step(clock=StepClock(1, 0, 3.0, new_shape=True)))
        assert not link.shaping and link.progress > stepped
        assert silence(link, [job], 0.0, bounds).allowed == FLOOR_GPU
        link._pump.cancel()

    asyncio.run(main())

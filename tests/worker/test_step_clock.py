"""The step clock: every `Step` the batch loop sends for an engine step says what the step
was (rows decoding, prompt tokens prefilled, a shape new to the worker) and how long it kept
the link silent on the worker's own clock, alone or in a batch; a `Step` that only announces
admissions says nothing of a step."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from steward.wire.protocol import FromWorker, Step, StepClock
from tests.worker.test_admitted import ask, serve


@pytest.fixture(scope="module")
def backend(tiny_model: Path):
    from steward.worker.backend import Backend
    from steward.worker.injection import Injector

    return Backend(tiny_model, Injector([], 1))


@pytest.fixture
def engine(backend):
    """A fresh engine: every shape is new to it."""
    from steward.worker.engine import Engine

    return Engine(backend, 8, 0)


def stepped(sent: list[FromWorker]) -> list[tuple[Step, StepClock]]:
    """The engine steps sent, with their clocks; admissions carry none."""
    steps = [msg for msg in sent if isinstance(msg, Step)]
    assert all(step.clock is None for step in steps if step.admitted)
    found = [(step, step.clock) for step in steps if not step.admitted]
    assert all(clock is not None and clock.seconds > 0 for _, clock in found)
    return found  # type: ignore[return-value]


def timed(engine, reqs: list) -> tuple[list[tuple[Step, StepClock]], float]:
    started = time.perf_counter()
    sent = serve(engine, reqs)
    return stepped(sent), time.perf_counter() - started


def test_a_request_alone_clocks_its_prefill_chunks_and_each_token(engine) -> None:
    prompt = "The tide came in over the flats " * 150
    size = len(engine.backend.tokenizer.encode(prompt))
    assert size > 2 * 512  # several chunks
    steps, wall = timed(engine, [ask(1, prompt, ignore_eos=True)])
    prefill = [clock for step, clock in steps if step.prefilled]
    decode = [clock for step, clock in steps if step.tokens]
    assert len(prefill) + len(decode) == len(steps)
    assert [c.members for c in prefill] == [0] * len(prefill)
    assert sum(c.prefill for c in prefill) == size - 1  # the last token is the first decode's
    assert [c.new_shape for c in prefill] == [True] + [False] * (len(prefill) - 1)
    assert {c.chunk for c in prefill} == {512}
    assert [(c.members, c.prefill, c.new_shape) for c in decode] == [
        (1, 0, True),
        (1, 0, False),
        (1, 0, False),
        (1, 0, False),
    ]
    assert sum(c.seconds for _, c in steps) <= wall


def test_a_batch_clocks_its_members_and_its_prefill(engine) -> None:
    prompts = ["A lighthouse keeper " * 200, "Once upon a time", "A quiet harbour at dawn " * 40]
    sizes = [len(engine.backend.tokenizer.encode(p)) for p in prompts]
    reqs = [ask(i + 1, p, ignore_eos=True, max_tokens=6) for i, p in enumerate(prompts)]
    steps, wall = timed(engine, reqs)
    assert sum(clock.prefill for _, clock in steps) == sum(size - 1 for size in sizes)
    for step, clock in steps:
        assert clock.members == len(step.tokens)  # every row decoding gave a token
        assert clock.chunk >= 512 and clock.chunk & (clock.chunk - 1) == 0
    assert max(clock.members for _, clock in steps) == 3
    decoding = [clock for _, clock in steps if clock.prefill == 0]
    for members in {clock.members for clock in decoding}:
        news = [clock.new_shape for clock in decoding if clock.members == members]
        assert news == [True] + [False] * (len(news) - 1)  # a width met before is not new
    assert sum(clock.seconds for _, clock in steps) <= wall

"""A first worker measuring its calibration between requests (calibrating.py), on the CPU
with the tiny model and a real engine: measured to the end it is kept and taken; a request
that comes mid-run stops it between two steps, is answered as if nothing had been
measured, finds the prompt cache as it was, and the measuring resumes, keeping the widths
already timed."""

from __future__ import annotations

from pathlib import Path

import pytest

from steward.wire.protocol import Calibration, Generate


@pytest.fixture(scope="module")
def backend(tiny_model: Path):
    from steward.worker.backend import Backend
    from steward.worker.injection import Injector

    return Backend(tiny_model, Injector([], 1))


def engine(backend, width: int = 4):
    from steward.worker.engine import Engine

    return Engine(backend, width, 1 << 24)


def ask(engine, i: int) -> list[int]:
    """A client's greedy answer, alone in the engine."""
    request = Generate(id=i, seq=i, attempt=1, max_tokens=6, prompt=f"Question {i}: why?")
    engine.add(request)
    tokens = []
    while engine.busy:
        tokens += [t.token for t in engine.step().tokens]
    return tokens


def calibrating(eng, kept: list[Calibration]):
    from steward.worker.calibrating import Calibrating

    return Calibrating(eng, fit=16, chosen=0, keep=kept.append)


def test_measured_to_the_end_it_is_kept_and_taken(backend) -> None:
    eng, kept = engine(backend), []
    measuring = calibrating(eng, kept)
    results = []
    while not measuring.done:
        results.append(measuring.step())
    result = results.pop()
    assert all(r is None for r in results) and result == measuring.result
    assert kept == [result] and not eng.busy
    assert result.max_batch in (8, 16) and result.prefill_tps > 0
    assert eng.max_batch == result.max_batch and set(measuring.speeds) <= {8, 16}


def test_a_request_stops_the_run_and_is_answered_as_without_it(backend) -> None:
    alone = ask(engine(backend), 1)
    eng, kept = engine(backend), []
    ask(eng, 2)  # a conversation the prompt cache holds
    cache, held = eng.cache, eng.cache.nbytes
    measuring = calibrating(eng, kept)
    while 8 not in measuring.speeds:
        assert measuring.step() is None
    measuring.step()  # into the next width's run
    assert measuring.active and eng.busy
    measuring.stop()  # a request came
    assert not measuring.active and not eng.busy and not eng.members
    assert eng.cache is cache and cache.nbytes >= held > 0  # the conversation is still held
    assert ask(eng, 1) == alone
    while not measuring.done:
        measuring.step()
    assert 8 in measuring.speeds and kept == [measuring.result]


def test_out_of_patience_what_was_measured_serves_and_is_not_kept(backend) -> None:
    eng, kept = engine(backend), []
    measuring = calibrating(eng, kept)
    while 8 not in measuring.speeds:
        measuring.step()
    result = measuring.finish()
    assert result.max_batch == 8 and result.prefill_tps == 0.0 and kept == []
    assert not eng.busy and eng.max_batch == 8


def test_the_worker_loop_measures_when_idle_answers_a_request_and_says_calibrated(
    backend,
) -> None:
    """The batch loop itself (main.serve_batched): it measures while its inbox is empty, a
    request that comes is answered as an engine alone answers it, and once measured it
    sends `Calibrated` with what it now serves by."""
    import threading
    import time

    from steward.wire.protocol import Calibrated, Step
    from steward.worker.inbox import Inbox
    from steward.worker.main import serve_batched

    alone = ask(engine(backend), 1)
    eng, kept = engine(backend), []
    measuring = calibrating(eng, kept)
    inbox, sent = Inbox(), []
    loop = threading.Thread(target=serve_batched, args=(eng, inbox, sent.append, measuring))
    loop.start()
    try:
        deadline = time.monotonic() + 60
        while not measuring.active and time.monotonic() < deadline:
            time.sleep(0.01)
        assert measuring.active  # idle: it measures
        inbox.put(Generate(id=1, seq=1, attempt=1, max_tokens=6, prompt="Question 1: why?"))
        while not any(isinstance(m, Calibrated) for m in sent) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        inbox.put(None)
        loop.join(30)
    tokens = [t.token for m in sent if isinstance(m, Step) for t in m.tokens if t.id == 1]
    assert tokens == alone
    done = next(i for i, m in enumerate(sent) if isinstance(m, Step) and m.done)
    assert not any(isinstance(m, Calibrated) for m in sent[:done])  # it came mid-measuring
    (calibrated,) = [m for m in sent if isinstance(m, Calibrated)]
    assert calibrated.calibration == measuring.result == kept[0]
    assert eng.max_batch == calibrated.calibration.max_batch

"""The warm-up's runs (warmup.py), which a worker makes only on a GPU, made here on the CPU
with the tiny model: the measuring runs stop once the knee is passed and time the prefill
speed, a later worker's run meets its whole width and a chunk, and each leaves the engine
empty, its shapes met."""

from __future__ import annotations

from pathlib import Path

import pytest

from steward.wire.protocol import Calibration
from steward.worker import width


@pytest.fixture(scope="module")
def backend(tiny_model: Path):
    from steward.worker.backend import Backend
    from steward.worker.injection import Injector

    return Backend(tiny_model, Injector([], 1))


def test_the_measuring_runs_time_widths_up_to_the_knee_and_the_prefill_speed(backend) -> None:
    from steward.worker import warmup
    from steward.worker.engine import Engine

    engine = Engine(backend, width.CEILING, 1 << 20)
    widths, speeds = [2, 4, 8], {}
    steps = sum(1 for _ in warmup.widths(engine, widths, speeds))  # one engine step each
    assert steps > len(widths) and speeds and list(speeds) == widths[: len(speeds)]
    assert speeds.keys() == set(widths) or width.passed(speeds)  # stopped once past the knee
    assert not engine.busy and (False, max(speeds), 1, 0, 0) in engine.shapes
    engine.widen(4)
    for _ in warmup.prefill(engine):
        pass
    assert engine.chunks.rate > 0 and not engine.busy


def test_a_later_worker_runs_its_width_and_a_chunk(backend) -> None:
    from steward.worker import warmup
    from steward.worker.engine import Engine

    engine = Engine(backend, 4, 1 << 20)
    engine.calibrate(Calibration(4, 1000.0, 512))
    warmup.shapes(engine)
    assert not engine.busy and not engine.members
    assert (False, 4, 1, 0, 0) in engine.shapes  # the whole width decoded
    assert any(prompts == 1 and chunk == 512 for _, _, _, prompts, chunk in engine.shapes)

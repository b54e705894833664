"""The worker's engine in process, on the tiny model: resuming an answer gives the tokens
an unfaulted run gives, whatever the prompt cache holds and whoever else is in the batch."""

from __future__ import annotations

from pathlib import Path

import pytest

from steward.worker.protocol import Generate


@pytest.fixture(scope="module")
def engine(tiny_model: Path):
    from steward.worker.backend import Backend
    from steward.worker.engine import Engine
    from steward.worker.injection import Injector

    return Engine(Backend(tiny_model, Injector([], 1)), 32, 1 << 30)


def run(engine, req: Generate, joiner: Generate | None = None) -> list[int]:
    """The token ids `req` gets; `joiner` joins the batch after two steps."""
    engine.add(req)
    tokens, steps = [], 0
    while engine.busy:
        if joiner is not None and steps == 2:
            engine.add(joiner)
        step = engine.step()
        steps += 1
        tokens += [t.token for t in step.tokens if t.id == req.id and t.token >= 0]
    return tokens


@pytest.mark.parametrize("seed", [None, 7])
@pytest.mark.parametrize("cut", [1, 10, 25])
def test_a_resumed_answer_continues_exactly(engine, seed: int | None, cut: int) -> None:
    sampling = {"temperature": 0.0} if seed is None else {"temperature": 1.0, "seed": seed}
    ask = {"seq": 1, "max_tokens": 40, "prompt": "Once upon a time", **sampling}
    whole = run(engine, Generate(id=1, attempt=1, **ask))  # fills the prompt cache too
    assert len(whole) == 40
    again = Generate(id=2, attempt=2, resume=whole[:cut], **ask)
    assert run(engine, again) == whole[cut:]  # the cache holds more than the prompt
    other = Generate(id=4, seq=4, attempt=1, max_tokens=8, prompt="hello")
    batched = Generate(id=3, attempt=2, resume=whole[:cut], **ask)
    assert run(engine, batched, joiner=other) == whole[cut:]

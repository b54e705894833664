"""The worker's engine in process, on the tiny model: resuming an answer gives the tokens
an unfaulted run gives, whatever the prompt cache holds and whoever else is in the batch."""

from __future__ import annotations

import time
from collections import deque
from pathlib import Path
from typing import Any

import llguidance
import pytest

from steward.front.structured import grammar as compile_schema
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


def run_together(engine, reqs: list[Generate]) -> tuple[dict[int, list[int]], dict[int, Any]]:
    """Each request's token ids and `Done`, all in one batch."""
    tokens: dict[int, list[int]] = {req.id: [] for req in reqs}
    dones = {}
    for req in reqs:
        engine.add(req)
    while engine.busy:
        step = engine.step()
        for token in step.tokens:
            if token.token >= 0:
                tokens[token.id].append(token.token)
        dones |= {done.id: done for done in step.done}
    return tokens, dones


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


def test_identical_prompts_prefill_once_and_answer_as_alone(engine) -> None:
    """`n` choices reach the worker as identical requests: one prefills, the others join
    with a copy of its cache, and each answers as it would alone."""
    ask = {"seq": 1, "attempt": 1, "max_tokens": 12, "prompt": "A lighthouse keeper " * 20}
    seeds = [None, 3, 4, 5]
    alone = [
        run(engine, Generate(id=10 + i, seed=s, temperature=1.0 if s else 0.0, **ask))
        for i, s in enumerate(seeds)
    ]
    cache, engine.cache = engine.cache, None  # only sharing can skip a prefill now
    try:
        together = [
            Generate(id=20 + i, seed=s, temperature=1.0 if s else 0.0, **ask)
            for i, s in enumerate(seeds)
        ]
        tokens, dones = run_together(engine, together)
    finally:
        engine.cache = cache
    assert [tokens[req.id] for req in together] == alone
    prompt = dones[20].prompt_tokens
    assert dones[20].cached_tokens == 0
    assert [dones[req.id].cached_tokens for req in together[1:]] == [prompt - 1] * 3


def spied_paths(monkeypatch, step, slow: bool | None = None) -> list[bool]:
    """Each armed step's path as `BatchStep` starts its masks (True: the thread), the `slow`
    one made 20 ms slower."""
    paths: list[bool] = []
    start = step._start

    def spied(armed, threaded: bool) -> None:
        paths.append(threaded)
        if threaded == slow:
            time.sleep(0.02)
        start(armed, threaded)

    monkeypatch.setattr(step, "_start", spied)
    return paths


@pytest.mark.parametrize("threaded", [True, False])
def test_a_constrained_batch_answers_as_alone_whichever_path_masks_it(
    engine, monkeypatch, threaded: bool
) -> None:
    """In a batch the masks are computed on a thread while the model call is built, or
    after it when the device is the bottleneck (`BatchStep`): either way each member
    samples exactly what it samples alone, and only what its schema allows."""
    schema = {"type": "object", "properties": {"w": {"type": "array", "items": {"type": "string"}}}}
    grammar = compile_schema(schema, "test")

    def asks(first: int) -> list[Generate]:
        return [
            Generate(
                id=first + i,
                seq=1,
                attempt=1,
                max_tokens=16,
                prompt=f"question {i}",
                temperature=1.0,
                seed=i,
                grammar=grammar,
            )
            for i in range(4)
        ]

    alone = [run(engine, req) for req in asks(30)]
    step = engine.backend.batch_step
    paths = spied_paths(monkeypatch, step)
    monkeypatch.setattr(step, "fixed", threaded)
    tokens, _ = run_together(engine, asks(40))
    # (a step right after a prompt's chunk masks late on either path: `behind`)
    assert paths.count(threaded) >= 10 and (threaded or True not in paths)
    assert [tokens[40 + i] for i in range(4)] == alone
    tokenizer = engine.backend.grammars.tokenizer
    for answer in alone:
        assert llguidance.LLMatcher(tokenizer, grammar).consume_tokens(answer)


@pytest.mark.parametrize("slow", [True, False])
def test_a_constrained_batch_takes_the_path_its_steps_measure_faster(
    engine, monkeypatch, slow: bool
) -> None:
    """`BatchStep` times each path's steps and takes the faster: with one path made 20 ms
    slower, nearly every step takes the other, and it is tried again every `PROBE` steps."""
    from steward.worker.grammar import PROBE, TRIES

    words = {"type": "array", "items": {"type": "string"}, "minItems": 40}  # runs to length
    schema = {"type": "object", "properties": {"w": words}, "required": ["w"]}
    grammar = compile_schema(schema, "test")
    step = engine.backend.batch_step
    fresh = {path: deque(maxlen=TRIES) for path in (True, False)}
    for name, value in (("spent", fresh), ("steps", 0), ("last", None)):  # nothing measured
        monkeypatch.setattr(step, name, value)
    paths = spied_paths(monkeypatch, step, slow)
    tokens = PROBE + 2 * TRIES  # one try of the slow path after the first ones
    asks = [
        Generate(id=50 + i, seq=1, attempt=1, max_tokens=tokens, prompt=f"q {i}", grammar=grammar)
        for i in range(4)
    ]
    answers, _ = run_together(engine, asks)
    assert all(len(answers[req.id]) == tokens for req in asks)
    assert len(paths) >= PROBE and TRIES <= paths.count(slow) <= 2 * TRIES + 2

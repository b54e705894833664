"""The worker's engine in process, on the tiny model: resuming an answer gives the tokens
an unfaulted run gives, whatever the prompt cache holds and whoever else is in the batch."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import llguidance
import pytest

from steward.front.structured import grammar as compile_schema
from steward.wire.protocol import Generate
from steward.worker.toolcalls import ToolCalls


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


def test_a_constrained_batch_answers_as_alone_its_grammars_fed_on_their_thread(
    engine, monkeypatch
) -> None:
    """Alone or in a batch, the grammars are fed and the masks computed on the grammar
    thread while the model call is launched (`grammar.launched`): each member of a batch
    samples exactly what it samples alone, and only what its schema allows."""
    from steward.worker.grammar import Grammar

    schema = {"type": "object", "properties": {"w": {"type": "array", "items": {"type": "string"}}}}
    grammar = compile_schema(schema, "test")
    threads: list[str] = []
    accept = Grammar.accept

    def spied(self, token: int) -> bool:
        threads.append(threading.current_thread().name)
        return accept(self, token)

    monkeypatch.setattr(Grammar, "accept", spied)

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
    tokens, _ = run_together(engine, asks(40))
    assert [tokens[40 + i] for i in range(4)] == alone
    assert len(threads) >= 20 and all(name.startswith("grammar") for name in threads)
    tokenizer = engine.backend.grammars.tokenizer
    for answer in alone:
        assert llguidance.LLMatcher(tokenizer, grammar).consume_tokens(answer)


def test_a_forced_call_resumed_inside_its_arguments_joins_up(engine) -> None:
    """A `required` call's answer cut inside its arguments (a fault after those tokens were
    sent) and resumed: the deltas sent before and after join to the unfaulted call."""
    from steward.front.structured import _call_schema

    city = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
        "additionalProperties": False,
    }
    calls = {"type": "array", "minItems": 1, "maxItems": 1, "items": _call_schema("f", city)}
    ask = {"seq": 1, "attempt": 1, "max_tokens": 40, "prompt": "q", "calls": "list"}
    ask["grammar"] = compile_schema(calls, "test")

    def deltas(req: Generate) -> tuple[list[int], list, str]:
        engine.add(req)
        ids, found, finish = [], [], ""
        while engine.busy:
            step = engine.step()
            for token in step.tokens:
                ids += [token.token] if token.token >= 0 else []
                found += token.calls
            finish = next((done.finish_reason for done in step.done), finish)
        return ids, found, finish

    whole, sent, finish = deltas(Generate(id=60, **ask))
    assert finish == "tool_calls"
    joined = "".join(d.arguments for d in sent)
    cut = next(i for i in range(len(whole)) if "city" in decoded(engine, whole[:i]))
    before = ToolCalls("list")  # what the client was sent before the fault
    _, early = before.feed(decoded(engine, whole[:cut]))
    _, late, finish = deltas(Generate(id=61, resume=whole[:cut], **ask))
    assert finish == "tool_calls" and [d.name for d in early + late if d.name] == ["f"]
    assert "".join(d.arguments for d in early + late) == joined
    assert "city" in "".join(d.arguments for d in early)  # cut inside the arguments


def decoded(engine, ids: list[int]) -> str:
    return engine.backend.tokenizer.decode(ids)

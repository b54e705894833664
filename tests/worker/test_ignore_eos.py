"""`ignore_eos` (the canary's): end tokens are never sampled, so exactly `max_tokens` tokens
come, on every path: a request alone, a batch, a vision model's loop. On a model whose greedy
answer is its end token at once, it is the only way to get tokens from it."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from steward.wire.protocol import Done, Generate
from steward.worker.injection import Injector


@pytest.fixture(scope="module")
def eos_model(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> Path:
    from tests.tinymodel import build_eos_model

    return build_eos_model(tmp_path_factory.mktemp("eos") / "eos", default_model_dir)


@pytest.fixture(scope="module")
def engine(eos_model: Path):
    from steward.worker.backend import Backend
    from steward.worker.engine import Engine

    return Engine(Backend(eos_model, Injector([], 1)), 8, 1 << 30)


def answers(engine, reqs: list[Generate], joiner: Generate | None = None):
    """Each request's token ids and `Done`, all in one batch; `joiner` joins after two steps
    (the first request alone is handed over to the batch then)."""
    tokens: dict[int, list[int]] = defaultdict(list)
    dones: dict[int, Done] = {}
    for req in reqs:
        engine.add(req)
    steps = 0
    while engine.busy:
        if joiner is not None and steps == 2:
            engine.add(joiner)
        step = engine.step()
        steps += 1
        for token in step.tokens:
            assert token.token not in engine.eos
            if token.token >= 0:
                tokens[token.id].append(token.token)
        dones |= {done.id: done for done in step.done}
    return tokens, dones


def ask(req_id: int, ignore_eos: bool, **more) -> Generate:
    return Generate(
        id=req_id,
        seq=req_id,
        attempt=1,
        max_tokens=8,
        prompt="The capital of France is",
        ignore_eos=ignore_eos,
        **more,
    )


def test_the_eos_model_answers_nothing_unless_its_end_is_suppressed(engine) -> None:
    tokens, dones = answers(engine, [ask(1, ignore_eos=False)])
    assert tokens[1] == [] and dones[1].finish_reason == "stop"
    assert dones[1].completion_tokens == 0
    tokens, dones = answers(engine, [ask(2, ignore_eos=True)])  # alone (solo.py)
    assert len(tokens[2]) == 8 and dones[2].finish_reason == "length"
    assert dones[2].completion_tokens == 8


def test_in_a_batch_each_member_keeps_its_own_end_rule(engine) -> None:
    tokens, _ = answers(engine, [ask(3, ignore_eos=True)])
    alone = tokens[3]
    reqs = [ask(4, ignore_eos=True), ask(5, ignore_eos=False), ask(6, ignore_eos=True, seed=1)]
    tokens, dones = answers(engine, reqs)
    assert tokens[4] == alone and tokens[5] == [] and len(tokens[6]) == 8
    assert [dones[i].finish_reason for i in (4, 5, 6)] == ["length", "stop", "length"]
    # Alone, then handed over to the batch when another request joins: still 8 tokens.
    tokens, dones = answers(engine, [ask(7, ignore_eos=True)], joiner=ask(8, ignore_eos=True))
    assert tokens[7] == alone and tokens[8] == alone
    assert dones[7].finish_reason == dones[8].finish_reason == "length"


def test_a_bias_toward_the_end_token_does_not_beat_its_suppression(engine) -> None:
    """The suppression is a bias of -inf, above any `logit_bias` a request gives."""
    (eos,) = engine.eos
    tokens, dones = answers(engine, [ask(9, ignore_eos=True, logit_bias={eos: 100.0})])
    assert len(tokens[9]) == 8 and dones[9].finish_reason == "length"


def test_a_vision_model_generates_to_max_tokens_with_its_end_suppressed(
    tmp_path: Path, default_model_dir: Path
) -> None:
    """mlx-vlm's loop stops on its own end tokens: suppressed, none is ever sampled. (The
    tiny VLM never ends of itself: a bias toward every end token makes it end at once.)"""
    pytest.importorskip("mlx_vlm")
    from steward.worker.vision import VisionBackend
    from tests.tinyvlm import build_tiny_vlm

    backend = VisionBackend(build_tiny_vlm(tmp_path / "vlm", default_model_dir), Injector([], 1))
    bias = dict.fromkeys(backend.end_tokens, 100.0)
    for ignore_eos, count, finish in [(False, 0, "stop"), (True, 4, "length")]:
        req = Generate(
            id=1,
            seq=1,
            attempt=1,
            max_tokens=4,
            messages=[{"role": "user", "content": "Hi"}],
            logit_bias=bias,
            ignore_eos=ignore_eos,
        )
        sent = []
        done = backend.generate(req, sent.append, lambda: False)
        assert isinstance(done, Done)
        assert (done.completion_tokens, done.finish_reason) == (count, finish)
        assert len([t for step in sent for t in step.tokens if t.token >= 0]) == count

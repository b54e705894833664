"""Admissions: the worker announces each request it takes in, with the prompt tokens it will
prefill, before that prefill begins (one `Step` for all taken in one pass), and reports the
prefill's progress chunk by chunk, so the front can tell a long prefill from a hang."""

from __future__ import annotations

from pathlib import Path

import pytest

from steward.wire.faultspec import parse
from steward.wire.protocol import Admitted, Done, Failed, FromWorker, Generate, Step
from steward.worker.inbox import Inbox
from steward.worker.injection import Injector
from steward.worker.main import serve_batched


@pytest.fixture(scope="module")
def engine(tiny_model: Path):
    from steward.worker.backend import Backend
    from steward.worker.engine import Engine

    return Engine(Backend(tiny_model, Injector([], 1)), 8, 1 << 30)


def serve(engine, reqs: list[Generate]) -> list[FromWorker]:
    """What the batch loop sends for `reqs`, all waiting in its inbox when it starts; it is
    told to stop once each has ended."""
    inbox = Inbox()
    for req in reqs:
        inbox.put(req)
    sent: list[FromWorker] = []
    left = {req.id for req in reqs}

    def send(msg: FromWorker) -> None:
        sent.append(msg)
        ended = msg.ids if isinstance(msg, Failed) else []
        ended += [done.id for done in msg.done] if isinstance(msg, Step) else []
        left.difference_update(ended)
        if not left:
            inbox.put(None)

    serve_batched(engine, inbox, send)
    return sent


def ask(req_id: int, prompt: str, **more) -> Generate:
    return Generate(
        **{"id": req_id, "seq": req_id, "attempt": 1, "max_tokens": 4} | more, prompt=prompt
    )


def admissions(sent: list[FromWorker]) -> list[list[Admitted]]:
    return [msg.admitted for msg in sent if isinstance(msg, Step) and msg.admitted]


def first_news(sent: list[FromWorker], req_id: int) -> int:
    """The index of the first message that says anything of `req_id` but its admission."""
    return next(
        i
        for i, msg in enumerate(sent)
        if isinstance(msg, Step)
        and (req_id in msg.prefilled or any(t.id == req_id for t in msg.tokens))
    )


def test_requests_taken_in_together_are_admitted_in_one_step_before_their_prefill(
    engine,
) -> None:
    tokenizer = engine.backend.tokenizer
    prompts = ["A lighthouse keeper " * 400, "Once upon a time"]
    sizes = [len(tokenizer.encode(p)) for p in prompts]
    assert sizes[0] > 2 * 512  # several prefill chunks
    sent = serve(engine, [ask(1, prompts[0]), ask(2, prompts[1])])
    assert admissions(sent) == [[Admitted(1, sizes[0]), Admitted(2, sizes[1])]]
    admitted_at = next(i for i, msg in enumerate(sent) if isinstance(msg, Step) and msg.admitted)
    assert admitted_at < min(first_news(sent, 1), first_news(sent, 2))
    chunks = sum(1 for msg in sent if isinstance(msg, Step) and 1 in msg.prefilled)
    assert chunks >= sizes[0] // 512  # progress at every chunk, not once at the end
    assert {d.id: d.completion_tokens for m in sent if isinstance(m, Step) for d in m.done} == {
        1: 4,
        2: 4,
    }


def test_a_request_alone_reports_every_prefill_chunk(engine) -> None:
    prompt = "The tide came in over the flats " * 200
    size = len(engine.backend.tokenizer.encode(prompt))
    sent = serve(engine, [ask(3, prompt)])
    assert admissions(sent) == [[Admitted(3, size)]]
    chunks = sum(1 for msg in sent if isinstance(msg, Step) and 3 in msg.prefilled)
    assert chunks == -(-(size - 1) // 512)  # solo.py: every chunk but the last token's


def test_the_prompt_cache_and_a_resumed_answer_count_in_the_prefill(engine) -> None:
    prompt = "A quiet harbour at dawn, " * 20
    size = len(engine.backend.tokenizer.encode(prompt))
    (done,) = [d for m in serve(engine, [ask(4, prompt)]) if isinstance(m, Step) for d in m.done]
    assert isinstance(done, Done)
    # The same prompt again: all of it is cached but its last token, whose logits come anew.
    assert admissions(serve(engine, [ask(5, prompt)])) == [[Admitted(5, 1)]]
    # The canary always computes afresh; a resumed answer prefills its tokens too.
    canary = ask(-1, prompt, ignore_eos=True, internal=True)
    assert admissions(serve(engine, [canary])) == [[Admitted(-1, size)]]
    resumed = ask(-2, prompt, resume=[11, 12, 13], max_tokens=6, internal=True)
    assert admissions(serve(engine, [resumed])) == [[Admitted(-2, size + 3)]]


def test_a_fault_while_taking_requests_in_admits_none_of_them(
    engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fault fails every member (`Failed`): none is announced after it."""
    faults = Injector([parse("prefill:raise:marker=POISON")], 1)
    monkeypatch.setattr(engine.backend, "injector", faults)
    sent = serve(engine, [ask(6, "innocent"), ask(7, "POISON")])
    assert [type(msg) for msg in sent] == [Failed]
    assert sorted(sent[0].ids) == [6, 7]


def test_a_vision_request_is_admitted_before_its_prefill(
    tmp_path: Path, default_model_dir: Path
) -> None:
    """mlx-vlm prefills the prompt whole: its admission (with the image tokens counted)
    comes once preprocessing is done, then the tokens."""
    pytest.importorskip("mlx_vlm")
    from steward.worker.vision import VisionBackend
    from tests.tinyvlm import build_tiny_vlm

    backend = VisionBackend(build_tiny_vlm(tmp_path / "vlm", default_model_dir), Injector([], 1))
    req = Generate(id=8, seq=8, attempt=1, max_tokens=3, prompt="Once upon a time", resume=[11, 12])
    size = int(backend.prepare(req).input_ids.size)
    sent: list[Step] = []
    done = backend.generate(req, sent.append, lambda: False)
    assert isinstance(done, Done) and done.completion_tokens == 3
    assert sent[0].admitted == [Admitted(8, size + 2)] and sent[0].prefilled == [8]
    assert all(not step.admitted for step in sent[1:])

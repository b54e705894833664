"""Output processing apart from the step (outputs.py), on the tiny model through the
worker's own loop and output thread: a stop string ends the answer at the token it ends on
as before, nothing after it is sent, usage counts the tokens up to it, and its row leaves
the batch at the next step."""

from __future__ import annotations

from pathlib import Path

import pytest

from steward.wire.protocol import Done, FromWorker, Generate, Step
from steward.worker.inbox import Inbox
from steward.worker.main import serve_batched


@pytest.fixture(scope="module")
def engine(tiny_model: Path):
    from steward.worker.backend import Backend
    from steward.worker.engine import Engine
    from steward.worker.injection import Injector

    return Engine(Backend(tiny_model, Injector([], 1)), 8, 0)


def served(engine, reqs: list[Generate]) -> tuple[dict[int, list], dict[int, Done]]:
    """Each request's tokens (real ones: id, text) and `Done`, from the worker's loop."""
    inbox = Inbox()
    for req in reqs:
        inbox.put(req)
    tokens: dict[int, list] = {req.id: [] for req in reqs}
    dones: dict[int, Done] = {}

    def send(msg: FromWorker) -> None:
        if isinstance(msg, Step):
            for token in msg.tokens:
                assert token.id not in dones, "a token after its answer's end"
                tokens[token.id].append((token.token, token.text))
            dones.update({done.id: done for done in msg.done})
        if len(dones) == len(reqs):
            inbox.put(None)

    serve_batched(engine, inbox, send)
    return tokens, dones


def ask(req_id: int, **more) -> Generate:
    asked = {"max_tokens": 24, "prompt": "Once upon a time"} | more
    return Generate(id=req_id, seq=req_id, attempt=1, **asked)


@pytest.mark.parametrize("together", [False, True], ids=["alone", "batched"])
def test_a_stop_string_ends_the_answer_at_its_token(engine, together: bool) -> None:
    beside = [ask(9, prompt="Numbers: 1, 2")] if together else []
    full, _ = served(engine, [ask(1), *beside])
    text = [piece for _, piece in full[1]]
    cut = next(i for i in range(6, len(text)) if text[i].strip())  # a token with text
    stop = text[cut].strip()
    first = next(i for i in range(len(text)) if stop in "".join(text[: i + 1]))
    tokens, dones = served(engine, [ask(2, stop=[stop]), *beside])
    sent = [token for token, _ in tokens[2] if token >= 0]
    assert sent == [token for token, _ in full[1][: first + 1]]  # up to the stop's token
    assert stop not in "".join(piece for _, piece in tokens[2])
    done = dones[2]
    assert (done.finish_reason, done.stop_sequence) == ("stop", stop)
    assert done.completion_tokens == first + 1
    assert not engine.busy and not engine.members


def test_a_row_whose_text_ended_leaves_at_the_next_step(engine) -> None:
    full, _ = served(engine, [ask(3)])
    text = [piece for _, piece in full[3]]
    stop = next(piece.strip() for piece in text[4:] if piece.strip())
    engine.add(ask(4, stop=[stop]))
    engine.add(ask(5))  # two: the batch, not a request alone
    while not (step := engine.step()).done:
        pass
    assert [done.id for done in step.done] == [4]
    assert 4 in engine.uids  # its text ended after the step drew its token
    engine.step()
    assert 4 not in engine.uids
    engine.drop_all()

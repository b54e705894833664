"""The worker's inbox: requests encoded side by side, messages taken in the order they came,
a request still encoding holding the ones behind it."""

from __future__ import annotations

import threading
import time

from steward.wire.protocol import Cancel, Generate
from steward.worker.inbox import Inbox


def request(req_id: int, prompt: str) -> Generate:
    return Generate(id=req_id, seq=req_id, attempt=1, max_tokens=4, prompt=prompt)


def slow(
    seconds: dict[str, float],
    release: threading.Event | None = None,
    encoded: threading.Event | None = None,
):
    """An encoder taking `seconds[prompt]`, or until `release` for the prompt "held";
    `encoded` is set once a prompt other than "held" is encoded."""

    def encode(req: Generate) -> tuple[int, str]:
        if req.prompt == "held" and release is not None:
            release.wait(10)
        time.sleep(seconds.get(req.prompt or "", 0.0))
        if req.prompt != "held" and encoded is not None:
            encoded.set()
        return req.id, "encoded"

    return encode


def test_a_request_still_encoding_holds_its_cancel_and_everything_after() -> None:
    release, quick = threading.Event(), threading.Event()
    inbox = Inbox(slow({}, release, quick))
    inbox.put(request(1, "held"), request=True)
    inbox.put(Cancel(1))
    inbox.put(request(2, "quick"), request=True)
    assert quick.wait(10)  # the quick one is encoded
    assert inbox.take(wait=False) == []
    release.set()
    taken = inbox.take(wait=True)
    while len(taken) < 3:
        taken += inbox.take(wait=True)
    assert taken == [(1, "encoded"), Cancel(1), (2, "encoded")]


def test_long_prompts_encode_side_by_side_and_a_short_one_after_waits_for_the_slowest() -> None:
    inbox = Inbox(slow({"long": 0.3}))
    started = time.perf_counter()
    for i in range(3):
        inbox.put(request(i, "long"), request=True)
    inbox.put(request(3, "short"), request=True)
    taken: list = []
    while len(taken) < 4:
        taken += inbox.take(wait=True)
    assert time.perf_counter() - started < 0.6  # not 0.9: one after another
    assert taken == [(i, "encoded") for i in range(4)]


def test_without_an_encoder_messages_pass_as_they_came() -> None:
    inbox = Inbox()
    for msg in (request(1, "a"), Cancel(1), None):
        inbox.put(msg, request=isinstance(msg, Generate))
    assert inbox.get() == request(1, "a")
    assert inbox.take(wait=False) == [Cancel(1), None]

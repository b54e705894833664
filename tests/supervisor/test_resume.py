"""Resumed streams (SPEC §3, §4): a stream that already sent tokens when the backend faulted
continues on the recovered backend from exactly the tokens sent, and the client sees one
unbroken stream ending in `[DONE]`, usage counted once, greedy text equal to an unfaulted
run's. Only when resuming is impossible (here: quarantine) does an error event end it.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

CHAT = [{"role": "user", "content": "Tell me about lighthouses."}]


def stream(
    url: str,
    content: str = CHAT[0]["content"],
    max_tokens: int = 16,
    started: threading.Event | None = None,
    **extra: Any,
) -> dict:
    """The streamed answer as the client saw it: text, events, finish, usage, errors, and
    the longest wait between two of its events (`gap`); `started` is set at its first
    event; `extra`: more of the body."""
    body = {
        **extra,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    seen = {"text": "", "done": False, "errors": [], "finish": None, "usage": None, "gap": 0.0}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        last = None
        for line in r.iter_lines():
            if line.startswith("data: "):
                if started is not None:
                    started.set()
                now = time.monotonic()
                seen["gap"] = max(seen["gap"], now - (last or now))
                last = now
            if line == "data: [DONE]":
                seen["done"] = True
            elif line.startswith("data: "):
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    seen["errors"].append(chunk["error"]["type"])
                    continue
                for choice in chunk["choices"]:
                    seen["text"] += choice["delta"].get("content") or ""
                    seen["finish"] = choice["finish_reason"] or seen["finish"]
                seen["usage"] = chunk.get("usage") or seen["usage"]
    return seen


def assert_whole(seen: dict, reference: dict) -> None:
    assert seen["errors"] == [] and seen["done"], seen
    assert seen["text"] == reference["text"]
    assert seen["finish"] == reference["finish"]
    assert seen["usage"]["completion_tokens"] == reference["usage"]["completion_tokens"]


@pytest.mark.parametrize("action", ["crash", "raise", "hang", "poison"])
def test_a_stream_hit_mid_answer_is_resumed_to_its_end(serve, tiny_model, action) -> None:
    server = serve(
        "--model",
        str(tiny_model),
        "--stall-timeout",
        "2",
        "--inject-fault",
        f"decode:{action}:nth=1",
    )
    server.wait()
    faulted = stream(server.url)  # the first request: the fault strikes at its second token
    reference = stream(server.url)  # the same request, unfaulted (greedy: the same answer)
    assert_whole(faulted, reference)
    assert reference["usage"]["completion_tokens"] == 16
    health = server.health().json()
    assert health["faults"]["total"] == 1
    assert health["faults"]["last"]["request_id"] is not None


@pytest.mark.parametrize("action", ["crash", "raise", "hang", "poison"])
def test_streams_hit_in_a_batch_are_each_resumed(serve, tiny_model, action) -> None:
    faults = f"decode:{action}:nth=2;decode:slow=0.02:every"
    server = serve("--model", str(tiny_model), "--stall-timeout", "2", "--inject-fault", faults)
    server.wait()
    prompts = [f"Question {i}: what is a lighthouse?" for i in range(4)]
    with ThreadPoolExecutor(4) as pool:
        faulted = list(pool.map(lambda p: stream(server.url, p), prompts))
    assert server.health().json()["faults"]["total"] == 1  # the fault happened, once
    for prompt, seen in zip(prompts, faulted, strict=True):
        assert_whole(seen, stream(server.url, prompt))


def test_a_poison_stream_is_resumed_once_then_quarantined(serve, tiny_model) -> None:
    server = serve("--model", str(tiny_model), "--inject-fault", "decode:raise:marker=X-POISON")
    server.wait()
    seen = stream(server.url, "please X-POISON me")
    assert seen["text"]  # its first token reached the client before the first fault
    assert seen["errors"] == ["request_quarantined"] and not seen["done"]
    health = server.health().json()
    assert health["faults"]["total"] == 2 and health["quarantined"] == 1
    assert stream(server.url)["done"]  # the server goes on serving

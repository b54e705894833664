"""Health tells the truth from the first second; the queue is bounded in size and time.

A tiny random-weight model keeps these fast; `slow` fault injection makes a real worker
busy for as long as a test needs (SPEC §6).
"""

from __future__ import annotations

import threading

import httpx

from tests.conftest import reply, until
from tests.front.test_openai_api import assert_envelope

PROMPT = {"prompt": "hello", "max_tokens": 8, "temperature": 0}


def test_starting_is_503_until_loaded_and_canary_passed(serve, tiny_model) -> None:
    server = serve("--model", str(tiny_model), "--inject-fault", "load:slow=4")
    until(lambda: reply(server.health), 30, "listening")
    seen = server.health()
    assert seen.status_code == 503
    assert seen.json()["status"] == "starting"
    assert int(seen.headers["retry-after"]) >= 1
    for field in (
        "model",
        "service",
        "version",
        "worker",
        "faults",
        "restarts_in_window",
        "queue_depth",
    ):
        assert field in seen.json()
    assert server.http.get("/health/live").status_code == 200
    assert server.http.get("/health/ready").status_code == 503
    body = server.wait("ready")
    assert body["worker"]["generation"] == 1 and body["worker"]["pid"] > 0
    assert body["service"] == "steward"
    assert server.http.get("/health/ready").status_code == 200


def test_live_answers_fast_during_generation(serve, tiny_model) -> None:
    server = serve("--model", str(tiny_model), "--inject-fault", "decode:slow=0.2:every")
    server.wait()
    worker = threading.Thread(
        target=server.http.post, args=("/v1/completions",), kwargs={"json": PROMPT}
    )
    worker.start()
    server.until(lambda health: health["in_flight"] == 1)
    probes = 0
    with httpx.Client(base_url=server.url) as probe:
        while worker.is_alive():
            for path in ("/health/live", "/health"):
                assert probe.get(path).status_code == 200
            probes += 1
    # the front's loop answered all along (how fast: bench/overhead.py); a loop blocked by
    # the generation would answer once it ended, not many times while it ran
    assert probes >= 5


def test_full_queue_is_429_and_waiting_is_bounded(serve, tiny_model) -> None:
    server = serve(
        "--model",
        str(tiny_model),
        "--max-batch",
        "1",  # one on the worker, the next one waits in the queue
        "--queue-size",
        "1",
        "--queue-timeout",
        "1.5",
        "--inject-fault",
        "decode:slow=0.5:every",
    )
    server.wait()
    results: dict[str, httpx.Response] = {}

    def post(name: str) -> None:
        results[name] = httpx.post(server.url + "/v1/completions", json=PROMPT, timeout=60)

    running = threading.Thread(target=post, args=("running",))
    running.start()
    server.until(lambda health: health["in_flight"] == 1)  # it is on the worker now
    queued = threading.Thread(target=post, args=("queued",))
    queued.start()
    server.until(lambda health: health["queue_depth"] == 1)
    full = httpx.post(server.url + "/v1/completions", json=PROMPT)
    assert_envelope(full, 429, "overloaded")
    queued.join()
    assert_envelope(results["queued"], 429, "overloaded")  # waited its 1.5 s, then told
    running.join()
    assert results["running"].status_code == 200
    assert results["running"].json()["usage"]["completion_tokens"] == 8

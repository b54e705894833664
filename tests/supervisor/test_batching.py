"""Continuous batching with every fault guarantee (SPEC §1, §3): a real server, a real
worker decoding many requests together, real MLX on the tiny model.

`decode:slow=S:every` stretches each decode step, so requests sent together are in the
batch together; tests wait for what `/health` shows (`in_flight`, `batch`), not for time.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from tests.conftest import until
from tests.front.test_openai_api import assert_envelope

SLOW = ("--inject-fault", "decode:slow=0.02:every")


def complete(url: str, prompt: str, **extra: object) -> httpx.Response:
    body = {"prompt": prompt, "max_tokens": 12, "temperature": 0, **extra}
    return httpx.post(url + "/v1/completions", json=body, timeout=120)


def streamed(url: str, prompt: str, max_tokens: int = 12) -> tuple[str, str | None, int]:
    """Text, finish reason and usage.completion_tokens of a streamed completion."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    text, finish, usage = [], None, 0
    for chunk in client.completions.create(
        model="default",
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    ):
        if chunk.usage:
            usage = chunk.usage.completion_tokens
        for choice in chunk.choices:
            text.append(choice.text)
            finish = choice.finish_reason or finish
    return "".join(text), finish, usage


class BatchWatch:
    """The largest batch `/health` showed while the block ran."""

    def __init__(self, url: str) -> None:
        self.url, self.largest, self._stop = url, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=5) as client:
            while not self._stop.is_set():
                self.largest = max(self.largest, client.get("/health").json()["batch"]["size"])
                time.sleep(0.01)

    def __enter__(self) -> BatchWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


PROMPTS = [f"Request number {i} is about" for i in range(8)]


@pytest.fixture(scope="module")
def slow_server(tiny_model):
    from tests.conftest import Server

    server = Server(["--model", str(tiny_model), *SLOW])
    server.wait()
    yield server
    server.stop()


def test_eight_together_answer_as_they_do_alone(slow_server) -> None:
    url = slow_server.url
    alone = [complete(url, p).json()["choices"][0]["text"] for p in PROMPTS]
    with BatchWatch(url) as watch, ThreadPoolExecutor(8) as pool:
        plain = pool.map(lambda p: complete(url, p), PROMPTS[:4])
        streams = pool.map(lambda p: streamed(url, p), PROMPTS[4:])
        replies, streamed_replies = list(plain), list(streams)
    assert watch.largest >= 4, f"never more than {watch.largest} in a batch"
    assert [r.status_code for r in replies] == [200] * 4
    together = [r.json()["choices"][0]["text"] for r in replies]
    together += [text for text, _, _ in streamed_replies]
    assert together == alone  # greedy, float32 on this CPU: batching changes nothing
    assert all(finish == "length" and n == 12 for _, finish, n in streamed_replies)
    health = slow_server.health().json()
    assert health["faults"]["total"] == 0
    assert (health["in_flight"], health["batch"]["size"]) == (0, 0)


def test_a_seed_gives_the_same_answer_alone_and_in_a_batch(slow_server) -> None:
    url = slow_server.url
    seeded = {"temperature": 1.0, "seed": 1234}
    alone = complete(url, PROMPTS[0], **seeded).json()["choices"][0]["text"]
    assert complete(url, PROMPTS[0], **seeded).json()["choices"][0]["text"] == alone
    with ThreadPoolExecutor(6) as pool:
        others = [pool.submit(complete, url, p, temperature=1.0) for p in PROMPTS[1:6]]
        until(lambda: slow_server.health().json()["batch"]["size"] >= 3, 10, "batched")
        in_batch = complete(url, PROMPTS[0], **seeded).json()["choices"][0]["text"]
        assert all(f.result().status_code == 200 for f in others)
    assert in_batch == alone


def test_cancelling_one_member_leaves_the_others_intact(slow_server) -> None:
    url = slow_server.url
    with ThreadPoolExecutor(3) as pool:
        with httpx.stream(
            "POST",
            url + "/v1/completions",
            json={"prompt": PROMPTS[3], "max_tokens": 400, "stream": True},  # outlives them
            timeout=30,
        ) as response:
            lines = response.iter_lines()  # held: a dropped iterator closes the stream
            next(lines)  # its first token arrived: the others join it
            others = [pool.submit(streamed, url, p, max_tokens=40) for p in PROMPTS[:3]]
            until(lambda: slow_server.health().json()["in_flight"] == 4, 10, "all four running")
        # out of the `with`: the client hangs up, 390 tokens (8 s) before its answer's end
        finished = [f.result() for f in others]
        until(lambda: slow_server.health().json()["in_flight"] == 0, 3, "the hang-up cancelled")
    assert all(finish == "length" and n == 40 for _, finish, n in finished)
    assert slow_server.health().json()["faults"]["total"] == 0


def test_a_shared_prefix_comes_from_the_prompt_cache(slow_server) -> None:
    prefix = "You are a careful assistant who answers in one line. " * 40
    first = complete(slow_server.url, prefix + "First question?").json()
    second = complete(slow_server.url, prefix + "Another question?").json()
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] < 8  # nothing shared yet
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= first["usage"]["prompt_tokens"] - 8  # the whole shared prefix
    assert second["timings"]["cache_n"] == cached
    assert second["timings"]["prompt_ms"] < first["timings"]["prompt_ms"]  # worker's clock
    metrics = httpx.get(slow_server.url + "/metrics").text.splitlines()
    total = next(line for line in metrics if line.startswith("steward_prompt_cache_tokens_total"))
    assert float(total.split()[1]) >= cached


def test_a_crash_mid_batch_answers_every_request(serve, tiny_model) -> None:
    server = serve("--model", str(tiny_model), "--inject-fault", "decode:crash:nth=3;" + SLOW[1])
    server.wait()
    with BatchWatch(server.url) as watch, ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda p: complete(server.url, p), PROMPTS))
    assert watch.largest >= 2
    assert [r.status_code for r in replies] == [200] * 8
    health = server.health().json()
    assert health["worker"]["generation"] == 2
    assert health["faults"]["last"]["class"] == "worker_crash"


def test_a_poison_member_is_quarantined_and_the_other_seven_answered(serve, tiny_model) -> None:
    spec = "decode:poison:marker=X-POISON;" + SLOW[1]
    server = serve("--model", str(tiny_model), "--inject-fault", spec)
    server.wait()
    prompts = [*PROMPTS[:7], "please X-POISON me"]
    with BatchWatch(server.url) as watch, ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda p: complete(server.url, p), prompts))
    assert watch.largest >= 2
    assert [r.status_code for r in replies[:7]] == [200] * 7
    assert_envelope(replies[7], 422, "request_quarantined")
    health = server.health().json()
    # all eight started together: no fault points at one of them, so the group is split
    # within the restart budget (test_group_testing.py: a poison joining a decoding batch
    # costs two), and the server keeps serving
    assert health["restarts_in_window"] <= 3 and server.proc.poll() is None
    assert health["quarantined"] == 1
    assert complete(server.url, PROMPTS[0]).status_code == 200


def test_a_streamed_poison_retried_by_its_client_is_quarantined(serve, tiny_model) -> None:
    """Strikes count per payload: each retry is a new request with the same payload."""
    spec = "decode:poison:marker=X-POISON"
    server = serve("--model", str(tiny_model), "--inject-fault", spec)
    server.wait()
    seen: list[str] = []
    for _attempt in range(5):
        try:
            streamed(server.url, "please X-POISON me")
            seen.append("ok")
        except openai.APIStatusError as exc:  # refused before the stream started
            seen.append(exc.body["type"] if isinstance(exc.body, dict) else str(exc.body))
        except openai.APIError as exc:  # an SSE error event ended the stream
            seen.append(exc.body["type"] if isinstance(exc.body, dict) else str(exc))
    assert "request_quarantined" in seen[:3], seen
    assert seen[3:] == ["request_quarantined"] * 2, seen
    assert server.proc.poll() is None  # never exit 75: the restart budget is not spent
    assert complete(server.url, PROMPTS[0]).status_code == 200
    assert server.health().json()["worker"]["generation"] <= 3


def test_an_allocation_failure_in_a_batch_halves_it_and_replays(serve, tiny_model) -> None:
    server = serve("--model", str(tiny_model), "--inject-fault", "decode:oom:nth=2;" + SLOW[1])
    server.wait()
    with BatchWatch(server.url) as watch, ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(lambda p: complete(server.url, p), PROMPTS[:4]))
    assert watch.largest >= 2
    assert [r.status_code for r in replies] == [200] * 4  # 507 is for a request alone
    health = server.health().json()
    assert health["batch"]["limit"] == 16
    assert health["worker"]["generation"] == 1  # request-scoped: the canary passed
    assert "batch limit 16" in health["faults"]["last"]["action"]

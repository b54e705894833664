"""The fault matrix (SPEC §3), end to end: a real server, a real worker, real MLX (the tiny
model), faults injected at the backend's own calls (SPEC §6).
"""

from __future__ import annotations

import json
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.front.test_openai_api import assert_envelope

CHAT = [{"role": "user", "content": "Hello there"}]
BODY = {"messages": CHAT, "max_tokens": 4, "temperature": 0}


class ReadyWatch:
    """Samples /health/ready every 20 ms in the background; records the statuses seen."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.seen: list[tuple[int, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=5) as client:
            while not self._stop.is_set():
                try:
                    r = client.get("/health/ready")
                    self.seen.append((r.status_code, r.json()["status"]))
                except httpx.TransportError:
                    self.seen.append((0, "down"))
                time.sleep(0.02)

    def stop(self) -> list[tuple[int, str]]:
        self._stop.set()
        self._thread.join()
        return self.seen


class InFlight:
    """A chat request running in a background thread, on the worker once constructed."""

    def __init__(self, server, body: dict) -> None:
        self._result: list[httpx.Response] = []
        post = httpx.post
        self._thread = threading.Thread(
            target=lambda: self._result.append(
                post(server.url + "/v1/chat/completions", json=body, timeout=60)
            )
        )
        self._thread.start()
        server.until(lambda health: health["in_flight"] == 1)

    def response(self) -> httpx.Response:
        self._thread.join()
        return self._result[0]


def faults_logged(output: str) -> list[dict]:
    """The fault events of a --log-json server."""
    events = []
    for line in output.splitlines():
        if line.startswith("{"):
            entry = json.loads(line)
            if "fault" in entry:
                events.append(entry)
    return events


def test_field_report_scenario_recovers_with_zero_failures(serve, tiny_model) -> None:
    server = serve(
        "--model", str(tiny_model), "--inject-fault", "decode:poison:nth=3", "--log-json"
    )
    server.wait()
    watch = ReadyWatch(server.url)
    client = server.client()  # default retries, as the field report's client had
    answers = [
        client.chat.completions.create(model="default", messages=CHAT, max_tokens=4, temperature=0)
        .choices[0]
        .message.content
        for _ in range(70)
    ]
    seen = watch.stop()
    assert len(answers) == 70 and len(set(answers)) == 1  # all served, all the same answer
    statuses = [code for code, _ in seen]
    first_503 = statuses.index(503)
    assert (503, "recovering") in seen
    assert 200 in statuses[first_503:]
    health = server.health().json()
    assert health["worker"]["generation"] == 2
    assert health["faults"]["total"] == 1
    assert health["faults"]["last"]["class"] == "gpu_timeout"
    assert "promoted standby" in health["faults"]["last"]["action"]  # the default warm spare
    assert health["status"] == "degraded"  # serving, with a recent fault
    (event,) = faults_logged(server.output())
    assert event["fault"]["class"] == "gpu_timeout"
    assert event["fault"]["generation"] == 1
    assert event["request_id"] and "Traceback" in event["traceback"]


def test_concurrent_and_queued_requests_survive_a_crash(serve, tiny_model) -> None:
    server = serve("--model", str(tiny_model), "--inject-fault", "decode:crash:nth=2")
    server.wait()
    with ThreadPoolExecutor(6) as pool:
        replies = list(
            pool.map(
                lambda _: httpx.post(server.url + "/v1/chat/completions", json=BODY, timeout=120),
                range(6),
            )
        )
    assert [r.status_code for r in replies] == [200] * 6
    health = server.health().json()
    assert health["worker"]["generation"] == 2
    assert health["faults"]["last"]["class"] == "worker_crash"
    assert "SIGABRT" in health["faults"]["last"]["message"]


def test_a_request_in_flight_waits_out_a_recovery_longer_than_the_queue_timeout(
    serve, tiny_model
) -> None:
    """--queue-timeout bounds the wait for a first turn; a request the fault struck is owed
    its replay. Its replacement here takes longer than the queue timeout (a 503 before, on
    CI's slower machine, where a prefill that ended in a crash took most of it)."""
    server = serve(
        "--model", str(tiny_model), "--standby", "none", "--queue-timeout", "2",
        "--inject-fault", "prefill:crash:nth=1;load:slow=4:nth=2",
    )  # fmt: skip
    server.wait()
    reply = server.http.post("/v1/chat/completions", json=BODY, timeout=120)
    assert reply.status_code == 200, reply.text
    health = server.health().json()
    assert health["worker"]["generation"] == 2
    assert health["faults"]["last"]["recovery_s"] > 2


def test_sigterm_during_a_replacement_still_answers_its_suspect(serve, tiny_model) -> None:
    """The drain waits for a request the fault left waiting for its replacement worker,
    which no queue holds while the fault is handled."""
    server = serve(
        "--model", str(tiny_model), "--standby", "none",
        "--inject-fault", "prefill:slow=1:nth=1;prefill:crash:nth=1;load:slow=3:nth=2",
    )  # fmt: skip
    server.wait()
    running = InFlight(server, BODY)
    server.until(lambda health: health["status"] == "recovering")
    server.proc.send_signal(signal.SIGTERM)
    assert running.response().status_code == 200, running.response().text
    assert server.exit_code() == 0


def test_hung_request_is_replayed_after_stall(serve, tiny_model) -> None:
    server = serve(
        "--model", str(tiny_model), "--inject-fault", "decode:hang:nth=2", "--stall-timeout", "3"
    )
    server.wait()
    client = server.client(max_retries=0)
    assert client.chat.completions.create(model="default", messages=CHAT, max_tokens=4)
    started = time.monotonic()
    reply = client.chat.completions.create(model="default", messages=CHAT, max_tokens=4)
    assert reply.choices[0].finish_reason == "length"
    assert time.monotonic() - started >= 3  # not judged stalled before --stall-timeout
    health = server.health().json()
    assert health["faults"]["last"]["class"] == "stall"
    assert health["worker"]["generation"] == 2


def test_request_scoped_raise_keeps_the_worker(serve, tiny_model) -> None:
    server = serve("--model", str(tiny_model), "--inject-fault", "prefill:raise:nth=1")
    server.wait()
    reply = server.http.post("/v1/chat/completions", json=BODY)
    assert reply.status_code == 200  # replayed after the canary passed
    health = server.health().json()
    assert health["worker"]["generation"] == 1
    assert health["faults"]["last"]["action"] == "kept worker (canary passed)"


def test_poison_request_is_quarantined_without_restarts(serve, tiny_model) -> None:
    server = serve("--model", str(tiny_model), "--inject-fault", "prefill:raise:marker=X-POISON")
    server.wait()
    poison = {**BODY, "messages": [{"role": "user", "content": "please X-POISON me"}]}
    assert server.http.post("/v1/chat/completions", json=BODY).status_code == 200
    body = assert_envelope(
        server.http.post("/v1/chat/completions", json=poison), 422, "request_quarantined"
    )
    assert body["error"]["fault"]["class"] == "gpu_timeout"
    assert server.health().json()["faults"]["total"] == 2  # two backend attempts, no more
    twin = server.http.post("/v1/chat/completions", json=poison)
    assert_envelope(twin, 422, "request_quarantined")
    assert server.http.post("/v1/chat/completions", json=BODY).status_code == 200
    health = server.health().json()
    assert health["faults"]["total"] == 2  # the twin never reached the backend
    assert health["worker"]["generation"] == 1
    assert health["quarantined"] == 1


def test_fault_ids_count_one_by_one(serve, tiny_model) -> None:
    """A failed canary is part of its fault, not a fault id of its own."""
    faults = "decode:poison:nth=1;decode:raise:nth=3"
    server = serve("--model", str(tiny_model), "--inject-fault", faults)
    server.wait()
    for _ in range(3):
        assert server.http.post("/v1/chat/completions", json=BODY).status_code == 200
    health = server.health().json()
    assert health["worker"]["generation"] == 2  # the poison's canary failed: replaced
    assert health["faults"]["total"] == 2
    assert health["faults"]["last"]["id"] == "f-2"


def test_request_scoped_oom_is_507(serve, tiny_model) -> None:
    server = serve("--model", str(tiny_model), "--inject-fault", "prefill:oom:nth=1")
    server.wait()
    body = assert_envelope(
        server.http.post("/v1/chat/completions", json=BODY), 507, "insufficient_memory"
    )
    assert body["error"]["fault"]["class"] == "oom"
    assert server.http.post("/v1/chat/completions", json=BODY).status_code == 200
    assert server.health().json()["worker"]["generation"] == 1


def test_load_poison_exits_75_within_the_restart_budget(serve, tiny_model) -> None:
    server = serve(
        "--model", str(tiny_model), "--inject-fault", "load:poison:every", "--max-restarts", "3"
    )
    assert server.exit_code(120) == 75
    starts = server.output().count("started (pid")
    assert 2 <= starts <= 4


def test_on_fault_exit_exits_75_at_once(serve, tiny_model) -> None:
    server = serve(
        "--model", str(tiny_model), "--inject-fault", "decode:poison:nth=1", "--on-fault", "exit"
    )
    server.wait()
    reply = server.http.post("/v1/chat/completions", json=BODY)
    assert_envelope(reply, 503, "backend_unavailable")
    assert server.exit_code(30) == 75
    assert server.output().count("started (pid") == 1


def test_restart_intensity_exceeded_exits_75(serve, tiny_model) -> None:
    server = serve(
        "--model",
        str(tiny_model),
        "--inject-fault",
        "prefill:crash:marker=BOOM",
        "--max-restarts",
        "1",
    )
    server.wait()
    boom = {**BODY, "messages": [{"role": "user", "content": "BOOM"}]}
    reply = server.http.post("/v1/chat/completions", json=boom)
    assert reply.status_code in (422, 503)
    assert server.exit_code(60) == 75


def test_hanging_canary_is_bounded(serve, tiny_model) -> None:
    """The canary prompt itself hangs: every worker fails to come up, then exit 75."""
    server = serve(
        "--model",
        str(tiny_model),
        "--inject-fault",
        "prefill:hang:marker=capital",
        "--stall-timeout",
        "2",
    )
    assert server.exit_code(240) == 75  # four bring-ups, slow on a busy machine
    assert "stall" in server.output()


def test_sigterm_lets_the_running_request_finish(serve, tiny_model) -> None:
    server = serve("--model", str(tiny_model), "--inject-fault", "decode:slow=0.4:every")
    server.wait()
    running = InFlight(server, {**BODY, "max_tokens": 8})
    server.proc.send_signal(signal.SIGTERM)
    server.until(lambda health: health["status"] == "stopping")
    ready = server.http.get("/health/ready")
    assert ready.status_code == 503 and ready.json()["status"] == "stopping"
    refused = server.http.post("/v1/chat/completions", json=BODY)
    assert_envelope(refused, 503, "server_shutdown")
    assert running.response().status_code == 200
    assert running.response().json()["usage"]["completion_tokens"] == 8
    assert server.exit_code() == 0


def test_slow_decode_is_degraded(serve, tiny_model) -> None:
    server = serve("--model", str(tiny_model), "--inject-fault", "decode:slow=0.2:marker=SLOW")
    server.wait()
    slow = {**BODY, "max_tokens": 10, "messages": [{"role": "user", "content": "SLOW"}]}
    # A request that asks for more per token (logprobs, top_p; a schema, penalties) is no
    # measure of the backend: however slow, it leaves /health as it was.
    for more in ({"logprobs": True}, {"temperature": 1.0, "top_p": 0.5}):
        assert server.http.post("/v1/chat/completions", json={**slow, **more}).is_success
        assert server.health().json()["status"] == "ready"
    # the median of the last five like the canary decides: one slow answer is noise
    assert server.http.post("/v1/chat/completions", json=slow).status_code == 200
    assert server.health().json()["status"] == "ready"
    for _ in range(2):
        assert server.http.post("/v1/chat/completions", json=slow).status_code == 200
    assert server.health().json()["status"] == "degraded"
    # Three answers at the canary's speed make the median fast again; on a machine busy
    # with other tests, a few may decode under half the canary's speed: allow ten.
    for _ in range(10):
        assert server.http.post("/v1/chat/completions", json={**BODY, "max_tokens": 10}).is_success
        if server.health().json()["status"] == "ready":
            break
    assert server.health().json()["status"] == "ready"


def test_second_signal_cuts_the_drain(serve, tiny_model) -> None:
    server = serve("--model", str(tiny_model), "--inject-fault", "decode:slow=0.5:every")
    server.wait()
    running = InFlight(server, {**BODY, "max_tokens": 60})
    server.proc.send_signal(signal.SIGINT)
    server.until(lambda health: health["status"] == "stopping")
    server.proc.send_signal(signal.SIGINT)
    assert server.exit_code(20) == 0  # not after the 30 s of the drain, nor the 30 s request
    assert_envelope(running.response(), 503, "server_shutdown")

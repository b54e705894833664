"""Metrics, systemd notifications and access logs of a real server, after a real fault."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import threading
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import until

BODY = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 3, "temperature": 0}


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of a Prometheus exposition."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_and_access_logs_after_a_fault(serve, tiny_model) -> None:
    server = serve(
        "--model", str(tiny_model), "--inject-fault", "decode:poison:nth=2", "--log-json"
    )
    server.wait()
    for _ in range(4):
        assert server.http.post("/v1/chat/completions", json=BODY).status_code == 200
    assert (
        server.http.post("/v1/chat/completions", json={**BODY, "model": "nope"}).status_code == 404
    )
    traced = server.http.get("/v1/models", headers={"x-request-id": "trace-me-7"})
    assert traced.status_code == 200
    m = samples(server.http.get("/metrics").text)

    chat = "/v1/chat/completions"
    assert m[("steward_requests_total", (("route", chat), ("status", "200")))] == 4
    assert m[("steward_requests_total", (("route", chat), ("status", "404")))] == 1
    assert m[("steward_errors_total", (("type", "model_not_found"),))] == 1
    assert (
        m[("steward_faults_total", (("action", "promoted_standby"), ("class", "gpu_timeout")))] == 1
    )
    assert m[("steward_worker_restarts_total", ())] == 1
    assert m[("steward_worker_generation", ())] == 2
    assert m[("steward_canary_runs_total", (("result", "fail"),))] == 1
    # the first worker's; the hot spare's (auto's choice for a tiny model) at its start, and
    # again before it serves after a fault that may be the device's
    assert m[("steward_canary_runs_total", (("result", "pass"),))] == 3
    assert m[("steward_recovery_seconds_count", ())] == 1
    assert m[("steward_time_to_first_token_seconds_count", ())] == 4  # the replay, not the fault
    assert m[("steward_state", (("state", "degraded"),))] == 1
    assert m[("steward_state", (("state", "ready"),))] == 0
    assert m[("steward_queue_depth", ())] == 0

    lines = [json.loads(line) for line in server.output().splitlines() if line.startswith("{")]
    access = [line for line in lines if line["logger"] == "steward.access"]
    (mine,) = [line for line in access if line.get("request_id") == "trace-me-7"]
    assert mine["access"]["status"] == 200 and mine["access"]["path"] == "/v1/models"
    assert all(line.get("request_id") for line in access)
    faults = [line for line in lines if "fault" in line]
    assert len(faults) == 1 and faults[0]["fault"]["generation"] == 1


def test_systemd_notify_protocol(serve, tiny_model, tmp_path: Path) -> None:
    """A real AF_UNIX datagram socket stands in for systemd."""
    address = str(tmp_path / "notify.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(address)
    listener.settimeout(0.2)
    received: list[tuple[float, str]] = []
    done = threading.Event()

    def collect() -> None:
        while not done.is_set():
            with contextlib.suppress(TimeoutError):
                received.append((time.monotonic(), listener.recv(4096).decode()))

    collector = threading.Thread(target=collect)
    collector.start()
    try:
        server = serve(
            "--model",
            str(tiny_model),
            "--inject-fault",
            "decode:poison:nth=1",
            env={"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "400000"},
        )
        server.wait()
        assert server.http.post("/v1/chat/completions", json=BODY).status_code == 200
        server.wait("degraded")

        def pinged_for(seconds: float) -> bool:
            pings = [at for at, text in received if "WATCHDOG=1" in text]
            return len(pings) > 1 and pings[-1] - pings[0] > seconds

        until(lambda: pinged_for(2.2), 10, "watchdog pings over 2 s")
        server.proc.send_signal(signal.SIGTERM)
        assert server.exit_code() == 0
    finally:
        done.set()
        collector.join()
        listener.close()

    messages = [text for _, text in received]
    assert sum("READY=1" in text for text in messages) == 1
    statuses = [
        line[7:] for text in messages for line in text.split("\n") if line.startswith("STATUS=")
    ]
    states = [status.split(":")[0] for status in statuses]
    for expected in ("ready", "recovering", "degraded", "stopping"):
        assert expected in states, statuses
    assert states.index("recovering") < states.index("degraded") < states.index("stopping")
    assert any("STOPPING=1" in text for text in messages)
    pings = [at for at, text in received if "WATCHDOG=1" in text]
    span = pings[-1] - pings[0]
    assert span > 2 and abs(len(pings) - 1 - span / 0.2) <= 0.3 * span / 0.2  # every 0.2 s

"""The spare worker (`--standby`, SPEC §5), end to end: a real front, real worker processes,
real MLX on the tiny model, a real crash. (test_decisions.py covers every branch of the
promotion with a fake worker line, the fallback from hot to warm included.)"""

from __future__ import annotations

import os
import signal

import httpx
import pytest

from tests.conftest import until
from tests.supervisor.test_recovery import BODY


def spare(server) -> dict:
    return server.until(lambda health: health["standby"]["state"] == "ready", 60)["standby"]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("mode", ["warm", "hot"])
def test_a_crash_is_served_by_the_spare_and_a_new_one_starts(serve, tiny_model, mode) -> None:
    server = serve(
        "--model", str(tiny_model), "--standby", mode, "--inject-fault", "decode:crash:nth=2"
    )
    server.wait()
    first = spare(server)
    assert server.http.post("/v1/chat/completions", json=BODY).status_code == 200
    assert server.http.post("/v1/chat/completions", json=BODY).status_code == 200  # crashes
    health = server.health().json()
    last = health["faults"]["last"]
    assert last["class"] == "worker_crash"
    assert last["action"] == "promoted standby (generation 2)"
    assert health["worker"]["pid"] == first["pid"]  # the spare serves now
    behind = spare(server)  # and another spare stands behind it
    assert behind["pid"] != first["pid"]


def test_no_spare_outlives_a_killed_front(serve, tiny_model) -> None:
    server = serve("--model", str(tiny_model), "--standby", "hot")
    server.wait()
    pids = [server.health().json()["worker"]["pid"], spare(server)["pid"]]
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait(10)
    until(lambda: not any(alive(pid) for pid in pids), 10, "every worker gone")


def test_without_a_spare_health_says_so(serve, tiny_model) -> None:
    server = serve("--model", str(tiny_model), "--standby", "none")
    server.wait()
    standby = server.health().json()["standby"]
    assert standby == {"mode": "none", "asked": "none", "why": "asked for none"} | {
        "state": None,
        "pid": None,
        "phases": {},
        "ranks": [],
    }
    assert httpx.get(server.url + "/health/live").status_code == 200

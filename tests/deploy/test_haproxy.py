"""Two steward replicas behind a real HAProxy running the committed deploy/haproxy.cfg,
unchanged (ports come in through its environment variables).

One replica is poisoned mid-run (the field report's fault). Its /health/ready answers 503
while it replaces its worker, so HAProxy's check marks it DOWN and sends new requests to
the other replica; the request in flight is replayed by steward itself; once the canary
passes, the check marks it UP again. Clients see no failure at all.
"""

from __future__ import annotations

import csv
import io
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT, Server, free_port, reply, until

CONFIG = ROOT / "deploy" / "haproxy.cfg"
BODY = {"messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 2}
HAPROXY = shutil.which("haproxy")
pytestmark = pytest.mark.skipif(
    HAPROXY is None, reason="haproxy not installed (Debian/Ubuntu: apt-get install haproxy)"
)


class HAProxy:
    """`haproxy -db -f deploy/haproxy.cfg` in the foreground, replicas' ports in its env."""

    def __init__(self, log: Path, replicas: dict[str, int]) -> None:
        self.port, self.stats_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.stats_url = f"http://127.0.0.1:{self.stats_port}/stats;csv"
        env = {
            **os.environ,
            "HAPROXY_PORT": str(self.port),
            "HAPROXY_STATS_PORT": str(self.stats_port),
            **{f"STEWARD_{name.upper()}": str(port) for name, port in replicas.items()},
        }
        self.log = log
        self._log_file = log.open("w")
        self.proc = subprocess.Popen(
            [str(HAPROXY), "-db", "-f", str(CONFIG)],
            env=env,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
        )

    def stats(self, client: httpx.Client) -> dict[str, dict[str, str]]:
        """The `steward` backend's servers: {name: CSV row} (status, check_status, ...)."""
        text = client.get(self.stats_url).text.lstrip("# ")
        return {
            row["svname"]: row
            for row in csv.DictReader(io.StringIO(text))
            if row["pxname"] == "steward" and row["svname"] not in ("FRONTEND", "BACKEND")
        }

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log_file.close()


class StatsWatch:
    """Samples HAProxy's stats every 50 ms in the background: each server's status seen."""

    def __init__(self, haproxy: HAProxy) -> None:
        self.haproxy = haproxy
        self.seen: dict[str, list[str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self._stop.is_set():
                try:
                    for name, row in self.haproxy.stats(client).items():
                        statuses = self.seen.setdefault(name, [])
                        if not statuses or statuses[-1] != row["status"]:
                            statuses.append(row["status"])  # transitions only
                except httpx.TransportError:
                    pass
                time.sleep(0.05)

    def stop(self) -> dict[str, list[str]]:
        self._stop.set()
        self._thread.join()
        return self.seen


@pytest.fixture
def haproxy(tmp_path: Path) -> Iterator[Callable[[dict[str, int]], HAProxy]]:
    started: list[HAProxy] = []

    def start(replicas: dict[str, int]) -> HAProxy:
        proxy = HAProxy(tmp_path / "haproxy.log", replicas)
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        proxy.stop()


def test_committed_config_is_valid() -> None:
    result = subprocess.run(
        [str(HAPROXY), "-c", "-f", str(CONFIG)], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_poisoned_replica_is_taken_out_and_back_with_zero_failures(
    serve: Callable[..., Server],
    tiny_model: Path,
    haproxy: Callable[[dict[str, int]], HAProxy],
) -> None:
    healthy = serve("--model", str(tiny_model))
    poisoned = serve(
        "--model",
        str(tiny_model),
        "--inject-fault",
        "decode:poison:nth=5",  # the 5th request this replica gets poisons its worker
        "--inject-fault",
        "load:slow=1.5:nth=2",  # the replacement loads slowly: several checks see the 503
    )
    healthy.wait()
    poisoned.wait()
    proxy = haproxy({"a": healthy.port, "b": poisoned.port})
    with httpx.Client(timeout=10) as probe:

        def checked() -> bool:  # servers start UP; wait for a first passed check on each
            stats = reply(lambda: proxy.stats(probe))
            return (
                bool(stats)
                and len(stats) == 2
                and all(r["check_status"] == "L7OK" for r in stats.values())
            )

        until(checked, 20, "both servers checked")

    watch = StatsWatch(proxy)
    failures: list[str] = []
    before = poisoned.health().json()
    with httpx.Client(base_url=proxy.url, timeout=120) as client:
        for i in range(200):
            answer = client.post("/v1/chat/completions", json=BODY)
            if answer.status_code != 200:
                failures.append(f"{i}: {answer.status_code} {answer.text[:200]}")
        with httpx.Client(timeout=5) as probe:  # b may still be rising: let it finish
            until(lambda: proxy.stats(probe)["b"]["status"] == "UP", 20, "b back UP")
            final = proxy.stats(probe)
            # Back in rotation means traffic again: b takes its share of new requests.
            for _ in range(10):
                assert client.post("/v1/chat/completions", json=BODY).status_code == 200
            after = proxy.stats(probe)
    seen = watch.stop()

    assert failures == []
    assert before["worker"]["generation"] == 1
    health = poisoned.health().json()
    assert health["worker"]["generation"] == 2  # b really was poisoned and replaced
    assert health["faults"]["last"]["class"] == "gpu_timeout"
    assert "DOWN" in seen["b"], seen  # out of rotation while recovering...
    assert "UP" in seen["b"][seen["b"].index("DOWN") :], seen  # ...and back afterwards
    assert final["b"]["status"] == "UP"
    assert int(final["b"]["chkdown"]) == 1  # exactly one UP -> DOWN transition
    assert int(after["b"]["stot"]) > int(final["b"]["stot"])
    assert "DOWN" not in seen["a"], seen  # the healthy replica was never taken out
    assert int(final["a"]["chkdown"]) == 0
    assert healthy.health().json()["faults"]["total"] == 0

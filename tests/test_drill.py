"""`steward drill` end to end: a real drill process against real servers.

The steward servers are real (`serve` fixture, tiny model, injected faults); other servers
are imitated by a few lines of http.server each, which is all a drill can see of them: the
field report's (a constant /health, non-retryable 500s after the inducing request),
mlx_lm.server's (a 404 for an image part, nothing else wrong), and a server whose /health
shows a short outage long before the inducing request gets its answer.
"""

from __future__ import annotations

import base64
import json
import re
import shlex
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from tests.conftest import ROOT, free_port

COMPLETION = {"object": "chat.completion", "choices": [{"message": {"content": "hi"}}]}
METAL = "mlx-vlm generate() failed: [METAL] Command buffer execution failed"


def drill(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "steward.drill", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


class JsonHandler(BaseHTTPRequestHandler):
    """JSON answers, no log lines."""

    def reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def body(self) -> bytes:
        return self.rfile.read(int(self.headers["content-length"]))

    def log_message(self, *args: object) -> None:
        pass


class FieldReportServer(JsonHandler):
    """mlx-knife as the report describes it: once poisoned, every request fails, forever."""

    poisoned = False
    bodies: ClassVar[list[dict]] = []

    def do_GET(self) -> None:
        if self.path == "/health":
            self.reply(200, {"status": "healthy"})
        else:
            self.reply(404, {"error": {"type": "not_found"}})

    def do_POST(self) -> None:
        body = self.body()
        type(self).poisoned |= b"BOOM" in body
        self.bodies.append(json.loads(body))
        if self.poisoned:
            error = {"type": "internal_error", "message": METAL, "retryable": False}
            self.reply(500, {"status": "error", "error": error})
        else:
            self.reply(200, COMPLETION)


class NoImageServer(JsonHandler):
    """mlx_lm.server as the drill found it: a 404 for an image part, healthy otherwise."""

    def do_GET(self) -> None:
        self.reply(200 if self.path == "/health" else 404, {"status": "ok"})

    def do_POST(self) -> None:
        if b"image_url" in self.body():
            self.reply(404, {"error": {"type": "not_found", "message": "no image support"}})
        else:
            self.reply(200, COMPLETION)


class SlowAnswerServer(JsonHandler):
    """Faults at the inducing request: /health 503 from 2.0 s to 3.5 s after it arrived, its
    own 500 only at 4 s, then healthy. The outage is the 1.5 s of health, not 4 s."""

    induced: float | None = None

    def do_GET(self) -> None:
        since = time.monotonic() - (self.induced or float("inf"))
        self.reply(503 if 2.0 <= since < 3.5 else 200, {"status": "ok"})

    def do_POST(self) -> None:
        if b"BOOM" not in self.body():
            self.reply(200, COMPLETION)
            return
        type(self).induced = time.monotonic()
        time.sleep(4.0)
        self.reply(500, {"error": {"type": "internal_error", "retryable": False}})


@pytest.fixture
def fake() -> Iterator[Callable[[type[JsonHandler]], str]]:
    """Start `fake(Handler)` on a free port; its URL comes back, it stops with the test."""
    servers: list[ThreadingHTTPServer] = []

    def start(handler: type[JsonHandler]) -> str:
        servers.append(ThreadingHTTPServer(("127.0.0.1", 0), handler))
        threading.Thread(target=servers[-1].serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{servers[-1].server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def field_report_server(fake: Callable[[type[JsonHandler]], str]) -> str:
    FieldReportServer.poisoned = False
    FieldReportServer.bodies = []
    return fake(FieldReportServer)


def test_poisoned_worker_is_reported_recovered_by_replacement(serve, tiny_model) -> None:
    server = serve("--model", str(tiny_model), "--inject-fault", "prefill:poison:marker=BOOM")
    server.wait()
    done = drill("--url", server.url, "--requests", "20", "--induce", "marker=BOOM", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    verdict = report["verdict"]
    assert verdict["kind"] == "replaced" and verdict["recovered"]
    assert verdict["text"] == f"recovered by worker replacement in {verdict['recovery_s']:.1f} s"
    assert 0 < verdict["recovery_s"] < 60
    kinds = [r["kind"] for r in report["requests"]]
    assert kinds == ["baseline", "induce"] + ["ordinary"] * 20
    assert all(r["ok"] for r in report["requests"] if r["kind"] != "induce")
    induce = report["requests"][1]
    assert (induce["status"], induce["error"]) == (422, "request_quarantined")
    assert induce["retryable"] is False and induce["should_retry"] == "false"
    states = {s["state"] for s in report["health"]}
    assert {"ready", "recovering"} <= states
    generations = [s["generation"] for s in report["health"]]
    assert generations[0] == 1 and generations[-1] > 1
    assert verdict["outage"][0] >= verdict["induced_at"]


def test_spawned_server_that_exits_is_reported_honestly(tiny_model) -> None:
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "steward",
        "serve",
        "--model",
        str(tiny_model),
        "--port",
        str(port),
        "--on-fault",
        "exit",
        "--inject-fault",
        "prefill:poison:marker=BOOM",
    ]
    url = f"http://127.0.0.1:{port}"
    done = drill("--url", url, "--spawn", shlex.join(command), "--induce", "marker=BOOM")
    assert done.returncode == 1, done.stderr
    assert done.stdout.splitlines()[-1] == "verdict: exited with code 75"
    assert "process exited with code 75" in done.stdout
    assert re.search(r"induce\s+503\s+backend_unavailable\s+true", done.stdout)
    assert "steward: exit 75" in done.stderr  # the server's own log, passed through


def test_field_report_server_is_not_recovered(field_report_server) -> None:
    done = drill(
        "--url", field_report_server, "--requests", "20", "--induce", "marker=BOOM", "--json"
    )
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["verdict"]["text"] == "NOT RECOVERED: 21 consecutive failures"
    assert report["verdict"]["outage"] is None  # it never served again; /health never noticed
    assert report["failures"] == {
        "total": 21,
        "x_should_retry": {"true": 0, "false": 0, "absent": 21},
        "retryable": {"true": 0, "false": 21, "absent": 0},
    }
    assert {s["status"] for s in report["health"]} == {200}  # the constant health of #64
    assert {s["ready"] for s in report["health"]} == {None}  # it has no /health/ready


def test_image_that_faults_nothing_is_inconclusive(field_report_server) -> None:
    done = drill("--url", field_report_server, "--requests", "3", "--image-edge", "64")
    assert done.returncode == 2, done.stderr
    assert done.stdout.splitlines()[-1].startswith("verdict: NO FAULT OBSERVED")
    baseline, induce, *ordinary = FieldReportServer.bodies
    assert len(ordinary) == 3 and baseline == ordinary[0] and "model" not in baseline
    assert baseline["max_tokens"] == 8
    text, image = induce["messages"][0]["content"]
    assert text["type"] == "text" and image["type"] == "image_url"
    prefix, _, data = image["image_url"]["url"].partition(",")
    png = base64.b64decode(data)
    assert prefix == "data:image/png;base64" and png[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", png[16:24]) == (64, 64)


def test_plot_is_a_png(field_report_server, tmp_path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "timeline.png"
    done = drill(
        "--url",
        field_report_server,
        "--requests",
        "5",
        "--induce",
        "marker=BOOM",
        "--plot",
        str(png),
    )
    assert done.returncode == 1, done.stderr
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    assert struct.unpack(">II", data[16:24]) == (1000, 480)
    try:
        from PIL import Image
    except ImportError:
        return
    with Image.open(png) as image:
        image.load()
        assert image.size == (1000, 480)
        assert len(image.convert("RGB").getcolors(1 << 20)) > 10  # drawn, not blank


def test_refused_inducing_request_is_not_induced(fake) -> None:
    url = fake(NoImageServer)
    done = drill("--url", url, "--requests", "3", "--image-edge", "64", "--json")
    assert done.returncode == 3, done.stderr
    verdict = json.loads(done.stdout)["verdict"]
    assert verdict["kind"] == "not_induced" and not verdict["recovered"]
    assert verdict["text"] == (
        "NOT INDUCED: the server refused the inducing request with 404 (not_found)"
    )
    spans = ("outage", "recovery_s", "health_outage", "request_outage")
    assert all(verdict[key] is None for key in spans)
    table = drill("--url", url, "--requests", "1", "--image-edge", "64")
    assert table.returncode == 3 and "outage" not in table.stdout
    assert "3  not induced" in drill("--help").stdout


def test_outage_is_timed_by_health_not_by_the_inducing_answer(fake) -> None:
    SlowAnswerServer.induced = None
    url = fake(SlowAnswerServer)
    done = drill("--url", url, "--requests", "5", "--induce", "marker=BOOM", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    verdict, induce = report["verdict"], report["requests"][1]
    assert (induce["kind"], induce["status"]) == ("induce", 500)
    assert induce["answered"] - induce["t"] >= 4.0
    assert verdict["kind"] == "in_place"
    assert verdict["request_outage"] is None  # every ordinary request was served
    assert verdict["outage"] == verdict["health_outage"]
    assert 1.0 <= verdict["recovery_s"] <= 2.5, verdict
    assert verdict["outage"][0] >= induce["t"] + 1.5
    assert verdict["text"] == f"recovered in place in {verdict['recovery_s']:.1f} s"

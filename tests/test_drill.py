"""`steward drill` end to end: a real drill process against real servers.

The steward servers are real (`serve` fixture, tiny model, injected faults); the field
report's server is imitated by a few lines of http.server: a constant /health and
non-retryable 500s after the inducing request, which is all a drill can see of it.
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
from collections.abc import Iterator
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


class FieldReportServer(BaseHTTPRequestHandler):
    """mlx-knife as the report describes it: once poisoned, every request fails, forever."""

    poisoned = False
    bodies: ClassVar[list[dict]] = []

    def reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health":
            self.reply(200, {"status": "healthy"})
        else:
            self.reply(404, {"error": {"type": "not_found"}})

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        type(self).poisoned |= b"BOOM" in body
        self.bodies.append(json.loads(body))
        if self.poisoned:
            error = {"type": "internal_error", "message": METAL, "retryable": False}
            self.reply(500, {"status": "error", "error": error})
        else:
            self.reply(200, COMPLETION)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def field_report_server() -> Iterator[str]:
    FieldReportServer.poisoned = False
    FieldReportServer.bodies = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), FieldReportServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


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

"""Connections are bounded (SPEC §5a; issue 8): headers, body and idle keep-alive have
timeouts, concurrent connections are capped with an enveloped 503 beyond the cap, health
probes are answered even at the cap, and a low file-descriptor limit is met with a clear
message or a lowered cap, never a flood of tracebacks.

Raw sockets throughout: the bytes a slow or silent client sends are the point. Every socket
has a deadline, so a server that holds a connection forever fails a test in seconds.
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import select
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT, Server, free_port, until
from tests.front import rawhttp
from tests.front.test_openai_api import assert_envelope

NORMAL = {"prompt": "hello", "max_tokens": 2, "temperature": 0}
CLOSED_WITHIN = 3.5  # seconds, for a 1 s timeout: the timeout, and slack for 2 busy cores


@pytest.fixture(scope="module")
def timeouts(tiny_model: Path) -> Iterator[Server]:
    """One server with 1 s timeouts for headers, body and idle keep-alive."""
    server = Server(
        [
            "--model",
            str(tiny_model),
            "--header-timeout",
            "1",
            "--body-timeout",
            "1",
            "--keep-alive-timeout",
            "1",
        ]
    )
    try:
        server.wait(timeout=60)
        yield server
    finally:
        server.stop()


def assert_serving(server: Server) -> None:
    """A normal request is answered at once, and nothing above counted as a fault."""
    reply = httpx.post(server.url + "/v1/completions", json=NORMAL, timeout=5)
    assert reply.status_code == 200, reply.text
    health = httpx.get(server.url + "/health", timeout=5).json()
    assert health["status"] == "ready" and health["faults"]["total"] == 0, health


# -- timeouts ---------------------------------------------------------------------------------


def test_headers_sent_byte_by_byte_are_cut_off(timeouts) -> None:
    with rawhttp.connect(timeouts.port) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\n")
        took = rawhttp.wait_closed(sock, CLOSED_WITHIN, trickle=b"X-Slow: " + b"a" * 100)
    assert took >= 0.9  # the timeout, not an early refusal
    assert_serving(timeouts)


def test_silent_connection_is_closed(timeouts) -> None:
    with rawhttp.connect(timeouts.port) as sock:
        rawhttp.wait_closed(sock, CLOSED_WITHIN)
    assert_serving(timeouts)


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
        b'{"prompt":',
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        b'a\r\n{"prompt":\r\n',
    ],
    ids=["content-length-unmet", "endless-chunked"],
)
def test_body_that_never_ends_is_408(timeouts, request_bytes) -> None:
    with rawhttp.connect(timeouts.port) as sock:
        started = time.monotonic()
        sock.sendall(request_bytes)
        data, closed = rawhttp.read_until_closed(sock, CLOSED_WITHIN)
        took = time.monotonic() - started
    assert data, f"no answer within {CLOSED_WITHIN} s to a body that never ends"
    response = rawhttp.parse(data, closed)
    rawhttp.assert_raw_envelope(response, 408, "body_timeout")
    assert closed, f"connection still open {took:.1f} s after the 408"
    assert_serving(timeouts)


def test_a_client_still_sending_reads_the_answer_not_a_reset(timeouts) -> None:
    """A body declared over the limit is refused (413) before it is read, while the client
    goes on sending it. The server lingers, reading and dropping, so the client's sends
    succeed and it reads the answer; closing at once made the kernel reset the connection
    (the sends failed after about 3 MB, and many clients never read the 413)."""
    with rawhttp.connect(timeouts.port) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (64 * 2**20)
        )
        for _ in range(16):
            sock.sendall(b"a" * 2**20)
        response = rawhttp.read_response(sock, 5)
    rawhttp.assert_raw_envelope(response, 413, "request_too_large")
    assert_serving(timeouts)


def test_body_sent_in_pieces_within_the_timeout_is_served(timeouts) -> None:
    body = b'{"prompt": "hello", "max_tokens": 2, "temperature": 0}'
    with rawhttp.connect(timeouts.port) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
        )
        for piece in (body[:10], body[10:30], body[30:]):
            time.sleep(0.15)
            sock.sendall(piece)
        response = rawhttp.read_response(sock, 5)
    assert response.status == 200, response


def test_idle_keep_alive_connection_is_closed(timeouts) -> None:
    with rawhttp.connect(timeouts.port) as sock:
        sock.sendall(b"GET /health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert rawhttp.read_response(sock, 5).status == 200
        rawhttp.wait_closed(sock, CLOSED_WITHIN)


# -- the connection cap -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def capped(tiny_model: Path) -> Iterator[Server]:
    server = Server(["--model", str(tiny_model), "--max-connections", "4"])
    try:
        server.wait(timeout=60)
        yield server
    finally:
        server.stop()


MID_BODY = (
    b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    b'{"prompt":'  # headers sent, the body still coming (default body timeout: 30 s)
)


def status_of(server: Server, path: str) -> httpx.Response:
    """GET on a connection of its own."""
    return httpx.get(server.url + path, timeout=5, headers={"connection": "close"})


def test_busy_connections_over_the_cap_get_503_but_probes_are_answered(capped) -> None:
    until(lambda: status_of(capped, "/v1/models").status_code == 200, 5, "serving")
    held = [rawhttp.connect(capped.port) for _ in range(4)]
    try:
        for sock in held:
            sock.sendall(MID_BODY)
        until(  # the server took all 4 in
            lambda: status_of(capped, "/v1/models").status_code == 503, 3, "refusing at the cap"
        )
        refused = status_of(capped, "/v1/models")
        body = assert_envelope(refused, 503, "too_many_connections")
        assert body["error"]["retryable"] is True
        assert int(refused.headers["retry-after"]) >= 1
        live = status_of(capped, "/health/live")
        assert live.status_code == 200, live.text
        health = status_of(capped, "/health")
        assert health.json()["status"] == "ready"
    finally:
        for sock in held:
            sock.close()
    until(lambda: status_of(capped, "/v1/models").status_code == 200, 5, "served again")


def test_idle_connections_over_the_cap_make_room(capped) -> None:
    """Idle sockets cost their owners nothing to reopen: the longest idle one is closed."""
    until(lambda: status_of(capped, "/v1/models").status_code == 200, 5, "serving")
    held = [rawhttp.connect(capped.port) for _ in range(4)]
    try:

        def served_and_evicted() -> bool:  # once the server took all 4 in, the 5th evicts
            served = status_of(capped, "/v1/models")
            assert served.status_code == 200, served.text
            return select.select([held[0]], [], [], 0)[0] != []  # EOF: the longest idle one

        until(served_and_evicted, 3, "the longest idle connection closed")
        rawhttp.wait_closed(held[0], 1)
    finally:
        for sock in held:
            sock.close()


# -- file descriptors -------------------------------------------------------------------------


class LimitedServer(Server):
    """A Server (conftest's, started the same way) under RLIMIT_NOFILE = (nofile, nofile),
    set in the child before it runs steward: its worker inherits the limit too."""

    def __init__(self, args: list[str], nofile: int) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = Path(os.environ["STEWARD_TEST_LOGS"]) / f"server-{self.port}.log"
        self._log_file = self.log.open("w")

        def limit() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "steward", "serve", "--port", str(self.port), *args],
            cwd=ROOT,
            env=dict(os.environ),
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            preexec_fn=limit,
        )
        self.http = httpx.Client(base_url=self.url, timeout=60)


@pytest.fixture
def limited() -> Iterator[Callable[..., LimitedServer]]:
    servers: list[LimitedServer] = []

    def start(*args: str, nofile: int) -> LimitedServer:
        servers.append(LimitedServer(list(args), nofile))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


@contextlib.contextmanager
def own_fd_limit(wanted: int) -> Iterator[None]:
    """This test process may open `wanted` sockets (macOS' soft limit is 256)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        new = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_too_few_file_descriptors_exit_78_saying_so(limited, tiny_model) -> None:
    server = limited("--model", str(tiny_model), nofile=40)
    assert server.exit_code(timeout=30) == 78
    assert "file descriptor" in server.output().lower(), server.output()


def test_low_file_descriptor_limit_lowers_the_cap_and_survives_a_flood(limited, tiny_model) -> None:
    server = limited("--model", str(tiny_model), "--max-connections", "1024", nofile=512)
    server.wait(timeout=60)
    lowered = [
        line
        for line in server.output().splitlines()
        if re.search(r"max.connections", line) and re.search(r"lower|reduc", line, re.I)
    ]
    assert lowered, f"no word of max-connections being lowered:\n{server.output()}"
    before = server.log.stat().st_size
    with own_fd_limit(1024):
        flood = []
        try:
            for _ in range(700):  # at once: non-blocking connects, errors ignored
                sock = socket.socket()
                sock.setblocking(False)
                sock.connect_ex(("127.0.0.1", server.port))
                flood.append(sock)
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline:  # probes answer for as long as the flood stands
                try:
                    live = httpx.get(server.url + "/health/live", timeout=2)
                except httpx.TransportError as exc:
                    pytest.fail(f"/health/live unanswered with 700 sockets open: {exc!r}")
                assert live.status_code == 200, live.text
                time.sleep(0.1)
            grown = server.log.stat().st_size - before
        finally:
            for sock in flood:
                sock.close()
    assert grown < 200_000, f"the log grew {grown} bytes in 2 s:\n{server.output()[-3000:]}"
    assert server.proc.poll() is None

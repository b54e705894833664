"""HTTP over raw sockets, for tests where the bytes on the wire are the point: malformed
requests, slow or endless senders, idle connections.

Every call is bounded by a deadline: a server that never answers or never closes fails the
test in seconds, it never hangs it.
"""

from __future__ import annotations

import json
import select
import socket
import time
from dataclasses import dataclass


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes
    closed: bool  # the server closed the connection after it (EOF or reset)

    def json(self) -> dict:
        return json.loads(self.body)


def connect(port: int, timeout: float = 5.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=timeout)


def read_until_closed(sock: socket.socket, timeout: float) -> tuple[bytes, bool]:
    """All bytes the server sends within `timeout` s, and whether it closed the connection."""
    data = b""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        except (ConnectionResetError, BrokenPipeError):
            return data, True
        if not chunk:
            return data, True
        data += chunk
    return data, False


def parse(data: bytes, closed: bool) -> RawResponse:
    """The first HTTP response in `data` (its body by Content-Length, else up to EOF)."""
    head, sep, rest = data.partition(b"\r\n\r\n")
    assert sep, f"no complete HTTP response: {data[:500]!r}"
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = headers.get("content-length")
    body = rest[: int(length)] if length is not None else rest
    return RawResponse(status, headers, body, closed)


def read_response(sock: socket.socket, timeout: float) -> RawResponse:
    """One whole response (by its Content-Length), leaving the connection as it is."""
    data = b""
    deadline = time.monotonic() + timeout
    while True:
        _, sep, rest = data.partition(b"\r\n\r\n")
        if sep:
            response = parse(data, False)
            length = int(response.headers.get("content-length", "0"))
            if len(rest) >= length:
                return response
        left = deadline - time.monotonic()
        assert left > 0, f"no whole response within {timeout} s: {data[:500]!r}"
        sock.settimeout(left)
        chunk = sock.recv(65536)
        assert chunk, f"closed before the whole response came: {data[:500]!r}"
        data += chunk


def exchange(port: int, request: bytes, timeout: float = 5.0) -> RawResponse:
    """Send `request` whole, read until the server closes (or `timeout`), parse the answer."""
    with connect(port, timeout) as sock:
        sock.sendall(request)
        data, closed = read_until_closed(sock, timeout)
    return parse(data, closed)


def assert_raw_envelope(response: RawResponse, status: int, kind: str) -> dict:
    """The SPEC §4 envelope, for answers that may come from below the app (no request id)."""
    assert response.status == status, (response.status, response.headers, response.body[:500])
    assert response.headers.get("content-type", "").startswith("application/json"), response
    body = response.json()
    assert body["status"] == "error"
    assert body["error"]["type"] == kind, body
    assert body["error"]["message"]
    retryable = body["error"]["retryable"]
    assert isinstance(retryable, bool)
    assert response.headers.get("x-should-retry") == ("true" if retryable else "false")
    return body


def wait_closed(
    sock: socket.socket, within: float, trickle: bytes = b"", every: float = 0.3
) -> float:
    """Seconds until the server closes `sock` (recv gives EOF or a reset, or a send fails),
    sending one byte of `trickle` every `every` s meanwhile; fails after `within` s."""
    started = time.monotonic()
    sent = 0
    while (elapsed := time.monotonic() - started) < within:
        readable, _, _ = select.select([sock], [], [], min(every, within - elapsed))
        if readable:
            try:
                if not sock.recv(65536):  # an answer (a 408, say) may come first
                    return time.monotonic() - started
            except (ConnectionResetError, BrokenPipeError):
                return time.monotonic() - started
            continue
        if sent < len(trickle):
            try:
                sock.sendall(trickle[sent : sent + 1])
            except (ConnectionResetError, BrokenPipeError):
                return time.monotonic() - started
            sent += 1
    raise AssertionError(f"connection still open after {within} s ({sent} bytes trickled)")

"""Bounded connections: what uvicorn's h11 protocol lacks, added in a subclass.

uvicorn closes idle keep-alive connections (`timeout_keep_alive`) and caps a request's
headers at 16 KB (h11), but it lets a client take forever over its headers (slowloris) or
its body, and accepts sockets until the file descriptors run out; its `limit_concurrency`
answers a plain-text 503 to everything, health probes included, and logs each one. Here:

- headers must be complete within `header_timeout` of the connection opening or of the
  previous response's end, else the connection is closed;
- a response that ends while the client is still sending the body closes the connection
  (the body's own timeout is the middleware's, which answers 408 in the envelope), and so
  does a malformed request's 400: lingering, as nginx does, so the client reads the answer
  instead of a reset;
- a connection opened while `max_connections` are open first evicts the connection that
  has waited longest for a request's headers (idle keep-alive, slowloris): an idle socket
  costs its owner nothing to reopen, a probe's request arrives at once. With none to
  evict it is marked (`OVER_CAP` in the request scope's state): the middleware answers
  its request 503 `too_many_connections`, except health probes and metrics, and it closes
  after one response; past the cap plus `HEADROOM`, it is closed as soon as accepted;
- uvicorn's plain-text 400 for malformed HTTP becomes the SPEC §4 envelope.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from dataclasses import dataclass
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from steward.errors import ApiError

OVER_CAP = "steward.over_cap"
HEADROOM = 64  # connections over the cap still read, so probes get their answer
BACKLOG = 128  # listen backlog, and how many connections asyncio accepts in one go
LINGER_IDLE = 0.5  # seconds a lingering close waits for more of what the client sends
LINGER_MAX = 5.0  # seconds it reads, at most

log = logging.getLogger("steward.connections")


@dataclass(frozen=True)
class Limits:
    max_connections: int
    header_timeout: float


class BoundedProtocol(H11Protocol):
    def __init__(self, *args: Any, limits: Limits, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits
        self._headers_due: asyncio.TimerHandle | None = None
        self.waiting_since: float | None = None  # for a request's headers
        self._linger_due: asyncio.TimerHandle | None = None
        self.lingering_until: float | None = None  # closing: reading and dropping until then

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_headers()
        open_now = len(self.connections)
        if open_now <= self.limits.max_connections or self._evict_idle():
            return
        if open_now > self.limits.max_connections + HEADROOM:
            log.warning("%d connections open, none idle: closing new ones at once", open_now)
            transport.abort()
            return
        self.app_state = {**self.app_state, OVER_CAP: True}

    def _evict_idle(self) -> bool:
        """Close the connection that has waited longest for a request's headers."""
        idle = [
            c
            for c in self.connections
            if isinstance(c, BoundedProtocol) and c is not self and c.waiting_since is not None
        ]
        if not idle:
            return False
        oldest = min(idle, key=lambda c: c.waiting_since or 0.0)
        log.warning("%d connections open: closing the longest idle one", len(self.connections))
        oldest.transport.close()
        oldest.connections.discard(oldest)  # its slot is free now, not when the loop gets to it
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self._headers_arrived()
        if self._linger_due is not None:
            self._linger_due.cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.lingering_until is not None:
            self._linger()  # dropped: the answer is out
            return
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._headers_arrived()

    def on_response_complete(self) -> None:
        cycle = self.cycle
        super().on_response_complete()
        if self.transport.is_closing() or self.cycle is not cycle:
            return  # closed, or a pipelined request is already under way
        if self.conn.their_state is h11.SEND_BODY:
            self._close_lingering()
        elif self.app_state.get(OVER_CAP):
            self.transport.close()
        elif self.conn.their_state is h11.IDLE:
            self._await_headers()

    def send_400_response(self, msg: str) -> None:
        request_id = uuid.uuid4().hex
        error = ApiError(
            "validation_error",
            "Malformed HTTP request (request line, headers over 16 KB, or framing such as "
            "Content-Length).",
        )
        body = json.dumps(error.body(request_id)).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"connection", b"close"),
            *((k.encode(), v.encode()) for k, v in error.response_headers(request_id).items()),
        ]
        try:
            for event in (
                h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
                h11.Data(data=body),
                h11.EndOfMessage(),
            ):
                self.transport.write(self.conn.send(event))
        except h11.LocalProtocolError:
            pass  # a response had already started: nothing more can be said
        self._close_lingering()

    def _close_lingering(self) -> None:
        """Close a connection whose client may still be sending. Closing a socket with
        unread input makes the kernel reset the connection, and a client still sending
        then loses the answer to "connection reset". So the answer goes out with a FIN
        (half-close), and what arrives after it is read and dropped until the client closes
        or pauses `LINGER_IDLE`, for `LINGER_MAX` at most (nginx's lingering close)."""
        if self.transport.is_closing() or self.lingering_until is not None:
            return
        self.lingering_until = self.loop.time() + LINGER_MAX
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.flow.resume_reading()  # uvicorn pauses reading a body nobody reads
        self._linger()

    def _linger(self) -> None:
        assert self.lingering_until is not None
        if self._linger_due is not None:
            self._linger_due.cancel()
        left = min(LINGER_IDLE, self.lingering_until - self.loop.time())
        self._linger_due = self.loop.call_later(max(left, 0.0), self.transport.close)

    def _await_headers(self) -> None:
        self._headers_arrived()
        self.waiting_since = self.loop.time()
        self._headers_due = self.loop.call_later(self.limits.header_timeout, self._headers_late)

    def _headers_arrived(self) -> None:
        self.waiting_since = None
        if self._headers_due is not None:
            self._headers_due.cancel()
            self._headers_due = None

    def _headers_late(self) -> None:
        self._headers_due = None
        self.waiting_since = None
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self.transport.close()

"""systemd's notify protocol (sd_notify(3)) in a few lines, instead of a dependency.

Under `Type=notify` the unit counts as started at READY=1, once the model is loaded and
its canary passed, not when the port opens; STATUS puts the state and its reason in
`systemctl status`; EXTEND_TIMEOUT_USEC keeps a slow model load inside the start timeout;
WATCHDOG=1 proves the front's event loop and the supervisor task are alive. The watchdog
never tracks backend health: a sick backend is the supervisor's to handle (recovery, or
exit 75), and a watchdog kill on top would only hide that verdict.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable
from typing import Any

from steward.supervisor.events import Observer
from steward.supervisor.state import State

log = logging.getLogger("steward.notify")

TICK = 5.0  # s between EXTEND_TIMEOUT_USEC messages when there is no faster watchdog
EXTEND_MIN = 30.0  # s each EXTEND_TIMEOUT_USEC grants, at least


class Notifier(Observer):
    """Tells systemd what the supervisor does; a no-op when not started by systemd.

    `address` defaults to $NOTIFY_SOCKET. Sending never raises: the first failure is
    logged at warning, later ones are ignored.
    """

    def __init__(self, supervisor: Any, address: str | None = None) -> None:
        self._supervisor = supervisor
        address = address if address is not None else os.environ.get("NOTIFY_SOCKET")
        self._address = "\0" + address[1:] if address and address[0] == "@" else address
        self._sock: socket.socket | None = None
        if self._address:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sock.setblocking(False)  # a stuck receiver must not block the event loop
        usec = os.environ.get("WATCHDOG_USEC", "")
        ours = os.environ.get("WATCHDOG_PID") in (None, "", str(os.getpid()))
        self._watchdog = ours and usec.isdigit() and int(usec) > 0
        self._tick = int(usec) / 2e6 if self._watchdog else TICK
        self._extend_usec = int(max(3 * self._tick, EXTEND_MIN) * 1e6)
        self._ready = False
        self._warned = False

    def send(self, *assignments: str) -> None:
        """One datagram of `KEY=value` lines."""
        if self._sock is None:
            return
        try:
            self._sock.sendto("\n".join(assignments).encode(), self._address)
        except OSError as exc:
            if not self._warned:
                log.warning("systemd notify to %r failed: %s", self._address, exc)
                self._warned = True

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def state_changed(self, old: State, new: State, reason: str) -> None:
        lines = []
        if new.serving and not self._ready:
            self._ready = True
            lines.append("READY=1")
        if new is State.STOPPING:
            lines.append("STOPPING=1")
        status = f"{new}: {reason}" if reason else str(new)
        self.send(*lines, "STATUS=" + status.replace("\n", " "))

    async def run(self, supervisor_alive: Callable[[], bool]) -> None:
        """Watchdog pings every WATCHDOG_USEC/2 while `supervisor_alive()`, and timeout
        extensions while a model loads; until cancelled (returns at once when disabled)."""
        if self._sock is None:
            return
        while True:
            lines = []
            if self._watchdog and supervisor_alive():
                lines.append("WATCHDOG=1")
            if self._supervisor.snapshot().status in (State.STARTING, State.RECOVERING):
                lines.append(f"EXTEND_TIMEOUT_USEC={self._extend_usec}")
            if lines:
                self.send(*lines)
            await asyncio.sleep(self._tick)

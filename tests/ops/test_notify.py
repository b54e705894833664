"""The notify protocol against real AF_UNIX datagram sockets, as systemd would listen."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable, Iterator
from types import SimpleNamespace

import pytest

from steward.ops.notify import Notifier
from steward.supervisor.state import State


@pytest.fixture
def listener(tmp_path, monkeypatch) -> Iterator[tuple[str, socket.socket]]:
    """A bound notify socket; the environment as systemd leaves it, without a watchdog."""
    for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
        monkeypatch.delenv(name, raising=False)
    path = str(tmp_path / "n")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        sock.setblocking(False)
        yield path, sock


def received(sock: socket.socket) -> list[list[str]]:
    """Every datagram waiting, each as its list of assignments."""
    out = []
    while True:
        try:
            out.append(sock.recv(4096).decode().split("\n"))
        except BlockingIOError:
            return out


def supervisor(state: State = State.STARTING) -> SimpleNamespace:
    """A stand-in whose snapshot's status is its `state`."""
    fake = SimpleNamespace(state=state)
    fake.snapshot = lambda: SimpleNamespace(status=fake.state)
    return fake


def run_for(notifier: Notifier, seconds: float, alive: Callable[[], bool] = lambda: True):
    async def main() -> None:
        task = asyncio.ensure_future(notifier.run(alive))
        await asyncio.sleep(seconds)
        task.cancel()

    asyncio.run(main())


def test_ready_once_status_always_stopping(listener) -> None:
    path, sock = listener
    notifier = Notifier(supervisor(), path)
    notifier.state_changed(State.STARTING, State.READY, "canary passed")
    notifier.state_changed(State.READY, State.RECOVERING, "fault f-3 gpu_timeout")
    notifier.state_changed(State.RECOVERING, State.DEGRADED, "canary passed")
    notifier.state_changed(State.DEGRADED, State.STOPPING, "SIGTERM")
    assert received(sock) == [
        ["READY=1", "STATUS=ready: canary passed"],
        ["STATUS=recovering: fault f-3 gpu_timeout"],
        ["STATUS=degraded: canary passed"],
        ["STOPPING=1", "STATUS=stopping: SIGTERM"],
    ]
    notifier.close()


def test_abstract_address_from_the_environment(listener, monkeypatch) -> None:
    name = f"steward-test-{os.getpid()}"
    monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.setblocking(False)
        notifier = Notifier(supervisor())
        notifier.state_changed(State.STARTING, State.DEGRADED, "slow decode\nline two")
        assert received(sock) == [["READY=1", "STATUS=degraded: slow decode line two"]]
        notifier.close()


def test_watchdog_pings_every_half_interval_while_alive(listener, monkeypatch) -> None:
    path, sock = listener
    monkeypatch.setenv("WATCHDOG_USEC", "200000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    notifier = Notifier(supervisor(State.READY), path)
    run_for(notifier, 1.0)
    pings = [d for d in received(sock) if d == ["WATCHDOG=1"]]
    assert 8 <= len(pings) <= 12  # one at once, then every 0.1 s

    alive = True
    run_for(notifier, 1.0, lambda: alive)
    received(sock)
    alive = False
    run_for(notifier, 0.5, lambda: alive)
    assert received(sock) == []  # a dead supervisor task: systemd's watchdog takes over
    notifier.close()


def test_watchdog_for_another_pid_is_ignored(listener, monkeypatch) -> None:
    path, sock = listener
    monkeypatch.setenv("WATCHDOG_USEC", "200000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))
    notifier = Notifier(supervisor(State.READY), path)
    run_for(notifier, 0.3)
    assert received(sock) == []
    notifier.close()


def test_extends_the_timeout_while_loading(listener, monkeypatch) -> None:
    path, sock = listener
    monkeypatch.setenv("WATCHDOG_USEC", "200000")
    sup = supervisor(State.STARTING)
    notifier = Notifier(sup, path)

    extend = ["WATCHDOG=1", "EXTEND_TIMEOUT_USEC=30000000"]
    grams: list[list[str]] = []

    async def sent(check: Callable[[], bool]) -> None:
        while not check():
            grams.extend(received(sock))
            await asyncio.sleep(0.01)

    async def main() -> None:
        task = asyncio.ensure_future(notifier.run(lambda: True))
        await sent(lambda: grams.count(extend) >= 3)
        sup.state = State.READY
        await sent(lambda: grams[-1] == ["WATCHDOG=1"])
        task.cancel()

    asyncio.run(asyncio.wait_for(main(), 10))
    grams.extend(received(sock))
    assert grams[0] == extend
    assert 3 <= grams.count(extend) <= 5
    assert grams[-1] == ["WATCHDOG=1"]
    assert grams.index(["WATCHDOG=1"]) == grams.count(extend)  # no extension once ready
    notifier.close()


def test_without_systemd_nothing_happens(listener) -> None:
    notifier = Notifier(supervisor())
    notifier.state_changed(State.STARTING, State.READY, "canary passed")
    asyncio.run(asyncio.wait_for(notifier.run(lambda: True), 1.0))  # returns at once


def test_send_failure_warns_once_and_never_raises(tmp_path, caplog) -> None:
    notifier = Notifier(supervisor(), str(tmp_path / "nobody"))
    with caplog.at_level(logging.WARNING, "steward.notify"):
        notifier.state_changed(State.STARTING, State.READY, "canary passed")
        notifier.state_changed(State.READY, State.STOPPING, "SIGTERM")
    assert len(caplog.records) == 1
    assert "systemd notify" in caplog.records[0].getMessage()
    notifier.close()

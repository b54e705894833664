"""The front's handle on one worker process: spawn, talk, stop, kill.

`spawn` (never fork): the front runs threads and an event loop, which fork would copy
half-way; a spawned child starts clean and imports mlx itself. Death is seen as EOF on
the socketpair (the child holds the only other end), so no sentinel thread is needed.

A process may be started `ahead` of need, before its settings exist: it imports the
worker's runtime and waits for them (`hand`), its first frame, pickled as `spawn` would
have pickled them; from then on it is any worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import multiprocessing
import os
import pickle
import signal
import socket
from collections.abc import Callable
from typing import Protocol, Self

from steward.wire.channel import AsyncChannel
from steward.wire.protocol import FromWorker, Shutdown, ToWorker, decode_from_worker, encode
from steward.wire.settings import WorkerSettings

_spawn = multiprocessing.get_context("spawn")


class Worker(Protocol):
    """What the supervisor holds of a worker: one process, or a group of ranks seen as one
    (ranks/group.py)."""

    @property
    def pid(self) -> int: ...

    @property
    def exitcode(self) -> int | None: ...

    def send(self, msg: ToWorker) -> None: ...

    async def recv(self) -> FromWorker: ...

    def state(self) -> list[dict[str, object]]: ...

    async def stop(self, timeout: float) -> None: ...

    async def kill(self) -> None: ...

    async def wait(self, timeout: float) -> bool: ...


class WorkerProcess:
    def __init__(self, process: multiprocessing.process.BaseProcess, channel: AsyncChannel):
        self.process = process
        self.channel = channel

    @classmethod
    async def spawn(cls, settings: WorkerSettings) -> WorkerProcess:
        return await cls._start(_child, settings, f"steward-worker-{settings.generation}")

    @classmethod
    async def ahead(cls) -> WorkerProcess:
        """A worker started before its settings exist (`hand` gives them)."""
        return await cls._start(_ahead, None, "steward-worker-ahead")

    @classmethod
    async def _start(
        cls, target: Callable[..., None], settings: WorkerSettings | None, name: str
    ) -> Self:
        ours, theirs = socket.socketpair()
        args = (theirs,) if settings is None else (theirs, settings)
        process = _spawn.Process(target=target, args=args, name=name)
        process.daemon = True
        process.start()
        theirs.close()
        return cls(process, await AsyncChannel.open(ours))

    def hand(self, settings: WorkerSettings) -> None:
        """A process started `ahead`: what it is to be."""
        self.channel.send(pickle.dumps(settings))

    @property
    def pid(self) -> int:
        return self.process.pid or 0

    @property
    def exitcode(self) -> int | None:
        return self.process.exitcode

    def send(self, msg: ToWorker) -> None:
        self.channel.send(encode(msg))

    def state(self) -> list[dict[str, object]]:
        """Its ranks, as /health shows them: none, for one process."""
        return []

    async def recv(self) -> FromWorker:
        """Next message; EOFError once the worker is gone."""
        return decode_from_worker(await self.channel.recv())

    async def stop(self, timeout: float) -> None:
        """Polite, then firm: Shutdown, wait, SIGKILL (the worker ignores SIGTERM)."""
        self.send(Shutdown())
        if not await self.wait(timeout):
            await self.kill()
        self.channel.close()

    async def kill(self) -> None:
        """SIGKILL and reap, without letting an unkillable child block the event loop."""
        if self.process.exitcode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, 9)
        await self.wait(5.0)
        self.channel.close()

    async def wait(self, timeout: float) -> bool:
        """Reap the process within `timeout` s, in a thread; True if it has exited."""
        await asyncio.to_thread(self.process.join, timeout)
        return self.process.exitcode is not None


ENTRY = "steward.worker.main"  # its `run(sock, settings)`: named, never imported by the front


def _child(sock: socket.socket, settings: WorkerSettings) -> None:
    """The spawned process's entry: the worker's code is imported there alone."""
    importlib.import_module(ENTRY).run(sock, settings)


def _ahead(sock: socket.socket) -> None:
    """A process started ahead's entry: its `ahead(sock)` imports, then waits."""
    importlib.import_module(ENTRY).ahead(sock)


def describe_exit(code: int | None) -> str:
    """`-11` -> 'killed by SIGSEGV'."""
    if code is None:
        return "did not exit"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"

"""The next worker's process, started ahead of need (`--process-ahead`).

A bring-up on a GPU host is its process's start and imports (about 3 s on an H200, and most
of a CPU's), the device, the weights' load, the warm-up of shapes and the canary. The first
two need nothing of the model or the device, so one process is kept that has done them and
waits for its settings (wire/process.py `ahead`): the next worker spawned, whether a
replacement after a fault, a spare behind a promotion, or another model's first worker,
takes it and starts at the device. One is started each time a worker says it is ready, so
it never competes with a load that clients wait for; it holds no device memory and no
model, only the runtime's host memory (a few hundred MB).

`auto` keeps one where the workers run on a GPU: there its imports run on the host's other
cores while the device serves. On a CPU they would take the cores the batch decodes on, and
a whole bring-up takes seconds anyway; `on` keeps one there too. A worker with a memory
limit (whose imports must fall under it) or a group of ranks starts as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from steward.ranks import spawn_worker
from steward.supervisor.link import WorkerLink
from steward.wire.process import WorkerProcess
from steward.wire.protocol import Ready
from steward.wire.settings import WorkerSettings

log = logging.getLogger("steward.supervisor")

MODES = ("auto", "on", "off")


class Ahead:
    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.process: WorkerProcess | None = None  # the one waiting, if any
        self._starting: asyncio.Task[None] | None = None
        self._closed = False

    async def spawn(self, settings: WorkerSettings) -> WorkerLink:
        """The worker for `settings`: the process ahead where one waits and may serve them,
        else a new one. Its line tells this when it is ready (the next one starts)."""
        worker = self._take(settings) if _takes(settings) else None
        if worker is None:
            worker = await spawn_worker(settings)
        else:
            log.info("worker %d is the process started ahead", settings.generation)
        return WorkerLink(worker, settings.generation, up=self._up)

    async def close(self) -> None:
        self._closed = True
        if self._starting is not None:
            self._starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._starting
        if self.process is not None:
            await self.process.kill()
            self.process = None

    def _take(self, settings: WorkerSettings) -> WorkerProcess | None:
        process, self.process = self.process, None
        if process is None or process.exitcode is not None:
            return None
        process.hand(settings)
        return process

    def _up(self, ready: Ready) -> None:
        """A worker is ready: the next process starts ahead, where the mode keeps one."""
        wanted = self.mode == "on" or (self.mode == "auto" and ready.device == "gpu")
        idle = self._starting is None or self._starting.done()
        if wanted and idle and self.process is None and not self._closed:
            self._starting = asyncio.ensure_future(self._start())

    async def _start(self) -> None:
        self.process = await WorkerProcess.ahead()
        log.info("a worker's process started ahead (pid %d)", self.process.pid)


def _takes(settings: WorkerSettings) -> bool:
    """A process ahead may become this worker: one process, no memory limit to start under."""
    return settings.ranks == 1 and not settings.memory_limit

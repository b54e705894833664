"""The supervisor's line to one worker: its messages, its heartbeat, its silence, its death.

Everything that can go wrong on that line becomes a `FaultError` with a classified `Fault`:
a `Failed` message (classified from its text), EOF (`worker_crash`, with how it died), no
message within a timeout (`stall`). The supervisor above decides what to do about it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from steward.supervisor.faults import STALL, WORKER_CRASH, Fault, classify, describe_exit
from steward.worker.main import WorkerSettings
from steward.worker.process import WorkerProcess
from steward.worker.protocol import (
    Done,
    Failed,
    FromWorker,
    Heartbeat,
    LoadFailed,
    Ready,
    Rejected,
    Token,
    ToWorker,
)


class FaultError(Exception):
    def __init__(self, fault: Fault) -> None:
        super().__init__(fault.message)
        self.fault = fault


class WorkerLink:
    def __init__(self, worker: WorkerProcess, generation: int) -> None:
        self.worker = worker
        self.generation = generation
        self.heartbeat = time.monotonic()
        self._inbox: asyncio.Queue[FromWorker | None] = asyncio.Queue()
        self._pump = asyncio.ensure_future(self._read())

    @classmethod
    async def spawn(cls, settings: WorkerSettings) -> WorkerLink:
        return cls(await WorkerProcess.spawn(settings), settings.generation)

    @property
    def pid(self) -> int:
        return self.worker.pid

    def send(self, msg: ToWorker) -> None:
        self.worker.send(msg)

    def fault(self, cls: str, message: str, traceback: str = "") -> Fault:
        return Fault(cls, message, self.generation, traceback=traceback)

    async def next(self) -> FromWorker:
        """The next message, waiting as long as it takes; FaultError if the worker died."""
        msg = await self._inbox.get()
        if msg is None:
            raise FaultError(await self._crash())
        return msg

    async def receive(self, timeout: float, what: str) -> FromWorker:
        """The next message; none within `timeout` s is a stall of `what`."""
        try:
            async with asyncio.timeout(timeout):  # no extra task per message, unlike wait_for
                return await self.next()
        except TimeoutError:
            fault = self.fault(STALL, f"no progress on the {what} for {timeout:.0f} s")
            raise FaultError(fault) from None

    async def loaded(self, timeout: float) -> Ready | LoadFailed:
        while not isinstance(msg := await self.receive(timeout, "model load"), Ready | LoadFailed):
            pass
        return msg

    async def follow(
        self, req_id: int, on_token: Callable[[Token], None], timeout: float, what: str
    ) -> Done | Rejected:
        """Pump one generation's messages until it ends; a backend failure raises FaultError."""
        while True:
            msg = await self.receive(timeout, what)
            if isinstance(msg, Token) and msg.id == req_id:
                on_token(msg)
            elif isinstance(msg, Done | Rejected) and msg.id == req_id:
                return msg
            elif isinstance(msg, Failed) and msg.id == req_id:
                raise FaultError(self.fault(classify(msg.message), msg.message, msg.traceback))

    def silent_for(self) -> float:
        return time.monotonic() - self.heartbeat

    async def kill(self) -> None:
        await self.worker.kill()

    async def stop(self, timeout: float) -> None:
        await self.worker.stop(timeout)

    async def _read(self) -> None:
        """Heartbeats update the clock; everything else goes to the inbox; None marks EOF."""
        try:
            while True:
                msg = await self.worker.recv()
                if isinstance(msg, Heartbeat):
                    self.heartbeat = time.monotonic()
                else:
                    self._inbox.put_nowait(msg)
        except EOFError:
            self._inbox.put_nowait(None)

    async def _crash(self) -> Fault:
        await self.worker.wait(2.0)
        return self.fault(WORKER_CRASH, f"worker {describe_exit(self.worker.exitcode)}")

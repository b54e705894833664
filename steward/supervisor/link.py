"""The supervisor's line to one worker: the token path, and the worker's faults and death.

The token path runs here, not in the supervision loop: each `Step` the worker sends (one
per decode step, every batch member's new token) is routed by request id to the sink that
started the request, in the order it arrived; a finished request's sink is dropped. The
loop above only decides: what to start next, and what to do about a fault.

Everything that can go wrong on the line resolves `failure` with a classified `Fault`: a
`Failed` message (classified from its text), EOF (`worker_crash`, with how it died). Silence
(`stall`) is the loop's to judge, from `progress` and `heartbeat`; each step's clock goes to
`clocks` (the model's stall bounds), and `stepped()` is how a suspected worker's verdict
waits for its next step.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from steward.ranks import spawn_worker
from steward.supervisor.faults import Fault, FaultClass, classify
from steward.supervisor.line import FaultError, Sink
from steward.wire.process import Worker, describe_exit
from steward.wire.protocol import (
    Calibrated,
    Calibration,
    Done,
    Failed,
    Generate,
    Heartbeat,
    LoadFailed,
    Ready,
    Rejected,
    Shaping,
    Step,
    StepClock,
    ToWorker,
    Warm,
)
from steward.wire.settings import WorkerSettings

log = logging.getLogger("steward.link")


class WorkerLink:
    """The real line (a `Link`): a worker's socket (one process, or a group of ranks),
    read by one task."""

    def __init__(
        self, worker: Worker, generation: int, up: Callable[[Ready], None] | None = None
    ) -> None:
        self.worker = worker
        self.generation = generation
        self.up = up or (lambda ready: None)  # told when the worker says it is ready
        self.heartbeat = self.progress = time.monotonic()
        self.last_step = 0.0  # when its last Step came (monotonic; 0: none yet)
        self.clocks: Callable[[StepClock], None] = lambda clock: None
        self.calibrated: Callable[[Calibration], None] = lambda calibration: None
        self.calibrating = False  # it said so in `Ready`, until `Calibrated`
        self.shaping = False  # it said so (`Shaping`), until its next step
        self._sinks: dict[int, Sink] = {}  # routing, by request id: the line's alone
        self._stepped: list[asyncio.Future[None]] = []
        self.failure: asyncio.Future[Fault] = asyncio.get_running_loop().create_future()
        self._crashed: Fault | None = None
        self._bug: Exception | None = None
        self._control: asyncio.Queue[Ready | Warm | LoadFailed | None] = asyncio.Queue()
        self._pump = asyncio.ensure_future(self._read())

    @classmethod
    async def spawn(cls, settings: WorkerSettings) -> WorkerLink:
        return cls(await spawn_worker(settings), settings.generation)

    @property
    def pid(self) -> int:
        return self.worker.pid

    def send(self, msg: ToWorker) -> None:
        self.worker.send(msg)

    def start(self, req: Generate, sink: Sink) -> None:
        """Send a request; what the worker says of it goes to `sink` until it ends."""
        self._sinks[req.id] = sink
        self.worker.send(req)

    def forget(self, request_id: int) -> bool:
        """Its news goes nowhere from now on: True if it was still routed."""
        return self._sinks.pop(request_id, None) is not None

    def forget_all(self) -> None:
        """Every request's news goes nowhere (the batch faulted)."""
        self._sinks.clear()

    @property
    def ranks(self) -> list[dict[str, object]]:
        """The worker's ranks, where it is a group of them (ranks/group.py)."""
        return self.worker.state()

    @property
    def alive(self) -> bool:
        """The process has not exited (it may still be hung)."""
        return self.worker.exitcode is None

    def rearm(self) -> None:
        """After a fault the worker survived (the canary passed): watch for the next one."""
        self.failure = asyncio.get_running_loop().create_future()
        if self._bug is not None:
            self.failure.set_exception(self._bug)
        elif self._crashed is not None:
            self.failure.set_result(self._crashed)

    def fault(self, cls: str, message: str, traceback: str = "") -> Fault:
        return Fault(cls, message, self.generation, traceback=traceback)

    async def loaded(self, timeout: float, what: str = "model load") -> Ready | Warm | LoadFailed:
        """The worker's word on starting up (a warm spare's, or the model's load);
        FaultError if it died, or said nothing within `timeout`."""
        try:
            async with asyncio.timeout(timeout):
                msg = await self._control.get()
        except TimeoutError:
            stall = self.fault(FaultClass.STALL, f"no progress on the {what} for {timeout:.0f} s")
            raise FaultError(stall) from None
        if msg is None:
            raise FaultError(await self.failure)
        return msg

    def stepped(self) -> asyncio.Future[None]:
        """Resolved when the next Step comes: the worker made progress."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._stepped.append(future)
        return future

    async def kill(self) -> None:
        await self.worker.kill()

    async def stop(self, timeout: float) -> None:
        """Polite, then firm: Shutdown, up to `timeout` s, then SIGKILL."""
        await self.worker.stop(timeout)

    async def _read(self) -> None:
        """Route every message; a bug here ends the supervision loop (exit 70), it is never
        swallowed."""
        try:
            while True:
                msg = await self.worker.recv()
                now = time.monotonic()
                self.heartbeat = now
                if isinstance(msg, Heartbeat):
                    continue
                if isinstance(msg, Shaping):  # no progress: what it says is of the next step
                    self.shaping = True
                    continue
                self.progress = now
                if isinstance(msg, Step):
                    self._stepped_now(now, msg.clock)
                    self._route(msg)
                elif isinstance(msg, Rejected):
                    self._finish(msg)
                elif isinstance(msg, Failed):
                    self._fail(self.fault(classify(msg.message), msg.message, msg.traceback))
                elif isinstance(msg, Calibrated):
                    self.calibrating = False
                    self.calibrated(msg.calibration)
                else:
                    if isinstance(msg, Ready):
                        self.calibrating = msg.calibrating
                        self.up(msg)
                    self._control.put_nowait(msg)
        except EOFError:
            await self.worker.wait(2.0)
            self._crashed = self.fault(
                FaultClass.WORKER_CRASH, f"worker {describe_exit(self.worker.exitcode)}"
            )
            self._fail(self._crashed)
            self._control.put_nowait(None)
        except Exception as exc:
            log.critical("bug on the worker line", exc_info=True)
            self._bug = exc  # kept: `rearm` raises it too, so the loop ends (exit 70)
            if not self.failure.done():
                self.failure.set_exception(exc)

    def _stepped_now(self, now: float, clock: StepClock | None) -> None:
        self.last_step = now
        self.shaping = False
        if clock is not None:
            self.clocks(clock)
        waiting, self._stepped = self._stepped, []
        for future in waiting:
            if not future.done():
                future.set_result(None)

    def _route(self, step: Step) -> None:
        for admitted in step.admitted:
            if sink := self._sinks.get(admitted.id):
                sink.admitted(admitted.prefill)
        for token in step.tokens:
            if sink := self._sinks.get(token.id):
                sink.token(token)
        for done in step.done:
            self._finish(done)

    def _finish(self, msg: Done | Rejected) -> None:
        if sink := self._sinks.pop(msg.id, None):
            sink.finished(msg)

    def _fail(self, fault: Fault) -> None:
        if not self.failure.done():
            self.failure.set_result(fault)

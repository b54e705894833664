"""A fake worker line for testing the supervisor's decisions in milliseconds.

`FakeLink` is a `Link` (line.py), what the supervisor needs of a worker's line; a `Script`
shared by every fake worker (it outlives a replacement, as the backend's behaviour would)
says what each canary does and which attempts of which request fault, and how. Answers are
delivered on the event loop, as the real line's reader delivers them: a fault at once, an
answer a little later, so the requests started together are in flight together. It speaks
what the real worker speaks: a step clock with every token's step (the first step of a
worker's life a new shape), a `Ready` with its device, calibration and phases, and a
heartbeat that stays fresh while it lives (a hung step leaves the worker's heartbeat thread
free), unless the script starves it.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field

import msgspec

from steward.supervisor.faults import Fault, FaultClass
from steward.supervisor.line import Link, Sink
from steward.wire.protocol import (
    Calibration,
    Cancel,
    Done,
    Generate,
    Load,
    Ready,
    Rejected,
    StepClock,
    Token,
    ToWorker,
    Warm,
)
from steward.wire.settings import WorkerSettings

GOLDEN = tuple(range(11, 19))  # the canary's MAX_TOKENS
TOKENS = 4  # a request's answer
ANSWER_AFTER = 0.02  # seconds
STEP = 0.002  # seconds each step says it took
CALIBRATION = Calibration(32, 1000.0, 512)  # what the first worker measured
PROVISIONAL = 8  # the width a worker serves while it measures

_pids = itertools.count(1000)


@dataclass
class Script:
    canaries: list[str] = field(default_factory=list)  # "pass" (default), "fail", "mismatch"
    faults: dict[int, list[FaultClass | None]] = field(default_factory=dict)  # by seq, attempt
    sent_before_fault: int = 1  # tokens a faulting request emits before the fault
    poison: set[int] = field(default_factory=set)  # seqs that poison the worker, any attempt
    poison_after: int = 0  # tokens a poison request's first attempt emits before its fault
    gate: asyncio.Event | None = None  # set: answers wait for it after their first token
    prefill: dict[int, int] = field(default_factory=dict)  # seq -> tokens it says it prefills
    delay: dict[int, float] = field(default_factory=dict)  # seq -> seconds before its answer
    # seq -> seconds a request's first attempt is silent after its first token, before the
    # rest: one slow step (longer than the ceiling: a hang that comes back too late)
    pause: dict[int, float] = field(default_factory=dict)
    hang: set[int] = field(default_factory=set)  # seqs silent after their first token, any attempt
    replacements: asyncio.Event | None = None  # set: a worker after the first waits for it
    retire: asyncio.Event | None = None  # set: each worker's `retire` to begin with
    starved: bool = False  # heartbeats stop too, as on a machine that does not run the worker
    device: str = "gpu"
    calibrating: bool = False  # the first worker measures between requests (no calibration)
    model_bytes: int = 2**30
    memory_bytes: int = 24 * 2**30
    links: list[FakeLink] = field(default_factory=list)
    started: list[Generate] = field(default_factory=list)  # every request sent, in order
    in_flight: list[int] = field(default_factory=list)  # client requests in flight, per start
    faulted_at: list[int] = field(default_factory=list)  # len(started) at each fault

    settings: list[WorkerSettings] = field(default_factory=list)  # each worker's, in order

    async def spawn(self, settings: WorkerSettings) -> FakeLink:
        if self.replacements is not None and settings.generation > 1:
            await self.replacements.wait()
        link = FakeLink(self, settings.generation, settings.warm)
        assert isinstance(link, Link)  # every member the supervisor may use is there
        self.links.append(link)
        self.settings.append(settings)
        return link


class FakeLink:
    def __init__(self, script: Script, generation: int, warm: bool = False) -> None:
        self.script = script
        self.generation = generation
        self.warm = warm  # a warm spare: answers `Warm` until told to `Load`
        self.canaries: list[str] = []  # the canaries it ran
        self.pid = next(_pids)
        self.sinks: dict[int, Sink] = {}  # its own routing, as the real line's
        self.failure: asyncio.Future[Fault] = asyncio.get_running_loop().create_future()
        self.started = self.progress = time.monotonic()
        self.last_step = 0.0
        self.clocks = lambda clock: None
        self.calibrated = lambda calibration: None
        self.calibrating = False
        self.shaping = False
        self.steps = 0
        self._stepped: list[asyncio.Future[None]] = []
        self.killed = False
        self.stopped = False  # asked politely
        self.poisoned = False  # every later call raises, its canary too (SPEC §6 `poison`)
        self.retire = script.retire  # set: told to stop or killed, it waits for this first
        self.loop = asyncio.get_running_loop()

    async def loaded(self, timeout: float, what: str = "") -> Ready | Warm:
        if self.warm:
            return Warm(self.pid)
        s = self.script
        phases = {"imports": 0.001, "load": 0.001}
        self.calibrating = s.calibrating and self.generation == 1
        return Ready(
            self.pid,
            4096,
            16,
            PROVISIONAL if self.calibrating else CALIBRATION.max_batch,
            0.0,
            s.model_bytes,
            s.memory_bytes,
            calibration=None if self.calibrating else CALIBRATION,
            calibrating=self.calibrating,
            phases=phases,
            device=s.device,
        )

    def measured(self) -> None:
        """It has measured its calibration between requests (`Calibrated`)."""
        self.calibrating = False
        self.calibrated(CALIBRATION)

    @property
    def heartbeat(self) -> float:
        """Fresh while it lives, unless the machine starves it: then it is heard from only
        when it steps."""
        alive = not self.killed and not self.script.starved
        return time.monotonic() if alive else self.progress

    def stepped(self) -> asyncio.Future[None]:
        future = self.loop.create_future()
        self._stepped.append(future)
        return future

    def _step(self, seconds: float = STEP, members: int = 0) -> None:
        """One engine step, as the real line sees it: progress, and its clock."""
        self.progress = self.last_step = time.monotonic()
        members = members or max(1, self._members())
        self.clocks(StepClock(members, 0, seconds, new_shape=self.steps == 0, chunk=512))
        self.steps += 1
        waiting, self._stepped = self._stepped, []
        for future in waiting:
            if not future.done():
                future.set_result(None)

    def fault(self, cls: str, message: str, traceback: str = "") -> Fault:
        return Fault(FaultClass(cls), message, self.generation, traceback=traceback)

    def rearm(self) -> None:
        self.failure = self.loop.create_future()

    @property
    def ranks(self) -> list[dict[str, object]]:
        return []

    @property
    def alive(self) -> bool:
        return not self.killed

    async def kill(self) -> None:
        await self._retire()
        self.killed = True

    async def stop(self, timeout: float) -> None:
        await self._retire()
        self.killed = self.stopped = True

    async def _retire(self) -> None:
        if self.retire is not None:
            await self.retire.wait()

    def send(self, msg: ToWorker) -> None:
        if isinstance(msg, Load):
            self.warm = False
        if isinstance(msg, Cancel) and (sink := self.sinks.pop(msg.id, None)):
            self.loop.call_soon(sink.finished, Done(msg.id, "cancelled", 3, 0, 0.0, 0.0))

    def forget(self, request_id: int) -> bool:
        return self.sinks.pop(request_id, None) is not None

    def forget_all(self) -> None:
        self.sinks.clear()

    def start(self, req: Generate, sink: Sink) -> None:
        self.sinks[req.id] = sink
        if req.id < 0:
            self.loop.call_soon(self._canary, req)
            return
        s = self.script
        s.started.append(req)
        s.in_flight.append(self._members())
        if req.seq in s.prefill:
            sink.admitted(s.prefill[req.seq])
        if self.poisoned or req.seq in s.poison:
            self.poisoned = True
            sent = s.poison_after if req.seq in s.poison and req.attempt == 1 else 0
            self.loop.call_soon(self._answer, req, FaultClass.GPU_TIMEOUT, sent)
            return
        plan = s.faults.get(req.seq, [])
        fault = plan[req.attempt - 1] if req.attempt <= len(plan) else None
        if fault is not None:
            self.loop.call_soon(self._answer, req, fault, s.sent_before_fault)
        elif req.seq in s.hang or (req.seq in s.pause and req.attempt == 1):
            self.loop.call_soon(self._stall, req, s.pause.get(req.seq))
        elif s.gate is not None:
            self.loop.call_soon(self._first, req)
        else:
            self.loop.call_later(s.delay.get(req.seq, ANSWER_AFTER), self._answer, req, None)

    def _first(self, req: Generate) -> None:
        """Two tokens at once (past its first step), the rest once the gate opens."""
        if req.id not in self.sinks:
            return
        start = 100 + len(req.resume)
        self._emit(req, [start, start + 1], None)
        gate = self.script.gate
        assert gate is not None

        async def later() -> None:
            await gate.wait()
            resume = [*req.resume, start, start + 1]
            self._answer(msgspec.structs.replace(req, resume=resume), None)

        self.loop.create_task(later())

    def _stall(self, req: Generate, pause: float | None) -> None:
        """Its first token, then silence: for `pause` s (one slow step, after which the
        rest follows, if anyone still listens), or for good."""
        if req.id not in self.sinks:
            return
        self._emit(req, [100 + len(req.resume)], None)
        if pause is not None:
            self.loop.call_later(pause, self._resumed, req, pause, self._members())

    def _members(self) -> int:
        return sum(1 for i in self.sinks if i >= 0)

    def _resumed(self, req: Generate, pause: float, members: int) -> None:
        self._step(pause, members)  # the slow step ends: progress, whoever listens
        resume = [*req.resume, 100 + len(req.resume)]
        self._answer(msgspec.structs.replace(req, resume=resume), None)

    def _canary(self, req: Generate) -> None:
        outcome = self.script.canaries.pop(0) if self.script.canaries else "pass"
        self.canaries.append(outcome)
        if outcome == "fail" or self.poisoned:
            self._fail(FaultClass.GPU_TIMEOUT)
            return
        tokens = GOLDEN if outcome == "pass" else (9,) * len(GOLDEN)
        self._emit(req, tokens, Done(req.id, "length", 5, len(tokens), 0.01, 10.0))

    def _answer(self, req: Generate, fault: FaultClass | None, sent: int = 0) -> None:
        if req.id not in self.sinks:
            return
        done = len(req.resume)
        if fault is None:
            tokens = range(100 + done, 100 + TOKENS)
            batch = self._members()
            self._emit(req, tokens, Done(req.id, "length", 3, TOKENS, 0.01, 20.0, batch=batch))
            return
        self._emit(req, range(100 + done, 100 + done + sent), None)
        if fault is not FaultClass.STALL:  # a stall says nothing at all
            self._fail(fault)

    def _emit(self, req: Generate, tokens, done: Done | Rejected | None) -> None:
        sink = self.sinks[req.id]
        for token in tokens:
            self._step()
            sink.token(Token(req.id, token, f" t{token}"))
        if done is not None:
            del self.sinks[req.id]
            sink.finished(done)

    def _fail(self, cls: FaultClass) -> None:
        self.script.faulted_at.append(len(self.script.started))
        if not self.failure.done():
            self.failure.set_result(self.fault(cls, f"{cls} [fake]"))

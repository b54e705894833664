"""What the supervisor needs of a line to one worker (`Link`), and the pieces it shares.

`WorkerLink` (link.py) is the real line; the decision tests' `FakeLink` is another. The
line owns its routing table: a request's news goes to the `Sink` it was started with until
it ends or the supervisor has the line `forget` it; nobody else touches the table.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from steward.supervisor.faults import Fault
from steward.wire.protocol import (
    Calibration,
    Done,
    Generate,
    LoadFailed,
    Ready,
    Rejected,
    StepClock,
    Token,
    ToWorker,
    Warm,
)


@dataclass(frozen=True)
class Sink:
    """Where one request's news goes: each token, its admission (how many prompt tokens
    it prefills), its end."""

    token: Callable[[Token], None]
    finished: Callable[[Done | Rejected], None]
    admitted: Callable[[int], None] = lambda prefill: None


class FaultError(Exception):
    def __init__(self, fault: Fault) -> None:
        super().__init__(fault.message)
        self.fault = fault


@runtime_checkable
class Link(Protocol):
    """A worker's line as the supervisor uses it. Times are monotonic."""

    clocks: Callable[[StepClock], None]  # each step's clock goes here (the stall bounds)
    calibrated: Callable[[Calibration], None]  # what it measured between requests goes here
    calibrating: bool  # it measures between requests: a step may build kernels, unannounced
    shaping: bool  # it said its next step is of a new shape (`Shaping`), until that step
    failure: asyncio.Future[Fault]  # resolved by the line's first fault (`rearm`: the next)

    @property
    def generation(self) -> int: ...

    @property
    def pid(self) -> int: ...

    @property
    def alive(self) -> bool:
        """The process has not exited (it may still be hung)."""
        ...

    @property
    def heartbeat(self) -> float:
        """When the worker was last heard from at all."""
        ...

    @property
    def progress(self) -> float:
        """When it last said something other than a heartbeat."""
        ...

    @property
    def last_step(self) -> float:
        """When its last step came (0: none yet)."""
        ...

    @property
    def ranks(self) -> list[dict[str, object]]:
        """The worker's ranks, where it is a group of them (empty for one process)."""
        ...

    def send(self, msg: ToWorker) -> None: ...

    def start(self, req: Generate, sink: Sink) -> None:
        """Send a request; what the worker says of it goes to `sink` until it ends."""
        ...

    def forget(self, request_id: int) -> bool:
        """Its news goes nowhere from now on: True if it was still routed."""
        ...

    def forget_all(self) -> None:
        """Every request's news goes nowhere (the batch faulted)."""
        ...

    def rearm(self) -> None: ...

    def fault(self, cls: str, message: str, traceback: str = "") -> Fault: ...

    async def loaded(self, timeout: float, what: str = ...) -> Ready | Warm | LoadFailed: ...

    def stepped(self) -> asyncio.Future[None]: ...

    async def kill(self) -> None: ...

    async def stop(self, timeout: float) -> None: ...

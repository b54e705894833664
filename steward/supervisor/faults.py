"""Fault classification: every failure the worker reports or suffers gets one class here.

The message patterns of Metal, CUDA and CPU backends live in this file and nowhere else.
A class decides the first response (SPEC §3): `oom` and the backend errors get a canary,
`worker_crash`, `stall` and `canary_mismatch` get a new worker.
"""

from __future__ import annotations

import itertools
import logging
import re
import signal
import time
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from steward.supervisor.events import Observer


class FaultClass(StrEnum):
    OOM = "oom"
    GPU_TIMEOUT = "gpu_timeout"
    GPU_ERROR = "gpu_error"
    BACKEND_ERROR = "backend_error"
    WORKER_CRASH = "worker_crash"
    STALL = "stall"
    CANARY_MISMATCH = "canary_mismatch"


class Outcome(StrEnum):
    """What became of the worker: `/metrics` labels come from this, never from the text
    written for people (`Fault.action`)."""

    PENDING = "pending"
    KEPT = "kept_worker"  # the canary passed
    REPLACED = "replaced_worker"
    PROMOTED = "promoted_standby"  # the spare took over
    DISCARDED = "discarded_worker"  # a new worker that could not come up
    EXIT = "exit"


# Classes that may be the device's rather than the process's: a hot spare, which shares the
# device, runs the canary once more before it serves.
DEVICE_FAULTS = frozenset(
    {FaultClass.GPU_TIMEOUT, FaultClass.GPU_ERROR, FaultClass.CANARY_MISMATCH}
)

# Classes whose worker may still be healthy: a canary decides.
CANARY_DECIDES = frozenset(
    {FaultClass.OOM, FaultClass.GPU_TIMEOUT, FaultClass.GPU_ERROR, FaultClass.BACKEND_ERROR}
)

_PATTERNS: list[tuple[FaultClass, re.Pattern[str]]] = [
    (
        FaultClass.OOM,
        re.compile(
            r"out of memory|insufficient memory|resource limit exceeded|MemoryError"
            r"|std::bad_alloc|failed to allocate|unable to allocate|cudaErrorMemoryAllocation"
            r"|kIOGPUCommandBufferCallbackErrorOutOfMemory|maximum allowed buffer size",
            re.IGNORECASE,
        ),
    ),
    (
        FaultClass.GPU_TIMEOUT,
        re.compile(
            r"GPU Timeout|kIOGPUCommandBufferCallbackErrorTimeout|watchdog"
            r"|cudaErrorLaunchTimeout",
            re.IGNORECASE,
        ),
    ),
    (
        FaultClass.GPU_ERROR,
        re.compile(
            r"\[METAL\]|\[metal::|command buffer|kIOGPU|\bCUDA\b|cuda[A-Z]\w*|\bcublas|\bcudnn"
            r"|NCCL|illegal memory access|device-side assert|GPU",
            re.IGNORECASE,
        ),
    ),
]

log = logging.getLogger("steward.faults")


def classify(message: str) -> FaultClass:
    """The class of an exception message raised by the backend."""
    for name, pattern in _PATTERNS:
        if pattern.search(message):
            return name
    return FaultClass.BACKEND_ERROR


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


@dataclass
class Fault:
    """One fault, as logged, counted and shown in /health and error envelopes."""

    cls: FaultClass
    message: str
    generation: int
    request_id: str | None = None
    traceback: str = ""
    action: str = "pending"  # for people: what was done, with its reasons
    outcome: Outcome = Outcome.PENDING  # for machines
    id: str = ""  # "f-N", given when the supervisor records it: ids count one by one
    at: float = field(default_factory=time.time)
    detected: float = field(default_factory=time.monotonic)
    recovery_s: float | None = None  # detection to serving again

    def settle(self, outcome: Outcome, action: str) -> None:
        self.outcome, self.action = outcome, action

    def ref(self) -> dict[str, str]:
        """What an error envelope carries (SPEC §4)."""
        return {"class": self.cls, "id": self.id}

    def summary(self) -> dict[str, object]:
        return {
            "id": self.id,
            "class": self.cls,
            "message": self.message,
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.at)),
            "action": self.action,
            "recovery_s": self.recovery_s,
            "generation": self.generation,
            "request_id": self.request_id,
        }


def log_fault(fault: Fault) -> None:
    """Once per fault, when its action is known: text for people, fields for machines."""
    log.error(
        "fault %s class=%s request=%s generation=%d action=%s: %s",
        fault.id,
        fault.cls,
        fault.request_id,
        fault.generation,
        fault.action,
        fault.message,
        extra={
            "fault": fault.summary(),
            "request_id": fault.request_id,
            "traceback": fault.traceback,
        },
    )


class FaultLog:
    """Every fault, numbered (`f-N`, one by one) as it is first named, counted once it is
    recorded; the recent ones kept. A suspected hang is named when a spare takes over (its
    clients' errors may name it) and recorded only if its verdict is a fault: a worker that
    was slow, not hung, leaves its number unused and nothing counted."""

    def __init__(self, events: Observer) -> None:
        self.events = events
        self.recent: deque[Fault] = deque(maxlen=64)
        self.total = 0
        self._ids = itertools.count(1)

    @property
    def last(self) -> Fault | None:
        return self.recent[-1] if self.recent else None

    def name(self, fault: Fault) -> None:
        if not fault.id:
            fault.id = f"f-{next(self._ids)}"

    def record(self, fault: Fault) -> None:
        self.name(fault)
        if fault not in self.recent:
            self.total += 1
            self.recent.append(fault)

    def settle(self, fault: Fault) -> None:
        """Its action is decided: log it once, tell the observers."""
        self.record(fault)
        log_fault(fault)
        self.events.fault_settled(fault)

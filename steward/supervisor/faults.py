"""Fault classification: every failure the worker reports or suffers gets one class here.

The message patterns of Metal, CUDA and CPU backends live in this file and nowhere else.
A class decides the first response (SPEC §3): `oom` and the backend errors get a canary,
`worker_crash`, `stall` and `canary_mismatch` get a new worker.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from enum import StrEnum


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


def classify(message: str) -> FaultClass:
    """The class of an exception message raised by the backend."""
    for name, pattern in _PATTERNS:
        if pattern.search(message):
            return name
    return FaultClass.BACKEND_ERROR


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

    def decide(self, outcome: Outcome, action: str) -> None:
        """What became of the worker, and the words for people (`FaultLog.report` tells
        the world once the recovery is done)."""
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

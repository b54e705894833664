"""Fault injection (SPEC §6), the worker's side: act on the specs the front parsed.

The messages imitate what real backends print, so the fault classifier sees injected
faults exactly as it would see real ones; nothing here tells the supervisor "injected".
"""

from __future__ import annotations

import os
import sys
import time

from steward.wire.faultspec import FaultSpec

GPU_TIMEOUT = (
    "[METAL] Command buffer execution failed: Caused GPU Timeout Error "
    "(00000002:kIOGPUCommandBufferCallbackErrorTimeout) [injected]"
)
OUT_OF_MEMORY = (
    "[METAL] Command buffer execution failed: Insufficient Memory "
    "(00000008:kIOGPUCommandBufferCallbackErrorOutOfMemory) [injected]"
)


class Injector:
    """The worker's side: `hit()` at each injection point; acts when a spec matches."""

    def __init__(self, specs: list[FaultSpec], generation: int) -> None:
        self.specs = specs
        self.generation = generation
        self.poisoned = False

    def hit(
        self,
        point: str,
        seq: int = 0,
        attempt: int = 1,
        prompt: str = "",
        armed: list[int] = (),
        token: int = 0,  # the request's token count, at a decode point
    ) -> None:
        if self.poisoned:
            raise RuntimeError(GPU_TIMEOUT)
        for i, spec in enumerate(self.specs):
            if spec.point != point:
                continue
            if spec.period is not None:
                if i in armed and attempt == 1:
                    self._act(spec)
            elif spec.matches(seq, attempt, prompt, self.generation, token):
                self._act(spec)

    def _act(self, spec: FaultSpec) -> None:
        if spec.action == "slow":
            time.sleep(spec.seconds)
        elif spec.action == "raise":
            raise RuntimeError(GPU_TIMEOUT)
        elif spec.action == "poison":
            self.poisoned = True
            raise RuntimeError(GPU_TIMEOUT)
        elif spec.action == "oom":
            raise RuntimeError(OUT_OF_MEMORY)
        elif spec.action == "hang":
            while True:
                time.sleep(3600)
        elif spec.action == "crash":
            print("steward worker: injected crash, aborting", file=sys.stderr, flush=True)
            os.abort()

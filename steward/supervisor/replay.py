"""What happens to the request that was in flight when a fault struck.

Before recovery: a request whose answer already started reaching the client cannot be
replayed (the stream ends with an error event); a request in flight at its second fault
is quarantined with every identical twin. After recovery: replay once, unless the fault
was an allocation failure that the canary proved request-scoped (507, replaying it would
fail the same way).
"""

from __future__ import annotations

import time

from steward.errors import ApiError
from steward.supervisor.faults import OOM, Fault
from steward.supervisor.jobs import Job


class Quarantine:
    """Payload digests that took part in two faults; refused for `window` seconds."""

    def __init__(self, window: float) -> None:
        self.window = window
        self._until: dict[str, float] = {}

    def add(self, digest: str) -> None:
        self._until[digest] = time.monotonic() + self.window

    def blocked(self, digest: str) -> bool:
        until = self._until.get(digest)
        if until is not None and until < time.monotonic():
            del self._until[digest]
            return False
        return until is not None

    def __len__(self) -> int:
        now = time.monotonic()
        return sum(until >= now for until in self._until.values())


def before_recovery(job: Job, fault: Fault, quarantine: Quarantine, retry_after: int) -> bool:
    """Settle the job now if recovery cannot help it; True if it was quarantined."""
    job.faults += 1
    if job.faults >= 2:
        quarantine.add(job.digest)
        job.push(
            ApiError(
                "request_quarantined",
                f"This request was in flight at {job.faults} backend faults; it and identical "
                f"requests are refused for {quarantine.window:.0f} s.",
                fault=fault.ref(),
            )
        )
        return True
    if job.sent:
        job.push(
            ApiError(
                "backend_fault",
                f"The backend failed mid-answer ({fault.cls}); it is recovering, retry the "
                "request.",
                retry_after=retry_after,
                fault=fault.ref(),
            )
        )
    return False


def after_recovery(job: Job, fault: Fault, worker_kept: bool) -> bool:
    """Settle the job once the backend is back; True means: replay it."""
    if job.finished or job.cancelled:
        return False
    if fault.cls == OOM and worker_kept:
        job.push(
            ApiError(
                "insufficient_memory",
                "The backend ran out of memory on this request and is healthy otherwise; "
                "a smaller request (shorter prompt, fewer max_tokens) may succeed.",
                fault=fault.ref(),
            )
        )
        return False
    return True

"""What happens to the requests that were in flight when a fault struck.

A fault in a batch makes every member a suspect. Strikes are counted per payload (model and
payload hash), not per request, so a client that retries a poison request keeps adding to
the same count. Before recovery: a payload at its second strike within the window is
quarantined, with every identical twin. After recovery: suspects are replayed alone, one at
a time (probation, in the supervisor), so the next fault names its request; a suspect that
then finishes is acquitted. A replayed stream whose client already has part of the answer
resumes after it (jobs.py: `Job.message`), so the client sees one unbroken stream. An
allocation failure that the canary proved request-scoped is a 507 when the request ran
alone, and a smaller batch when it did not.
"""

from __future__ import annotations

import time

from steward.errors import ApiError
from steward.supervisor.faults import Fault, FaultClass
from steward.supervisor.jobs import Job

MAX_TRACKED = 1024  # struck payloads remembered before expired ones are dropped


class Quarantine:
    """Strikes per payload digest within `window` seconds; at two, the payload is refused
    for `window` seconds."""

    def __init__(self, window: float) -> None:
        self.window = window
        self._until: dict[str, float] = {}
        self._strikes: dict[str, list[float]] = {}

    def strike(self, digest: str) -> int:
        """One more fault this payload was in flight at; how many within the window."""
        now = time.monotonic()
        recent = [t for t in self._strikes.get(digest, []) if now - t < self.window]
        recent.append(now)
        if len(self._strikes) > MAX_TRACKED:
            self._strikes = {d: ts for d, ts in self._strikes.items() if now - ts[-1] < self.window}
        self._strikes[digest] = recent
        if len(recent) >= 2:
            self._until[digest] = now + self.window
        return len(recent)

    def suspect(self, digest: str) -> bool:
        """Struck once within the window: it must run alone until acquitted."""
        now = time.monotonic()
        return any(now - t < self.window for t in self._strikes.get(digest, []))

    def acquit(self, digest: str) -> None:
        self._strikes.pop(digest, None)

    def blocked(self, digest: str) -> bool:
        until = self._until.get(digest)
        if until is not None and until < time.monotonic():
            del self._until[digest]
            return False
        return until is not None

    def __len__(self) -> int:
        now = time.monotonic()
        return sum(until >= now for until in self._until.values())


def strike(suspects: list[Job], quarantine: Quarantine) -> dict[str, int]:
    """One strike per payload per fault, however many of its twins were in flight."""
    return {digest: quarantine.strike(digest) for digest in {job.digest for job in suspects}}


def before_recovery(job: Job, fault: Fault, strikes: int, quarantine: Quarantine) -> bool:
    """Settle the job now if recovery cannot help it; True if it was quarantined."""
    if strikes >= 2:
        job.push(
            ApiError(
                "request_quarantined",
                f"This request was in flight at {strikes} backend faults; it and identical "
                f"requests are refused for {quarantine.window:.0f} s.",
                fault=fault.ref(),
            )
        )
        return True
    return False  # replayed after recovery; a stream the client reads resumes


def after_recovery(job: Job, fault: Fault, worker_kept: bool, alone: bool) -> bool:
    """Settle the job once the backend is back; True means: replay it."""
    if job.finished or job.cancelled:
        return False
    if fault.cls == FaultClass.OOM and worker_kept and alone:
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

"""Who runs now: the jobs in flight, probation, and the batch limit.

Suspects of a fault run alone, one at a time (probation), before anything else starts, so
the next fault names its request; a payload struck once within the restart window runs
alone too, whichever request carries it. Otherwise queued jobs join the batch up to its
limit: the smallest of `--max-batch`, what the worker can batch, and the halved limit an
allocation failure in a batch leaves until the restart window has passed.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from steward.supervisor.jobs import Job, JobQueue


class Batch:
    def __init__(self, max_batch: int, window: float) -> None:
        self.max_batch = max_batch
        self.window = window
        self.worker_max = max_batch  # what the serving worker said it can batch
        self.running: dict[int, Job] = {}
        self.probation: deque[Job] = deque()
        self._shrunk = max_batch
        self._shrunk_until = 0.0

    def __len__(self) -> int:
        return len(self.running)

    @property
    def limit(self) -> int:
        limit = min(self.max_batch, self.worker_max)
        if time.monotonic() < self._shrunk_until:
            limit = min(limit, self._shrunk)
        return limit

    def shrink(self) -> None:
        """An allocation failure with several members: half as many, for a window."""
        self._shrunk = max(1, self.limit // 2)
        self._shrunk_until = time.monotonic() + self.window

    def probate(self, job: Job) -> None:
        job.running = False
        job.queued_at = time.monotonic()
        self.probation.append(job)

    def next(self, queue: JobQueue, suspect: Callable[[str], bool]) -> Job | None:
        """The next job to start now, or None while the batch must wait."""
        while True:
            if self.probation:
                if self.running:
                    return None
                job = self.probation.popleft()
                job.alone = True
                return job
            if len(self.running) >= self.limit or any(j.alone for j in self.running.values()):
                return None  # full, or a suspect runs alone
            job = queue.pop()
            if job is None:
                return None
            if not suspect(job.digest):
                return job
            self.probate(job)

    def discard(self, job: Job) -> None:
        if job in self.probation:
            self.probation.remove(job)

    def waiting(self) -> list[Job]:
        """Probation's jobs, taken out (the process is stopping)."""
        jobs, self.probation = list(self.probation), deque()
        return jobs

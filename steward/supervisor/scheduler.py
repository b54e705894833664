"""Who runs now: the one owner of every job's `JobStatus`, the batch, and probation.

Queued jobs join the batch up to its limit: the smallest of `--max-batch`, what the worker
can batch, and the halved limit an allocation failure in a batch leaves for the restart
window. After a fault, the suspects wait in probation groups (recovery.py decides them);
a group runs with nothing beside it, so the next fault names only its members, and nothing
else starts until every group has run. The first group (most likely innocent: the rest of
the batch) runs at once; the later ones, the trials likeliest to fault again, are `held`
until a fault would cost the innocents no bring-up (the supervisor `release`s them once a
spare is ready, or none is coming), and the queue runs meanwhile. Other modules ask; only
this one sets a status.
"""

from __future__ import annotations

import time
from collections import deque

from steward.supervisor.jobs import Job, JobQueue, JobStatus

S = JobStatus


class Scheduler:
    def __init__(self, max_batch: int, queue_size: int, window: float) -> None:
        self.max_batch = max_batch  # 0: as wide as the worker says (`--max-batch auto`)
        self.window = window
        self.worker_max = max_batch or 1  # what the serving worker said it can batch
        self.queue = JobQueue(queue_size)
        self.running: dict[int, Job] = {}
        self.probation: deque[list[Job]] = deque()
        self.group: list[Job] | None = None  # the probation group running now
        self.held: deque[list[Job]] = deque()  # trials waiting for a safety net
        self._starting: list[Job] = []  # its members not yet sent
        self.suspects: list[Job] = []  # the last fault's, in no queue while it is handled
        self._shrunk = max_batch
        self._shrunk_until = 0.0

    @property
    def limit(self) -> int:
        limit = min(self.max_batch or self.worker_max, self.worker_max)
        if time.monotonic() < self._shrunk_until:
            limit = min(limit, self._shrunk)
        return limit

    @property
    def on_probation(self) -> int:
        """Suspects waiting for their group, and the group running."""
        groups = [*self.probation, *self.held]
        waiting = sum(j.status is S.SUSPECT for group in groups for j in group)
        return waiting + len(self.group or [])

    @property
    def replaying(self) -> bool:
        """Suspects of a fault still wait for their group, or a group runs."""
        return bool(self.probation) or self.group is not None

    @property
    def resumed(self) -> bool:
        """The probation group running has progressed again: each of its members has a
        token of this attempt, or has ended."""
        group = self.group
        return group is not None and all(j.started or j.status.ended for j in group)

    def unfinished(self) -> list[Job]:
        """Every job not ended: running, suspects of a fault being handled, on probation,
        queued."""
        groups = (j for g in [*self.probation, *self.held] for j in g)
        jobs = [*self.running.values(), *self.suspects, *groups, *self.queue]
        return [j for j in dict.fromkeys(jobs) if not j.finished]

    def worker_said(self, max_batch: int | None) -> None:
        """What the serving worker can batch (None: it has not said; the last word holds)."""
        self.worker_max = max_batch or self.worker_max

    def enqueue(self, job: Job) -> None:
        job.status = S.QUEUED
        self.queue.put(job)

    def next(self) -> Job | None:
        """The next job to start now, or None while the batch must wait."""
        if self.group is not None and all(j.status.ended for j in self.group):
            self.group = None  # the group has run
        if self.group is None and self.probation and not self.running:
            self.group = [j for j in self.probation.popleft() if not j.status.ended]
            self._starting = list(self.group)
        if self.group is not None:
            while self._starting:
                job = self._starting.pop(0)
                if not job.status.ended:
                    return job
            return None
        if self.probation or len(self.running) >= self.limit:
            return None
        return self.queue.pop()

    def started(self, job: Job) -> None:
        job.status = S.RUNNING
        self.running[job.id] = job

    def ended(self, job: Job, status: JobStatus) -> None:
        """Answered, failed, cancelled or quarantined, wherever it was."""
        self.running.pop(job.id, None)
        self.queue.remove(job)
        job.status = status

    def cancel(self, job: Job) -> bool:
        """The client is gone: True if the worker must be told (the job is running)."""
        running = job.id in self.running
        if not job.status.ended:
            self.ended(job, S.CANCELLED)
        return running

    def fault(self) -> tuple[list[Job], bool]:
        """The batch faulted: its members, now suspects, and whether they were a group."""
        suspects = list(self.running.values())
        regroup = self.group is not None
        self.running.clear()
        self.group, self._starting = None, []
        for job in suspects:
            job.status = S.SUSPECT
        self.suspects = suspects
        return suspects, regroup

    def probate(self, groups: list[list[Job]]) -> None:
        """Suspects' groups, tried before anything else, in this order, after the groups
        already waiting: those carry no evidence yet, and their members finishing first
        lets the faults name the one payload left (quarantine.py). The first runs when its
        turn comes; the others are held until `release`."""
        for i, group in enumerate(groups):
            for job in group:
                job.status = S.SUSPECT
            (self.held if i else self.probation).append(group)

    def release(self) -> None:
        """The held trials may fault now at no innocent's cost: they join probation."""
        self.probation.extend(self.held)
        self.held.clear()

    def requeue(self, jobs: list[Job]) -> None:
        for job in reversed(jobs):
            job.status = S.QUEUED
            self.queue.put(job, front=True)

    def shrink(self) -> None:
        """An allocation failure with several members: half as many, for a window."""
        self._shrunk = max(1, self.limit // 2)
        self._shrunk_until = time.monotonic() + self.window

    def drain(self) -> list[Job]:
        """Every unfinished job, taken out (the process is stopping or exiting), for the
        caller to end each (`Dispatcher.end_all`)."""
        jobs = self.unfinished()
        self.running.clear()
        self.suspects = []
        self.probation.clear()
        self.held.clear()
        self.group, self._starting = None, []
        self.queue.drain()
        return jobs

"""Admission: the HTTP side of the supervisor. Whether a request may wait for the backend
(the words when not are answers.py's).

A request is refused at once when waiting cannot help it: the server is stopping or has
failed, its payload is quarantined, the queue is full, or it cannot fit the context. Every
retryable refusal carries a `Retry-After` that is an estimate, not a constant: the time a
bring-up under way has left, or the time the queue ahead takes to work off at the pace of
recent completions (`Pace`).

A request that meets a recovery (`recovering`: a fault or a suspected hang being handled)
waits for it: its first turn's `--queue-timeout` counts from the recovery's end when that is
within its deadline (jobs.py). The end is expected at `OVERRUN` times the model's last
measured bring-up (one that loaded the model) after the recovery began (a busy machine runs
slower than it measured),
and is known once it happened. A first start is no recovery: nothing measured says when it
ends, and a request then waits its `--queue-timeout` as it always did.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from steward.config import ServeConfig
from steward.errors import ApiError
from steward.supervisor import answers
from steward.supervisor.events import Observers
from steward.supervisor.faultlog import FaultLog
from steward.supervisor.jobs import Job
from steward.supervisor.quarantine import Quarantine
from steward.supervisor.scheduler import Scheduler
from steward.supervisor.state import State
from steward.wire.protocol import Cancel, Generate

if TYPE_CHECKING:
    from steward.supervisor.bringup import BringUp


OVERRUN = 2.0  # a recovery is expected within this many times the last measured bring-up


class Pace:
    """Seconds between completions, batch-wide, smoothed: what one queued job costs."""

    def __init__(self) -> None:
        self.job_seconds = 1.0
        self._last = time.monotonic()

    def finished(self) -> None:
        now = time.monotonic()
        self.job_seconds = 0.8 * self.job_seconds + 0.2 * min(now - self._last, 60.0)
        self._last = now

    def retry_after(self, state: State, bring_up_s: float, since: float, queued: int) -> int:
        if state in (State.STARTING, State.RECOVERING):
            return max(1, round(bring_up_s - (time.monotonic() - since)))
        return max(1, round(queued * self.job_seconds))


class Admission:
    def __init__(
        self,
        config: ServeConfig,
        scheduler: Scheduler,
        quarantine: Quarantine,
        fault_log: FaultLog,
        events: Observers,
        bringup: BringUp,
        state: Callable[[], State],
    ) -> None:
        self.config = config
        self.scheduler = scheduler
        self.quarantine = quarantine
        self.fault_log = fault_log
        self.events = events
        self.bringup = bringup
        self.pace = Pace()
        self.state = state
        self.wake = asyncio.Event()  # set when the supervision loop has something to do
        self.recovered_at = 0.0  # the last recovery ended (monotonic)
        self._seq = itertools.count(1)

    def submit(
        self, request: Generate, prompt_chars: int, request_id: str, digest: str, stream: bool
    ) -> Job:
        """Queue a request, or refuse it now with the error that says why."""
        if error := answers.refused(self.state(), self.fault_log.last, self.retry_after()):
            raise error
        if self.quarantine.blocked(digest):
            self.events.request_quarantined()
            raise answers.quarantined(self.config.restart_window)
        if self.scheduler.queue.full():
            raise answers.full(self.scheduler.queue.maxsize, self.retry_after())
        job = Job(request, next(self._seq), request_id, digest, prompt_chars, stream)
        job.recovery = self.recovery_end
        if error := self.too_long(job):
            raise error
        self.scheduler.enqueue(job)
        self.wake.set()
        return job

    def too_long(self, job: Job) -> ApiError | None:
        """Known once a worker has loaded the model: see `Job.too_long`."""
        model = self.bringup.model
        if model.context_length is None or model.max_token_chars is None:
            return None
        return job.too_long(model.context_length, model.max_token_chars)

    def cancel(self, job: Job) -> None:
        """The client is gone or out of time: drop the job wherever it is (a running one
        leaves the batch when the worker says it has)."""
        link = self.bringup.link
        if self.scheduler.cancel(job) and link is not None:
            link.send(Cancel(job.id))

    def waited(self) -> ApiError:
        """Why a job is still waiting after --queue-timeout."""
        timeout = self.config.queue_timeout
        return answers.waited(self.state(), timeout, self.fault_log.last, self.retry_after())

    def recovery_end(self) -> float:
        """When the recovery under way should end, or the last one ended (monotonic; 0.0:
        none yet)."""
        bringup = self.bringup
        if self.state() is State.RECOVERING and bringup.known:
            return bringup.since + OVERRUN * bringup.loading_s
        return self.recovered_at

    def retry_after(self) -> int:
        bringup, queued = self.bringup, len(self.scheduler.queue)
        return self.pace.retry_after(self.state(), bringup.seconds, bringup.since, queued)

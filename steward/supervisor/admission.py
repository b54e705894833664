"""Admission: the HTTP side of the supervisor. Whether a request may wait for the backend
(the words when not are answers.py's).

A request is refused at once when waiting cannot help it: the server is stopping or has
failed, its payload is quarantined, the queue is full, or it cannot fit the context. Every
retryable refusal carries a `Retry-After` that is an estimate, not a constant: the time a
bring-up under way has left, or the time the queue ahead takes to work off at the pace of
recent completions (pace.py).

A request that meets a recovery (`recovering`: a fault or a suspected hang being handled)
waits for it: its first turn's `--queue-timeout` counts from the recovery's end when that is
within its deadline (jobs.py). The end is expected at `OVERRUN` times the model's last
measured bring-up (one that loaded the model) after the recovery began (a busy machine runs
slower than it measured), and is known once it happened. A first start is no recovery:
nothing measured says when it ends, and a request then waits its `--queue-timeout` as it
always did.
"""

from __future__ import annotations

import itertools
import time

from steward.errors import ApiError
from steward.supervisor import answers
from steward.supervisor.context import Context
from steward.supervisor.jobs import Job
from steward.supervisor.state import State
from steward.wire.protocol import Generate

OVERRUN = 2.0  # a recovery is expected within this many times the last measured bring-up


class Admission:
    def __init__(self, context: Context) -> None:
        self.context = context
        self._recovered_at = 0.0  # the last recovery ended (monotonic)
        self._seq = itertools.count(1)

    def submit(
        self, request: Generate, prompt_chars: int, request_id: str, digest: str, stream: bool
    ) -> Job:
        """Queue a request, or refuse it now with the error that says why."""
        ctx = self.context
        if error := answers.refused(ctx.state(), ctx.fault_log.last, self.retry_after()):
            raise error
        if ctx.quarantine.blocked(digest):
            ctx.events.request_quarantined()
            raise answers.quarantined(ctx.config.restart_window)
        if ctx.scheduler.queue.full():
            raise answers.full(ctx.scheduler.queue.maxsize, self.retry_after())
        job = Job(request, next(self._seq), request_id, digest, prompt_chars, stream)
        job.recovery = self.recovery_end
        if error := job.too_long(ctx.facts().model.prompt_bound):
            raise error
        ctx.scheduler.enqueue(job)
        ctx.wake.set()
        return job

    def waited(self) -> ApiError:
        """Why a job is still waiting after --queue-timeout."""
        ctx = self.context
        timeout, last = ctx.config.queue_timeout, ctx.fault_log.last
        return answers.waited(ctx.state(), timeout, last, self.retry_after())

    def recovered(self) -> None:
        """A recovery ended now."""
        self._recovered_at = time.monotonic()

    def recovery_end(self) -> float:
        """When the recovery under way should end, or the last one ended (monotonic; 0.0:
        none yet)."""
        facts = self.context.facts()
        if self.context.state() is State.RECOVERING and facts.known:
            return facts.since + OVERRUN * facts.loading_s
        return self._recovered_at

    def retry_after(self) -> int:
        ctx = self.context
        facts, queued = ctx.facts(), len(ctx.scheduler.queue)
        return ctx.pace.retry_after(ctx.state(), facts.seconds, facts.since, queued)

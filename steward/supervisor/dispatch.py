"""The job path: sending jobs to the worker, and settling each when the worker says it ended.

Runs on the supervision loop (`start_next`) and on the token path (`finished`, called by the
worker's line): quick, and nothing here decides about faults. A job's end acquits its
payload (quarantine.py), which may convict another payload the earlier faults now name:
its copies still waiting are refused at once. A bug met while starting one job fails that
job alone (500 `internal_error`); `--inject-fault supervisor:ACTION` stands in for one.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable

from steward.errors import ApiError
from steward.supervisor import answers
from steward.supervisor.context import Context
from steward.supervisor.faults import Fault
from steward.supervisor.jobs import Event, Job, JobStatus
from steward.supervisor.line import Link, Sink
from steward.supervisor.recovery import Plan
from steward.supervisor.speeds import Speeds
from steward.wire.faultspec import FaultSpec, Periods
from steward.wire.protocol import Cancel, Done, Rejected, Token, prompt_text

log = logging.getLogger("steward.supervisor")


class InjectedBug(RuntimeError):
    """`--inject-fault supervisor:...`: stands for a bug in steward's own code."""


class Dispatcher:
    def __init__(self, context: Context, specs: list[FaultSpec], speeds: Speeds) -> None:
        self.context = context
        self.scheduler = context.scheduler  # the one it sends from and ends jobs through
        self.specs = specs
        self.periods = Periods(specs)
        self.speeds = speeds
        self.busy_since = time.monotonic()  # the batch last went from empty to busy
        self.current: Job | None = None  # being started: a loop-ending bug fails it

    def start_next(self, link: Link) -> None:
        """Start queued jobs (or the next probation group) while the batch has room."""
        while (job := self.scheduler.next()) is not None:
            self._start(job, link)

    def end(self, job: Job, event: Event, status: JobStatus | None = None) -> None:
        """The one place a job ends: its status set (an answer's `finished`, an error's
        `failed`, unless told), then its last event pushed to its client. The first end
        decides: a job that ended already keeps its status."""
        if not job.status.ended:
            answered = JobStatus.FAILED if isinstance(event, ApiError) else JobStatus.FINISHED
            self.scheduler.ended(job, status or answered)
        job.push(event)

    def end_all(self, error: Callable[[], ApiError]) -> None:
        """Every unfinished job ends with `error` (the process is stopping or exiting)."""
        for job in self.scheduler.drain():
            self.end(job, error())

    def quarantine_waiting(self, digests: list[str]) -> None:
        """Payloads just quarantined: their copies still waiting are refused now."""
        if not digests:
            return
        for job in self.scheduler.unfinished():
            if job.digest in digests and not job.running:
                self._refuse(job)

    def token(self, job: Job, token: Token) -> None:
        """A token of the job (on the token path). Its first says its prompt went through:
        the bound on the worker's silence narrows, so the loop looks again."""
        job.add(token)
        if job.fresh == 1:
            self.context.wake.set()

    def admitted(self, job: Job, prefill: int) -> None:
        """The worker took the job in: its prefill is known, and with it the bound."""
        job.admitted(prefill)
        self.context.wake.set()

    def finished(self, job: Job, result: Done | Rejected) -> None:
        """The worker's last word on a job (on the token path: quick, never raises out)."""
        self.context.wake.set()  # the loop has something to decide
        log.debug("request %s %s", job.request_id, result)
        if isinstance(result, Rejected):
            self.end(job, answers.rejection(result))
            return
        if result.finish_reason == "cancelled":
            self.end(job, result, JobStatus.CANCELLED)
            return
        self.end(job, result)
        self.quarantine_waiting(
            self.context.quarantine.acquit(job.digest)
        )  # every copy is innocent
        self.context.events.request_done(result)
        self.context.pace.finished()
        self.speeds.finished(job.request, result, whole=job.attempts == 1)

    def carry_out(self, plan: Plan, fault: Fault) -> None:
        """What recovery decided for the suspects of `fault`."""
        for job in plan.quarantined:
            self._refuse(job, fault)
        for job in plan.too_big:
            self.end(job, answers.too_big(fault))
        if plan.shrink:
            self.scheduler.shrink()
            fault.action += f"; batch limit {self.scheduler.limit}"
        self.scheduler.requeue(plan.requeue)
        self.scheduler.probate(plan.groups)
        if plan.groups:
            sizes = "+".join(str(len(group)) for group in plan.groups)
            log.info("fault %s: suspects run again in groups of %s", fault.id, sizes)

    def _refuse(self, job: Job, fault: Fault | None = None) -> None:
        """Quarantined: 422 (or its stream's error event), naming `fault` (else the last)."""
        ctx = self.context
        ctx.events.request_quarantined()
        error = answers.quarantined(ctx.config.restart_window, fault or ctx.fault_log.last)
        self.end(job, error, JobStatus.QUARANTINED)

    def _start(self, job: Job, link: Link) -> None:
        """Send one job to the worker. Anything raised here is a bug in steward that fails
        this job alone, and the loop goes on."""
        if self.context.quarantine.blocked(job.digest):  # a copy convicted while this one waited
            self._refuse(job)
            return
        self.current = job
        self._inject(job, "crash")  # outside the guard below: a bug that ends the loop
        try:
            # queued before the model's bounds were known
            if error := job.too_long(self.context.facts().model.prompt_bound):
                self.end(job, error)
                return
            self._inject(job, "raise")
            if job.attempts == 0:
                job.armed = self.periods.arm()
            job.restart()
            if not self.scheduler.running:
                self.busy_since = time.monotonic()
            self.scheduler.started(job)
            finished = functools.partial(self.finished, job)
            token, admitted = (
                functools.partial(self.token, job),
                functools.partial(self.admitted, job),
            )
            link.start(job.message(), Sink(token, finished, admitted))
        except Exception as exc:
            log.error(
                "bug in steward while starting request %s; it alone fails",
                job.request_id,
                exc_info=True,
                extra={"request_id": job.request_id},
            )
            if link.forget(job.id):
                link.send(Cancel(job.id))
            self.end(job, answers.bug(f"{type(exc).__name__}: {exc}"))
        finally:
            self.current = None

    def _inject(self, job: Job, action: str) -> None:
        for spec in self.specs:
            if (spec.point, spec.action) == ("supervisor", action) and spec.matches(
                job.seq, job.attempts + 1, prompt_text(job.request), 0
            ):
                raise InjectedBug(f"injected supervisor:{action} on request {job.seq}")

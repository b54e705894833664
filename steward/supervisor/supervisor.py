"""The supervisor: owns the worker, the state machine, and every decision after a fault.

One task (`start` runs it) decides, and only decides: bring a worker up, start queued jobs
while the batch has room (batch.py), and when the worker's line reports a fault or falls
silent, classify it (faults.py), canary or replace the worker, then settle or replay every
job that was in flight (replay.py). Tokens never pass through this loop: the worker's line
routes them to their jobs (link.py). HTTP handlers only `submit` and `cancel` jobs.

The loop must never die silently (the field report's zombie, made by steward itself): a
bug met while starting one job fails that job alone (500 `internal_error`) and the loop
goes on; a bug anywhere else ends the loop, health says `failed` at once, and the process
exits 70 (EX_SOFTWARE) so that its supervisor restarts it and someone reads the traceback.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
from collections import deque

from steward.config import ServeConfig
from steward.errors import ApiError
from steward.model.resolve import ModelSource, is_vision
from steward.supervisor import canary, replay
from steward.supervisor.batch import Batch
from steward.supervisor.bringup import BringUp, Spawn
from steward.supervisor.events import Observers
from steward.supervisor.exits import EX_SOFTWARE, EX_TEMPFAIL, Exit
from steward.supervisor.faults import (
    CANARY_DECIDES,
    Fault,
    FaultClass,
    Outcome,
    log_fault,
)
from steward.supervisor.intensity import RestartIntensity
from steward.supervisor.jobs import Job, JobQueue
from steward.supervisor.link import WorkerLink
from steward.supervisor.standby import Standby
from steward.supervisor.state import State
from steward.wire.faultspec import FaultSpec, Periods
from steward.wire.protocol import (
    Cancel,
    Done,
    Generate,
    Rejected,
    prompt_text,
)

log = logging.getLogger("steward.supervisor")

SLOW_FACTOR = 0.5  # decode below half the load-time baseline: degraded


class InjectedBug(RuntimeError):
    """`--inject-fault supervisor:...`: stands for a bug in steward's own code."""


class Supervisor(BringUp):
    def __init__(
        self,
        config: ServeConfig,
        source: ModelSource,
        faults: list[FaultSpec],
        spawn: Spawn = WorkerLink.spawn,  # tests of the decisions pass a fake worker line
    ):
        self.config = config
        self.spawn = spawn
        self.source = source
        self.fault_specs = faults
        self.periods = Periods(faults)
        self.state = State.STARTING
        self.queue = JobQueue(config.queue_size)
        self.batch = Batch(config.max_batch, config.restart_window)
        self.intensity = RestartIntensity(config.max_restarts, config.restart_window)
        self.quarantine = replay.Quarantine(config.restart_window)
        self.faults: deque[Fault] = deque(maxlen=64)
        self.faults_total = 0
        self.generation = 0
        self.context_length: int | None = None
        self.max_token_chars: int | None = None  # longest token's text: bounds a prompt
        self.vision = source.kind == "mlx" and is_vision(source.path)  # takes images
        self.golden: tuple[int, ...] | None = None
        self.baseline_tps = 0.0
        self.recent_tps = 0.0
        self.exit_code: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.started_at = time.time()
        self.current: Job | None = None  # being started: a loop-ending bug fails it
        self.suspects: list[Job] = []  # in flight at the fault being recovered from
        self.link: WorkerLink | None = None
        self.events = Observers()
        self._seq = itertools.count(1)
        self.bring_up_seconds = 10.0  # until measured: a guess for Retry-After
        self._recovery_since = time.monotonic()
        self._job_seconds = 1.0  # between completions: Retry-After while serving
        self._finished_at = time.monotonic()
        self._busy_since = time.monotonic()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.standby = Standby(config.standby, self._spawn_spare, self._canary, config.load_timeout)

    # -- the HTTP side ---------------------------------------------------------------

    def submit(
        self, request: Generate, prompt_chars: int, request_id: str, digest: str, stream: bool
    ) -> Job:
        """Queue a request, or refuse it now with the error that says why."""
        if self.state is State.STOPPING:
            raise ApiError("server_shutdown", "The server is shutting down.", self.retry_after())
        if self.state is State.FAILED:
            raise self._exiting(self.faults[-1] if self.faults else None)
        if self.quarantine.blocked(digest):
            self.events.request_quarantined()
            raise ApiError(
                "request_quarantined",
                "An identical request was in flight at two backend faults; it is refused for "
                f"{self.config.restart_window:.0f} s.",
            )
        if self.queue.full():
            raise ApiError(
                "overloaded",
                f"The request queue is full ({self.queue.maxsize} waiting).",
                self.retry_after(),
            )
        job = Job(request, next(self._seq), request_id, digest, prompt_chars, stream)
        if error := self.too_long(job):
            raise error
        self.queue.put(job)
        self._wake.set()
        return job

    def too_long(self, job: Job) -> ApiError | None:
        """Known once a worker has loaded the model: see `Job.too_long`."""
        if self.context_length is None or self.max_token_chars is None:
            return None
        return job.too_long(self.context_length, self.max_token_chars)

    def cancel(self, job: Job) -> None:
        """The client is gone or out of time: drop the job wherever it is (a running one
        leaves the batch when the worker says it has)."""
        job.cancelled = True
        self.queue.remove(job)
        self.batch.discard(job)
        if job.id in self.batch.running and self.link is not None:
            self.link.send(Cancel(job.id))

    def queue_error(self) -> ApiError:
        """Why a job is still waiting after --queue-timeout."""
        if self.state.serving:
            return ApiError(
                "overloaded",
                f"No capacity within {self.config.queue_timeout:.0f} s (queue-timeout).",
                self.retry_after(),
            )
        return ApiError(
            "backend_unavailable",
            f"The backend is {self.state}; not ready within {self.config.queue_timeout:.0f} s.",
            self.retry_after(),
            fault=self.faults[-1].ref() if self.faults else None,
        )

    def retry_after(self) -> int:
        """An honest wait: remaining recovery time, or the time to work off the queue."""
        if self.state in (State.STARTING, State.RECOVERING):
            left = self.bring_up_seconds - (time.monotonic() - self._recovery_since)
            return max(1, round(left))
        return max(1, round(len(self.queue) * self._job_seconds))  # completions, batch-wide

    # -- the loop ---------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())
        self._task.add_done_callback(self._ended)

    def alive(self) -> bool:
        """The supervision task still runs (what health and the systemd watchdog vouch for)."""
        return self._task is None or not self._task.done()

    def status(self) -> State:
        """The state health reports: `failed` as soon as the supervision task has ended,
        whatever it last said (it can no longer change it)."""
        if not self.alive() and self.state is not State.STOPPING:
            return State.FAILED
        return self.state

    async def _run(self) -> None:
        """Supervise until stopped; on unrecoverable failure, resolve `exit_code`."""
        try:
            if not await self._start_worker():
                await self._replace()
            self._serving()
            while True:
                self._dispatch()
                await self._watch()
        except Exit as exc:
            state = State.FAILED if exc.code == EX_TEMPFAIL else State.STOPPING
            self._set_state(state, f"exit {exc.code}: {exc.reason}")
            log.critical("exiting %d: %s", exc.code, exc.reason)
            for job in self._abandon():
                job.push(self.queue_error() if exc.code == EX_TEMPFAIL else self._shutdown())
            if not self.exit_code.done():
                self.exit_code.set_result(exc.code)
        except Exception:
            log.critical("the supervision loop ended on a bug in steward", exc_info=True)
            self._set_state(State.FAILED, "a bug in steward ended the supervision loop")
            if self.current is not None:
                self.current.push(_bug("the supervision loop ended"))
            for job in self._abandon():
                job.push(self._exiting(None))
            self.exit_code.set_result(EX_SOFTWARE)

    def _abandon(self) -> list[Job]:
        """Every job not finished: in the batch, under recovery, on probation, queued."""
        running = [*self.batch.running.values(), *self.suspects]
        self.batch.running.clear()
        self.suspects = []
        return [*running, *self.batch.waiting(), *self.queue.drain()]

    def _ended(self, task: asyncio.Task[None]) -> None:
        """However the task ended, the process must not outlive it as a zombie."""
        if self.state is not State.STOPPING and not self.exit_code.done():
            log.critical("the supervision loop ended unexpectedly (%s)", task)
            self.exit_code.set_result(EX_SOFTWARE)

    def _inject(self, job: Job, action: str) -> None:
        """`--inject-fault supervisor:ACTION`: a stand-in for a bug in this loop."""
        for spec in self.fault_specs:
            if (spec.point, spec.action) == ("supervisor", action) and spec.matches(
                job.seq, job.attempts + 1, prompt_text(job.request), 0
            ):
                raise InjectedBug(f"injected supervisor:{action} on request {job.seq}")

    async def stop(self, drain_timeout: float, cut: asyncio.Event) -> None:
        """Drain: refuse new work, let queued and running jobs finish (until the timeout, or
        until `cut` is set by a second signal), then stop the worker."""
        self._set_state(State.STOPPING, "draining")
        deadline = time.monotonic() + drain_timeout
        while self._unfinished() and time.monotonic() < deadline:
            if cut.is_set():
                log.warning("drain cut short: %d request(s) abandoned", self._unfinished())
                break
            await asyncio.sleep(0.05)
        for job in self._abandon():
            job.push(self._shutdown())
        self._task.cancel()  # a worker exiting on request is no fault
        await self.standby.close()
        if self.link is not None:
            await self.link.stop(timeout=5.0)

    async def close(self) -> None:
        """Make sure no worker outlives the front's exit."""
        self._task.cancel()
        await self.standby.close()
        await self._kill_worker()

    def _exiting(self, fault: Fault | None) -> ApiError:
        return ApiError(
            "backend_unavailable",
            "The backend cannot recover in this process; it is exiting to be restarted.",
            self.retry_after(),
            fault=fault.ref() if fault else None,
        )

    def _shutdown(self) -> ApiError:
        return ApiError("server_shutdown", "The server shut down before answering.", 1)

    def _unfinished(self) -> int:
        jobs = [*self.suspects, *self.batch.probation, *self.queue]
        return len(self.batch) + sum(not job.finished for job in jobs)

    def _dispatch(self) -> None:
        """Start queued jobs while the batch has room."""
        while (job := self.batch.next(self.queue, self.quarantine.suspect)) is not None:
            self._start(job)

    def _start(self, job: Job) -> None:
        """Send one job to the worker. Anything raised here is a bug in steward that fails
        this job alone, and the loop goes on."""
        if job.cancelled or job.finished:
            return
        assert self.link is not None
        self.current = job
        self._inject(job, "crash")  # outside the guard below: a bug that ends the loop
        try:
            if error := self.too_long(job):  # queued before the model's bounds were known
                job.push(error)
                return
            self._inject(job, "raise")
            if job.attempts == 0:
                job.armed = self.periods.arm()
            job.restart()
            job.running = True
            if not self.batch.running:
                self._busy_since = time.monotonic()
            self.batch.running[job.id] = job
            self.link.start(job.message(), job.add, functools.partial(self._finished, job))
        except Exception as exc:
            log.error(
                "bug in steward while starting request %s; it alone fails",
                job.request_id,
                exc_info=True,
                extra={"request_id": job.request_id},
            )
            if self.batch.running.pop(job.id, None) is not None:
                self.link.sinks.pop(job.id, None)
                self.link.send(Cancel(job.id))
            job.push(_bug(f"{type(exc).__name__}: {exc}"))
        finally:
            self.current = None

    def _finished(self, job: Job, result: Done | Rejected) -> None:
        """The worker's last word on a job (on the token path: quick, never raises out)."""
        self.batch.running.pop(job.id, None)
        self._wake.set()
        log.debug("request %s %s", job.request_id, result)
        if isinstance(result, Rejected):
            job.push(ApiError(result.type, result.message))
            return
        job.push(result)
        if result.finish_reason == "cancelled":
            return
        if job.alone:
            self.quarantine.acquit(job.digest)  # a suspect that finished alone is innocent
        self.events.request_done(result)
        now = time.monotonic()
        self._job_seconds = 0.8 * self._job_seconds + 0.2 * min(now - self._finished_at, 60.0)
        self._finished_at = now
        whole = job.attempts == 1  # a resumed answer's speed covers only its last part
        like = whole and result.batch == 1 and job.request.plain  # alone, as the canary ran
        if like and result.completion_tokens >= canary.MAX_TOKENS:
            self.recent_tps = result.decode_tps

    async def _watch(self) -> None:
        """Wait for something to decide: work, a job's end, a fault, or silence."""
        assert self.link is not None
        link = self.link
        self._wake.clear()
        woken = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({woken, link.failure}, timeout=1.0, return_when="FIRST_COMPLETED")
        finally:
            woken.cancel()
        if link.failure.done():
            await self._recover(link.failure.result())
        elif stall := self._stalled(link):
            await self._recover(stall)
        elif self.state.serving:
            self._serving()  # a fault leaving the restart window ends `degraded`

    def _stalled(self, link: WorkerLink) -> Fault | None:
        """Busy: no step within --stall-timeout. Idle: no heartbeat within it."""
        timeout = self.config.stall_timeout
        if self.batch.running:
            since = max(link.progress, self._busy_since)
            if time.monotonic() - since > timeout:
                return link.fault(FaultClass.STALL, f"no progress on the batch for {timeout:.0f} s")
        elif link.silent_for() > timeout:
            return link.fault(FaultClass.STALL, f"no heartbeat for {timeout:.0f} s while idle")
        return None

    # -- faults and recovery ----------------------------------------------------------

    async def _recover(self, fault: Fault) -> None:
        """Decide and act: keep the worker (canary passed) or replace it; settle every job
        that was in flight (each a suspect)."""
        assert self.link is not None
        self.suspects = suspects = list(self.batch.running.values())
        self.batch.running.clear()
        self.link.sinks.clear()
        self.link.rearm()
        for job in suspects:  # a kept worker may have taken some in after the fault
            self.link.send(Cancel(job.id))
        if len(suspects) == 1:
            fault.request_id = suspects[0].request_id
        self._record(fault)
        self._set_state(State.RECOVERING, f"fault {fault.id} ({fault.cls})")
        self._recovery_since = time.monotonic()
        strikes = replay.strike(suspects, self.quarantine)
        for job in suspects:
            if replay.before_recovery(job, fault, strikes[job.digest], self.quarantine):
                self.events.request_quarantined()
        kept, verdict = False, ""
        try:
            if fault.cls in CANARY_DECIDES:
                failed = await self._canary()
                kept = failed is None
                verdict = "" if kept else f"canary failed ({failed.cls}); "
            if kept:
                fault.settle(Outcome.KEPT, "kept worker (canary passed)")
            elif self.config.on_fault == "exit":
                raise Exit(EX_TEMPFAIL, f"{fault.cls} fault and --on-fault exit")
            else:
                fault.action = verdict + "replacing worker"
                outcome = await self._replace(fault)
                how = "promoted standby" if outcome is Outcome.PROMOTED else "replaced worker"
                assert self.link is not None
                fault.settle(outcome, verdict + f"{how} (generation {self.link.generation})")
        except Exit as exc:
            fault.settle(Outcome.EXIT, verdict + f"exit {exc.code}")
            for job in suspects:
                job.push(self._exiting(fault))
            self._settle(fault)
            raise
        shrink = fault.cls == FaultClass.OOM and len(suspects) > 1
        if shrink:
            self.batch.shrink()
            fault.action += f"; batch limit {self.batch.limit}"
        replays = [j for j in suspects if replay.after_recovery(j, fault, kept, len(suspects) == 1)]
        for job in replays:
            log.info("replaying request %s (attempt %d)", job.request_id, job.attempts + 1)
            if not shrink:
                self.batch.probate(job)  # alone, one at a time: the next fault names its job
        for job in reversed(replays if shrink else []):
            self.queue.put(job, front=True)
        self.suspects = []
        self._serving()
        fault.recovery_s = round(time.monotonic() - fault.detected, 3)
        self._settle(fault)

    # -- bookkeeping --------------------------------------------------------------------

    def _record(self, fault: Fault) -> None:
        if fault not in self.faults:
            self.faults_total += 1
            fault.id = f"f-{self.faults_total}"
            self.faults.append(fault)

    def _serving(self) -> None:
        """Serving: `degraded` while a fault is within the restart window or decode is slow."""
        last = self.faults[-1] if self.faults else None
        if last and time.time() - last.at < self.config.restart_window:
            self._set_state(State.DEGRADED, f"fault {last.id} ({last.cls}) in the restart window")
        elif self.recent_tps and self.recent_tps < SLOW_FACTOR * self.baseline_tps:
            self._set_state(
                State.DEGRADED,
                f"decode {self.recent_tps:.1f} tok/s, under half of {self.baseline_tps:.1f}",
            )
        else:
            self._set_state(State.READY, f"serving on worker {self.generation}")

    def _set_state(self, state: State, reason: str) -> None:
        old = self.state
        if state is not old and old is not State.STOPPING:
            log.info("state %s -> %s: %s", old, state, reason)
            self.state = state
            self.events.state_changed(old, state, reason)

    def _settle(self, fault: Fault) -> None:
        """The fault's action is decided: log it once, tell the observers."""
        log_fault(fault)
        self.events.fault_settled(fault)


def _bug(what: str) -> ApiError:
    return ApiError("internal_error", f"A bug in steward failed this request ({what}).")

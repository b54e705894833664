"""The supervisor: owns the worker, the state machine, and every decision after a fault.

One task (`start` runs it) does the work in order: bring a worker up, take the next job, follow it
to its end; when something fails, classify it (faults.py), canary or replace the worker,
then replay or settle the job (replay.py). The worker generates one request at a time,
so a serial loop is both the simplest design and an exact one: there is never a question
of which request a fault belongs to. HTTP handlers only `submit` and `cancel` jobs.

The loop must never die silently (the field report's zombie, made by steward itself): a
bug met while serving one job fails that job alone (500 `internal_error`) and the loop
goes on; a bug anywhere else ends the loop, health says `failed` at once, and the process
exits 70 (EX_SOFTWARE) so that its supervisor restarts it and someone reads the traceback.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections import deque

from steward.config import ServeConfig
from steward.errors import ApiError
from steward.model.resolve import ModelSource, is_vision
from steward.supervisor import canary, replay
from steward.supervisor.events import Observers
from steward.supervisor.faults import (
    CANARY_DECIDES,
    CANARY_MISMATCH,
    STALL,
    Fault,
    classify,
    log_fault,
)
from steward.supervisor.intensity import RestartIntensity
from steward.supervisor.jobs import Job, JobQueue
from steward.supervisor.link import FaultError, WorkerLink
from steward.supervisor.state import State
from steward.worker.injection import FaultSpec
from steward.worker.main import WorkerSettings
from steward.worker.protocol import Cancel, Generate, LoadFailed, Rejected, prompt_text

log = logging.getLogger("steward.supervisor")

EX_SOFTWARE = 70
EX_TEMPFAIL = 75
EX_CONFIG = 78
SLOW_FACTOR = 0.5  # decode below half the load-time baseline: degraded


class Exit(Exception):
    """Recovery is impossible in this process: exit with `code`."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


class InjectedBug(RuntimeError):
    """`--inject-fault supervisor:...`: stands for a bug in steward's own code."""


class Supervisor:
    def __init__(self, config: ServeConfig, source: ModelSource, faults: list[FaultSpec]):
        self.config = config
        self.source = source
        self.fault_specs = faults
        self.state = State.STARTING
        self.queue = JobQueue(config.queue_size)
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
        self.current: Job | None = None
        self.link: WorkerLink | None = None
        self.events = Observers()
        self._seq = itertools.count(1)
        self.bring_up_seconds = 10.0  # until measured: a guess for Retry-After
        self._recovery_since = time.monotonic()
        self._job_seconds = 1.0
        self._task: asyncio.Task[None] | None = None

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
        return job

    def too_long(self, job: Job) -> ApiError | None:
        """A prompt that cannot fit the context, decided without tokenising it: every token
        stands for at most `max_token_chars` characters, so a prompt of more non-blank
        characters than `context_length * max_token_chars` cannot fit (known once a worker
        has loaded the model)."""
        if self.context_length is None or self.max_token_chars is None:
            return None
        wanted = job.request.max_tokens or 1
        if wanted >= self.context_length:
            return ApiError(
                "context_length_exceeded",
                f"This model's maximum context length is {self.context_length} tokens; "
                f"{wanted} were requested for the completion alone.",
            )
        if job.prompt_chars <= (self.context_length - wanted) * self.max_token_chars:
            return None
        return ApiError(
            "context_length_exceeded",
            f"This model's maximum context length is {self.context_length} tokens; the "
            f"prompt has {job.prompt_chars} non-blank characters, more than "
            f"{self.context_length - wanted} tokens can hold.",
        )

    def cancel(self, job: Job) -> None:
        """The client is gone or out of time: drop the job wherever it is."""
        job.cancelled = True
        self.queue.remove(job)
        if job.running and self.link is not None:
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
        return max(1, round(len(self.queue) * self._job_seconds))

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
                job = await self._next_job()
                if job is not None:
                    self.current = job
                    self._inject(job, "crash")
                    await self._serve(job)
        except Exit as exc:
            state = State.FAILED if exc.code == EX_TEMPFAIL else State.STOPPING
            self._set_state(state, f"exit {exc.code}: {exc.reason}")
            log.critical("exiting %d: %s", exc.code, exc.reason)
            for job in self.queue.drain():
                job.push(self.queue_error() if exc.code == EX_TEMPFAIL else self._shutdown())
            if not self.exit_code.done():
                self.exit_code.set_result(exc.code)
        except Exception:
            log.critical("the supervision loop ended on a bug in steward", exc_info=True)
            self._set_state(State.FAILED, "a bug in steward ended the supervision loop")
            if self.current is not None:
                self.current.push(_bug("the supervision loop ended"))
            for job in self.queue.drain():
                job.push(self._exiting(None))
            self.exit_code.set_result(EX_SOFTWARE)

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
        while (self.current or len(self.queue)) and time.monotonic() < deadline:
            if cut.is_set():
                log.warning("drain cut short: %d request(s) abandoned", len(self.queue) + 1)
                break
            await asyncio.sleep(0.05)
        for job in [*self.queue.drain(), *([self.current] if self.current else [])]:
            job.push(self._shutdown())
        self._task.cancel()  # a worker exiting on request is no fault
        if self.link is not None:
            await self.link.stop(timeout=5.0)

    async def close(self) -> None:
        """Make sure no worker outlives the front's exit."""
        self._task.cancel()
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

    async def _next_job(self) -> Job | None:
        """Wait for work while watching the idle worker (death, wedged process)."""
        assert self.link is not None
        getter = asyncio.ensure_future(self.queue.get())
        event = asyncio.ensure_future(self.link.next())
        try:
            while True:
                done, _ = await asyncio.wait(
                    {getter, event}, timeout=1.0, return_when=asyncio.FIRST_COMPLETED
                )
                if event in done:
                    if isinstance(event.exception(), FaultError):
                        await self._recover(event.exception().fault, None)
                    event = asyncio.ensure_future(self.link.next())
                if getter in done:
                    return getter.result()
                if self.state.serving:
                    self._serving()  # a fault leaving the restart window ends `degraded`
                if self.link.silent_for() > self.config.stall_timeout:
                    fault = self.link.fault(
                        STALL, f"no heartbeat for {self.config.stall_timeout:.0f} s while idle"
                    )
                    event.cancel()
                    await self._recover(fault, None)
                    event = asyncio.ensure_future(self.link.next())
        except BaseException:
            if getter.done() and not getter.cancelled():
                self.queue.put(getter.result(), front=True)
            raise
        finally:
            getter.cancel()
            event.cancel()

    async def _serve(self, job: Job) -> None:
        """Run one job to its end. A backend fault goes to recovery; anything else raised
        here is a bug in steward that fails this job alone, and the loop goes on."""
        try:
            await self._follow(job)
        except FaultError as err:
            await self._recover(err.fault, job)
        except Exception as exc:
            log.error(
                "bug in steward while serving request %s; it alone fails",
                job.request_id,
                exc_info=True,
                extra={"request_id": job.request_id},
            )
            if self.link is not None and job.running:
                self.link.send(Cancel(job.id))
            job.push(_bug(f"{type(exc).__name__}: {exc}"))
        finally:
            self.current = None

    async def _follow(self, job: Job) -> None:
        if job.cancelled or job.finished:
            return
        assert self.link is not None
        if error := self.too_long(job):  # queued before the model's bounds were known
            job.push(error)
            return
        self._inject(job, "raise")
        job.attempts += 1
        job.text.clear()
        started = time.monotonic()
        self.link.send(job.message())
        result = await self.link.follow(job.id, job.add, self.config.stall_timeout, "request")
        if isinstance(result, Rejected):
            job.push(ApiError(result.type, result.message))
            return
        job.push(result)
        self.events.request_done(result)
        log.debug(
            "request %s done: %s, %d+%d tokens, worker ttft %.1f ms, decode %.1f tok/s",
            job.request_id,
            result.finish_reason,
            result.prompt_tokens,
            result.completion_tokens,
            result.ttft * 1e3,
            result.decode_tps,
        )
        self._job_seconds = 0.8 * self._job_seconds + 0.2 * (time.monotonic() - started)
        if result.completion_tokens >= canary.MAX_TOKENS and result.decode_tps > 0:
            self.recent_tps = result.decode_tps
            self._serving()

    # -- faults and recovery ----------------------------------------------------------

    async def _recover(self, fault: Fault, job: Job | None) -> None:
        """Decide and act: keep the worker (canary passed) or replace it; settle the job."""
        if job is not None:
            fault.request_id = job.request_id
        self._record(fault)
        self._set_state(State.RECOVERING, f"fault {fault.id} ({fault.cls})")
        self._recovery_since = time.monotonic()
        if job and replay.before_recovery(job, fault, self.quarantine, self.retry_after()):
            self.events.request_quarantined()
        kept, verdict = False, ""
        try:
            if fault.cls in CANARY_DECIDES:
                failed = await self._canary()
                kept = failed is None
                verdict = "" if kept else f"canary failed ({failed.cls}); "
            if kept:
                fault.action = "kept worker (canary passed)"
            elif self.config.on_fault == "exit":
                raise Exit(EX_TEMPFAIL, f"{fault.cls} fault and --on-fault exit")
            else:
                fault.action = verdict + "replacing worker"
                await self._replace()
                fault.action = verdict + f"replaced worker (generation {self.generation})"
        except Exit as exc:
            fault.action = verdict + f"exit {exc.code}"
            if job is not None:
                job.push(self._exiting(fault))
            self._settle(fault)
            raise
        if job is not None and replay.after_recovery(job, fault, kept):
            log.info("replaying request %s (attempt %d)", job.request_id, job.attempts + 1)
            self.queue.put(job, front=True)
        self._serving()
        fault.recovery_s = round(time.monotonic() - fault.detected, 3)
        self._settle(fault)

    async def _replace(self) -> None:
        """Kill the worker and start another, within the restart intensity."""
        for _attempt in range(2):
            await self._kill_worker()
            if not self.intensity.allow():
                raise Exit(
                    EX_TEMPFAIL,
                    f"more than {self.config.max_restarts} restarts in "
                    f"{self.config.restart_window:.0f} s",
                )
            if await self._start_worker():
                return
        raise Exit(EX_TEMPFAIL, "a replacement worker failed to come up twice")

    async def _start_worker(self) -> bool:
        """Spawn, load, canary. False (fault recorded) when this worker cannot serve."""
        self.generation += 1
        self._recovery_since = time.monotonic()
        settings = WorkerSettings(
            self.source,
            self.generation,
            self.fault_specs,
            os.getpid(),
            self.config.worker_memory_limit,
        )
        self.link = link = await WorkerLink.spawn(settings)
        log.info("worker %d started (pid %d)", self.generation, link.pid)
        self.events.worker_started(self.generation)
        try:
            msg = await link.loaded(self.config.load_timeout)
            if isinstance(msg, LoadFailed):
                if msg.config:
                    raise Exit(EX_CONFIG, f"model unusable: {msg.message}")
                raise FaultError(link.fault(classify(msg.message), msg.message, msg.traceback))
            self.context_length = msg.context_length
            self.max_token_chars = msg.max_token_chars
            failure = await self._canary()
            if failure is not None:
                raise FaultError(failure)
        except FaultError as err:
            err.fault.action = "worker discarded (failed to come up)"
            self._record(err.fault)
            self._settle(err.fault)
            await self._kill_worker()
            return False
        self.bring_up_seconds = time.monotonic() - self._recovery_since
        log.info("worker %d ready in %.2f s", self.generation, self.bring_up_seconds)
        return True

    async def _canary(self) -> Fault | None:
        """Run the canary on the current worker: None if it passed, else the fault."""
        assert self.link is not None
        started = time.monotonic()
        try:
            tokens, tps = await canary.run(self.link, self.config.stall_timeout)
        except FaultError as err:
            self.events.canary_ran(False, time.monotonic() - started)
            return err.fault
        self.events.canary_ran(tokens == (self.golden or tokens), time.monotonic() - started)
        if self.golden is None:
            self.golden, self.baseline_tps = tokens, tps
            log.info("canary golden tokens %s, decode %.1f tok/s", tokens, tps)
        elif tokens != self.golden:
            return self.link.fault(
                CANARY_MISMATCH, f"canary tokens {list(tokens)} differ from {list(self.golden)}"
            )
        return None

    async def _kill_worker(self) -> None:
        if self.link is not None:
            await self.link.kill()

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

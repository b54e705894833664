"""The supervisor: one task that watches the worker and carries out every decision.

The loop only decides and acts: start queued jobs while the batch has room (scheduler.py),
and when the worker's line reports a fault, classify it (faults.py), canary or replace the
worker (bringup.py), then carry out the plan that the pure decisions make for every job that
was in flight (recovery.py, groups.py, quarantine.py). A worker silent past the bound its
own step clock sets (bounds.py, silence.py) is suspected of a hang, and failed over as the
cost allows, its verdict left to the evidence (failover.py, suspicions.py). The loop sleeps
until the next thing to decide, a silence's bound included. Tokens never pass through this
loop: the worker's line routes them to their jobs (link.py). HTTP handlers only `submit`
and `cancel` jobs; health and metrics read `snapshot()`.

The loop must never die silently (the field report's zombie, made by steward itself): a
bug met while starting one job fails that job alone (500 `internal_error`) and the loop
goes on; a bug anywhere else ends the loop, health says `failed` at once, and the process
exits 70 (EX_SOFTWARE) so that its supervisor restarts it and someone reads the traceback.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time

from steward.config import ServeConfig
from steward.errors import ApiError
from steward.model.resolve import ModelSource
from steward.supervisor import answers, recovery
from steward.supervisor.admission import Admission
from steward.supervisor.bounds import StepBounds
from steward.supervisor.bringup import BringUp, Spawn
from steward.supervisor.context import Context
from steward.supervisor.dispatch import Dispatcher
from steward.supervisor.events import Observers
from steward.supervisor.exits import EX_CONFIG, EX_SOFTWARE, EX_TEMPFAIL, Exit
from steward.supervisor.facts import PromptBound
from steward.supervisor.faultlog import FaultLog
from steward.supervisor.faults import Fault, FaultClass, Outcome
from steward.supervisor.jobs import Job
from steward.supervisor.line import Link
from steward.supervisor.link import WorkerLink
from steward.supervisor.pace import Pace
from steward.supervisor.quarantine import Quarantine
from steward.supervisor.scheduler import Scheduler
from steward.supervisor.silence import Judged, Silence, silence
from steward.supervisor.snapshot import Snapshot
from steward.supervisor.speeds import Speeds
from steward.supervisor.state import State
from steward.supervisor.suspicions import Suspicions
from steward.wire.faultspec import FaultSpec
from steward.wire.protocol import Calibration, Cancel

log = logging.getLogger("steward.supervisor")

TICK = 0.5  # seconds the loop sleeps at most: a fault leaving the restart window, and such


class Supervisor:
    def __init__(
        self,
        config: ServeConfig,
        source: ModelSource,
        specs: list[FaultSpec],  # what --inject-fault asks of this model's workers
        spawn: Spawn = WorkerLink.spawn,  # tests of the decisions pass a fake worker line
        bring_up_s: float | None = None,  # the model's last bring-up: Retry-After's guess
        quarantine: Quarantine | None = None,  # the model's, kept across loads (pool/slot.py)
        calibration: Calibration | None = None,  # what an earlier load of the model measured
        unbudgeted: bool = True,  # no pool's memory budget counts this model's copies
    ):
        self.config = config
        self.source = source
        self.state = State.STARTING
        self.events = Observers()
        self.fault_log = FaultLog(self.events)
        self.bounds = StepBounds(config.stall_timeout)
        self.speeds = Speeds()
        self.quarantine = Quarantine(config.restart_window) if quarantine is None else quarantine
        self.scheduler = Scheduler(config.max_batch, config.queue_size, config.restart_window)
        self.bringup = BringUp(
            config,
            source,
            spawn,
            specs=specs,
            bounds=self.bounds,
            speeds=self.speeds,
            events=self.events,
            report=self.fault_log.report,
            calibration=calibration,
            unbudgeted=unbudgeted,
        )
        if bring_up_s is not None:
            self.bringup.measured(bring_up_s)
        self.context = Context(
            config=config,
            scheduler=self.scheduler,
            quarantine=self.quarantine,
            fault_log=self.fault_log,
            events=self.events,
            pace=Pace(),
            wake=asyncio.Event(),
            facts=lambda: self.bringup.facts,
            state=lambda: self.state,
        )
        self.admission = Admission(self.context)
        self.dispatch = Dispatcher(self.context, specs, self.speeds)
        self.suspicions = Suspicions(self)
        # the HTTP side: handlers only submit and cancel jobs
        self.submit = self.admission.submit
        self.queue_error, self.retry_after = self.admission.waited, self.admission.retry_after
        self.exit_code: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.started_at = time.time()
        self._task: asyncio.Task[None] | None = None

    @property
    def link(self) -> Link | None:
        return self.bringup.link

    @property
    def context_length(self) -> int | None:
        return self.bringup.facts.model.context_length

    @property
    def prompt_bound(self) -> PromptBound | None:
        """What bounds a prompt before it is tokenised, once a worker has said (the front
        refuses an embedding input past it: `PromptBound.least_tokens`)."""
        return self.bringup.facts.model.prompt_bound

    def cancel(self, job: Job) -> None:
        """The client is gone or out of time: drop the job wherever it is (a running one
        leaves the batch when the worker says it has)."""
        if self.scheduler.cancel(job) and self.link is not None:
            self.link.send(Cancel(job.id))

    def snapshot(self) -> Snapshot:
        link, scheduler, last = self.link, self.scheduler, self.fault_log.last
        facts = self.bringup.facts
        return Snapshot(
            status=self.status(),
            model=self.source.model_id,
            retry_after=self.retry_after(),
            worker_pid=link.pid if link else None,
            worker_generation=link.generation if link else 0,
            workers_started=self.bringup.generation,
            worker_alive=bool(link and link.alive),
            bring_up_s=facts.seconds,
            faults_total=self.fault_log.total,
            last_fault=last.summary() if last else None,
            restarts_in_window=self.bringup.intensity.in_window(),
            queue_depth=len(scheduler.queue),
            standby=self.bringup.standby.summary(),
            batch_size=len(scheduler.running),
            batch_limit=scheduler.limit,
            probation=scheduler.on_probation,
            quarantined=len(self.quarantine),
            context_length=self.context_length,
            decode_baseline=self.speeds.baseline_tps,
            decode_recent=self.speeds.recent_tps,
            uptime_s=time.time() - self.started_at,
            model_bytes=facts.model.model_bytes,
            device_bytes=facts.model.device_bytes,
            phases=dict(facts.phases),
            suspects=self.suspicions.summary(),
            ranks=link.ranks if link else [],
        )

    # -- the loop ---------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())
        self._task.add_done_callback(self._ended)

    def alive(self) -> bool:
        """The supervision task still runs (what health and the systemd watchdog vouch for)."""
        return self._task is None or not self._task.done()

    def status(self) -> State:
        """`failed` as soon as the supervision task has ended, whatever it last said."""
        if not self.alive() and self.state is not State.STOPPING:
            return State.FAILED
        return self.state

    @property
    def calibration(self) -> Calibration | None:
        """What the model's first worker measured on this device (a replacement reuses it)."""
        return self.bringup.calibration

    @property
    def loading_s(self) -> float:
        """The last bring-up that loaded the model: what the next load costs (a hot spare's
        promotion is a swap, not a load)."""
        return self.bringup.facts.loading_s

    @property
    def hot(self) -> bool:
        """Its standby holds a second copy of the model: a pool's budget counts two."""
        return self.bringup.standby.mode == "hot"

    async def _run(self) -> None:
        """Supervise until stopped; on unrecoverable failure, resolve `exit_code`."""
        try:
            await self.bringup.first()
            self.serving()
            while True:
                assert self.link is not None
                if self._spare_may_start():
                    self.bringup.refill()
                if self.scheduler.held and self.bringup.standby.netted:
                    self.scheduler.release()
                self.dispatch.start_next(self.link)
                await self._watch()
        except Exit as exc:
            state = State.FAILED if exc.code == EX_TEMPFAIL else State.STOPPING
            self.set_state(state, f"exit {exc.code}: {exc.reason}")
            log.critical("exiting %d: %s", exc.code, exc.reason)
            if exc.code == EX_TEMPFAIL:
                self.dispatch.end_all(self.queue_error)
            elif exc.code == EX_CONFIG:  # the requests a load on demand held
                self.dispatch.end_all(functools.partial(answers.unusable, exc.reason))
            else:
                self.dispatch.end_all(answers.shutdown)
            if not self.exit_code.done():
                self.exit_code.set_result(exc.code)
        except Exception:
            log.critical("the supervision loop ended on a bug in steward", exc_info=True)
            self.set_state(State.FAILED, "a bug in steward ended the supervision loop")
            if (current := self.dispatch.current) is not None:
                self.dispatch.end(current, answers.bug("the supervision loop ended"))
            self.dispatch.end_all(self._exiting)
            self.exit_code.set_result(EX_SOFTWARE)

    def _ended(self, task: asyncio.Task[None]) -> None:
        """However the task ended, the process must not outlive it as a zombie."""
        if self.state is not State.STOPPING and not self.exit_code.done():
            log.critical("the supervision loop ended unexpectedly (%s)", task)
            self.exit_code.set_result(EX_SOFTWARE)

    async def stop(self, drain_timeout: float, cut: asyncio.Event) -> None:
        """Drain: refuse new work, let queued and running jobs finish (until the timeout, or
        until `cut` is set by a second signal), then stop the worker."""
        self.set_state(State.STOPPING, "draining")
        deadline = time.monotonic() + drain_timeout
        started = self._task is not None  # else nothing would ever run what it holds
        while started and self.scheduler.unfinished() and time.monotonic() < deadline:
            if cut.is_set():
                left = len(self.scheduler.unfinished())
                log.warning("drain cut short: %d request(s) abandoned", left)
                break
            await asyncio.sleep(0.05)
        self.dispatch.end_all(answers.shutdown)
        if self._task is not None:  # never started: a model unloaded before its load began
            self._task.cancel()  # a worker exiting on request is no fault
        await self.suspicions.close()  # a suspect has nothing to finish
        await self.bringup.standby.close()
        if self.link is not None:
            await self.link.stop(timeout=5.0)

    async def close(self) -> None:
        """Make sure no worker outlives the front's exit, and no request is left without an
        answer: after a drain there is none; when the process exits on another model's
        failure, this model's are told it is exiting (a retryable 503)."""
        if self.alive():  # a loop that ended stays `failed`
            self.set_state(State.STOPPING, "closing")
        self.dispatch.end_all(self._exiting)
        if self._task is not None:
            self._task.cancel()
        await self.suspicions.close()
        await self.bringup.close()

    def _exiting(self) -> ApiError:
        return answers.exiting(None, self.retry_after())

    def _spare_may_start(self) -> bool:
        """A spare's bring-up does not slow the replay of a fault's suspects. On a CPU it
        would until the replay is over: its imports, load and canary take the cores the
        replay decodes on. On a GPU it starts at once: its start, imports and load run on
        the host's other cores, its short warm-up of shapes and canary are all it asks of
        the device, and a second fault of the same recovery (a poison tried alone) finds it
        on its way instead of starting a worker from nothing while new requests wait; once
        the model's calibration is known, that is, since a spare without it would measure it
        too, beside the serving worker measuring it between requests."""
        if not self.bringup.facts.model.gpu:
            return not self.scheduler.replaying
        return self.bringup.calibration is not None

    def _silence(self, link: Link) -> Silence:
        running = self.scheduler.running.values()
        return silence(link, running, self.dispatch.busy_since, self.bounds)

    async def _watch(self) -> None:
        """Wait for something to decide: work, a job's end, a fault, or a silence's bound."""
        link = self.link
        assert link is not None
        quiet = self._silence(link)
        self.context.wake.clear()
        woken = asyncio.ensure_future(self.context.wake.wait())
        timeout = min(TICK, max(0.0, quiet.deadline - time.monotonic()))
        try:
            await asyncio.wait(
                {woken, link.failure}, timeout=timeout, return_when="FIRST_COMPLETED"
            )
        finally:
            woken.cancel()
        if link.failure.done():
            await self.recover(link.failure.result())
            return
        quiet = self._silence(link)
        judged = quiet.judge(link.heartbeat)
        if judged is Judged.HUNG:
            await self.recover(link.fault(FaultClass.STALL, quiet.message()))
        elif judged is Judged.SUSPECT:
            await self.suspicions.suspect(link.fault(FaultClass.STALL, quiet.message()), quiet)
        elif self.state.serving:
            self.serving()  # a fault leaving the restart window ends `degraded`

    # -- faults and recovery ----------------------------------------------------------

    async def recover(self, fault: Fault) -> None:
        """Decide and act: keep the worker (canary passed) or replace it; then carry out
        the plan for every job that was in flight."""
        link = self.link
        assert link is not None
        link.rearm()
        self.fault_log.record(fault)
        suspects, regroup = self.seize(fault)
        self.quarantine.fault(job.digest for job in suspects)
        passed, verdict = None, ""
        if recovery.needs_canary(fault.cls):
            failed = await self.bringup.check()
            passed = failed is None
            verdict = "" if passed else f"canary failed ({failed.cls}); "
        try:
            action = recovery.worker(fault.cls, passed, self.config.on_fault)
            if action is recovery.Verdict.KEEP:
                fault.decide(Outcome.KEPT, "kept worker (canary passed)")
            elif action is recovery.Verdict.EXIT:
                raise Exit(EX_TEMPFAIL, f"{fault.cls} fault and --on-fault exit")
            else:
                fault.action = verdict + "replacing worker"
                outcome = await self.bringup.replace(fault)
                how = "promoted standby" if outcome is Outcome.PROMOTED else "replaced worker"
                generation = self.link.generation if self.link else 0
                fault.decide(outcome, verdict + f"{how} (generation {generation})")
        except Exit as exc:
            self.give_up(fault, suspects, verdict + f"exit {exc.code}")
            raise
        self.plan(fault, suspects, regroup, kept=passed is True)
        self.fault_log.report(fault)

    def seize(self, fault: Fault) -> tuple[list[Job], bool]:
        """The batch faulted: its members are suspects now, off the serving worker."""
        link = self.link
        assert link is not None
        suspects, regroup = self.scheduler.fault()
        link.forget_all()
        for job in suspects:  # a kept worker may have taken some in after the fault
            link.send(Cancel(job.id))
        if len(suspects) == 1:
            fault.request_id = suspects[0].request_id
        self.set_state(State.RECOVERING, f"fault {fault.id} ({fault.cls})")
        self.bringup.began()
        return suspects, regroup

    def plan(self, fault: Fault, suspects: list[Job], regroup: bool, kept: bool) -> None:
        """What each suspect gets now that a worker serves again (recovery.py)."""
        intensity = self.bringup.intensity
        affordable = None if kept else max(0, self.config.max_restarts - intensity.in_window())
        convicted = {j.digest for j in suspects if self.quarantine.blocked(j.digest)}
        plan = recovery.suspects(suspects, fault.cls, kept, regroup, convicted, affordable)
        self.dispatch.carry_out(plan, fault)
        self.serving()
        fault.recovery_s = round(time.monotonic() - fault.detected, 3)

    def give_up(self, fault: Fault, suspects: list[Job], action: str) -> None:
        """No worker will serve: the suspects are told the process exits."""
        fault.decide(Outcome.EXIT, action)
        for job in suspects:
            self.dispatch.end(job, answers.exiting(fault, self.retry_after()))
        self.fault_log.report(fault)

    # -- state --------------------------------------------------------------------------

    def serving(self) -> None:
        """Serving: `degraded` while a fault is within the restart window, a suspect awaits
        its verdict, or decode is slow."""
        self.scheduler.worker_said(self.bringup.facts.model.max_batch)
        last = self.fault_log.last
        if last and time.time() - last.at < self.config.restart_window:
            self.set_state(State.DEGRADED, f"fault {last.id} ({last.cls}) in the restart window")
        elif aside := self.suspicions.pending():
            self.set_state(State.DEGRADED, aside)
        elif slow := self.speeds.slow():
            self.set_state(State.DEGRADED, slow)
        else:
            self.set_state(State.READY, f"serving on worker {self.bringup.generation}")

    def set_state(self, state: State, reason: str) -> None:
        old = self.state
        if state is not old and old is not State.STOPPING:
            log.info("state %s -> %s: %s", old, state, reason)
            if old is State.RECOVERING:
                self.admission.recovered()
            self.state = state
            self.events.state_changed(old, state, reason)

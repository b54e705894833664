"""What the backend's measured speeds say: how long its silence may last, and whether it is slow.

A stall is no progress (a token, a prefill chunk) for longer than the work in hand should
take. A fixed `--stall-timeout` alone calls a healthy worker hung when the work is slow (a
long prompt on a CPU, the first canary while kernels compile), so the deadline is the larger
of that flag and `FACTOR` times what the speeds measured here say the next progress needs:
the prompt tokens still to prefill at the median prefill speed of recent answers (a batched
answer's own speed understates the device's, which errs on the safe side), plus one decode
step at the slowest step seen. Before anything is measured, the first canary is bounded by the
model's own load time. A real hang is caught within `max(--stall-timeout, FACTOR x that
estimate)`.

Which answers measure the backend: only a request decoded alone, whole (not resumed), with
nothing shaping its logits or read per token, says how fast the backend decodes, like the
canary that set the baseline; when the median of the last few such answers is below `SLOW`
of that baseline, the backend is `degraded` (one answer alone is noise on a busy machine).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections import deque
from collections.abc import Collection

from steward.supervisor.faults import Fault, FaultClass
from steward.supervisor.jobs import Job
from steward.supervisor.link import WorkerLink
from steward.wire.protocol import Done, Embed, Generate

log = logging.getLogger("steward.supervisor")

FACTOR = 4.0  # headroom over the estimate: a loaded machine runs slower than it measured
SLOW = 0.5  # decode below half the baseline: degraded
KEPT = 16  # recent measurements kept
LIKE = 5  # requests like the canary whose median is the recent decode speed (one is noise)
JUDGED = 3  # of them, the fewest that judge the backend slow


def plain(req: Generate) -> bool:
    """Decoded as the canary is: nothing shapes its logits (a grammar, penalties,
    `logit_bias`) or truncates them (top_p, top_k, min_p: top_p sorts the vocabulary every
    token, which halves a small model's speed on a CPU), and nothing more is read per token
    (logprobs). Its speed says how fast the backend is, not what the request asked of it."""
    return (
        req.grammar is None
        and req.logprobs < 0
        and not req.logit_bias
        and not req.penalised
        and req.top_p == 1.0
        and req.top_k <= 0
        and req.min_p == 0.0
    )


class Speeds:
    def __init__(self, stall_timeout: float) -> None:
        self.stall_timeout = stall_timeout
        self.load_s = 0.0  # the first worker's model load
        self.canary_s = 0.0  # the first canary, whole
        self.baseline_tps = 0.0  # the first canary's decode speed
        self.recent_tps = 0.0  # the median of the last requests that measure the backend
        self._like: deque[float] = deque(maxlen=LIKE)
        self._prefill_tps: deque[float] = deque(maxlen=KEPT)
        self._step_s: deque[float] = deque(maxlen=KEPT)
        self._warned = False

    def loaded(self, seconds: float) -> None:
        if not self.load_s:
            self.load_s = seconds

    def canary(self, done: Done, seconds: float) -> None:
        """The canary's answer: the baseline (the first one), and a measurement like any."""
        if not self.baseline_tps:
            self.baseline_tps, self.canary_s = done.decode_tps, seconds
        self.measure(done)

    def measure(self, done: Done) -> None:
        """Every answer tells how fast prefill and a decode step went."""
        computed = done.prompt_tokens - done.cached_tokens
        if computed > 0 and done.ttft > 0:
            self._prefill_tps.append(computed / done.ttft)
        if done.decode_tps > 0:
            self._step_s.append(1.0 / done.decode_tps)

    def finished(self, req: Generate | Embed, done: Done, whole: bool) -> None:
        """A client's answer: measured, and the recent speed if it is like the canary's
        (an embedding decodes nothing: its speed is its prefill's)."""
        self.measure(done)
        if not isinstance(req, Generate):
            return
        if whole and done.batch == 1 and plain(req) and done.completion_tokens >= 8:
            self._like.append(done.decode_tps)
            self.recent_tps = statistics.median(self._like)

    def slow(self) -> str | None:
        """Why decode counts as slow now, if it does."""
        if len(self._like) >= JUDGED and self.recent_tps < SLOW * self.baseline_tps:
            return f"decode {self.recent_tps:.1f} tok/s, under half of {self.baseline_tps:.1f}"
        return None

    def stalled(self, link: WorkerLink, running: Collection[Job], since: float) -> Fault | None:
        """Busy (since `since` at the latest): no progress within what the work in hand
        should take. Idle: no heartbeat within --stall-timeout."""
        if running:
            since = max(link.progress, since)
            pending = sum(j.prefill or j.prompt_chars for j in running if not j.started)
            allowed = self.deadline(pending)
            if (silent := time.monotonic() - since) > allowed:
                message = f"no progress on the batch for {silent:.1f} s (allowed {allowed:.1f} s)"
                return link.fault(FaultClass.STALL, message)
        elif link.silent_for() > self.stall_timeout:
            timeout = self.stall_timeout
            return link.fault(FaultClass.STALL, f"no heartbeat for {timeout:.0f} s while idle")
        return None

    def deadline(self, prefill_tokens: int) -> float:
        """Seconds of silence allowed while `prefill_tokens` wait to be computed."""
        estimate = self.canary_s or self.load_s  # nothing measured yet: the canary's own
        if self._prefill_tps:  # an embedding model measures no decode step
            estimate = prefill_tokens / statistics.median(self._prefill_tps) + max(
                self._step_s, default=0.0
            )
        bound = FACTOR * estimate
        if bound > self.stall_timeout and not self._warned:
            self._warned = True
            log.warning(
                "--stall-timeout %.1f s is below what this backend needs (%.1f s measured "
                "for the work in hand): the measured bound is used",
                self.stall_timeout,
                bound,
            )
        return max(self.stall_timeout, bound)

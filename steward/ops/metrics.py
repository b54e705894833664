"""Prometheus metrics for `/metrics`, fed by the supervisor's events and the HTTP front.

A registry of our own, not prometheus_client's global one: `/metrics` then shows steward's
series only, and two apps in one process (tests) never collide. State, queue depth,
generation, batch and restarts in window come from one supervisor snapshot taken at scrape
time, so they never go stale between transitions and never mix two moments.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from steward.supervisor.events import Observer
from steward.supervisor.state import State

if TYPE_CHECKING:
    from steward.supervisor.faults import Fault
    from steward.wire.protocol import Done

RECOVERY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
TPS_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)


class Metrics(Observer):
    def __init__(self, supervisor: Any) -> None:
        self.supervisor = supervisor  # read through `snapshot()` alone
        self.registry = r = CollectorRegistry()
        self.requests = Counter(
            "steward_requests_total", "HTTP responses", ["route", "status"], registry=r
        )
        self.errors = Counter(
            "steward_errors_total", "Error envelopes and SSE error events", ["type"], registry=r
        )
        self.faults = Counter(
            "steward_faults_total",
            "Backend faults by class and outcome",
            ["class", "action"],
            registry=r,
        )
        self.restarts = Counter(
            "steward_worker_restarts_total", "Workers started after the first", registry=r
        )
        self.recovery = Histogram(
            "steward_recovery_seconds",
            "Fault detected to serving again",
            buckets=RECOVERY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "steward_time_to_first_token_seconds",
            "Time to first token, as the worker measured",
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.decode = Histogram(
            "steward_decode_tokens_per_second",
            "Decode speed per request",
            buckets=TPS_BUCKETS,
            registry=r,
        )
        self.quarantined = Counter(
            "steward_quarantined_requests_total", "Requests refused as quarantined", registry=r
        )
        self.canaries = Counter(
            "steward_canary_runs_total", "Canary runs by result", ["result"], registry=r
        )
        for result in ("pass", "fail"):
            self.canaries.labels(result)
        self.state = Gauge(
            "steward_state", "1 for the current state, else 0", ["state"], registry=r
        )
        self.generation = Gauge(
            "steward_worker_generation", "The serving worker's number, in start order", registry=r
        )
        self.queue = Gauge("steward_queue_depth", "Requests waiting", registry=r)
        self.batch = Gauge("steward_batch_size", "Requests decoding together now", registry=r)
        self.limit = Gauge(
            "steward_batch_limit", "Requests that may decode together now", registry=r
        )
        self.generated = Counter(
            "steward_generated_tokens_total", "Completion tokens generated", registry=r
        )
        self.prompt_tokens = Counter(
            "steward_prompt_tokens_total", "Prompt tokens of finished requests", registry=r
        )
        self.cache_hits = Counter(
            "steward_prompt_cache_hits_total",
            "Requests whose prompt prefix came from the prompt cache",
            registry=r,
        )
        self.cached_tokens = Counter(
            "steward_prompt_cache_tokens_total",
            "Prompt tokens taken from the prompt cache instead of prefilled",
            registry=r,
        )
        self.in_window = Gauge(
            "steward_restarts_in_window", "Worker restarts within --restart-window", registry=r
        )

    # -- the HTTP front ---------------------------------------------------------------

    def request(self, route: str, status: int) -> None:
        self.requests.labels(route, str(status)).inc()

    def error(self, type: str) -> None:
        self.errors.labels(type).inc()

    def render(self) -> tuple[bytes, str]:
        snapshot = self.supervisor.snapshot()
        for state in State:
            self.state.labels(state.value).set(float(snapshot.status is state))
        self.generation.set(snapshot.worker_generation)
        self.queue.set(snapshot.queue_depth)
        self.batch.set(snapshot.batch_size)
        self.limit.set(snapshot.batch_limit)
        self.in_window.set(snapshot.restarts_in_window)
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    # -- the supervisor's events ------------------------------------------------------

    def fault_settled(self, fault: Fault) -> None:
        self.faults.labels(fault.cls, fault.outcome).inc()
        if fault.recovery_s is not None:
            self.recovery.observe(fault.recovery_s)

    def worker_started(self, generation: int) -> None:
        if generation > 1:
            self.restarts.inc()

    def canary_ran(self, passed: bool, seconds: float) -> None:
        self.canaries.labels("pass" if passed else "fail").inc()

    def request_done(self, done: Done) -> None:
        self.ttft.observe(done.ttft)
        if done.decode_tps > 0:
            self.decode.observe(done.decode_tps)
        self.generated.inc(done.completion_tokens)
        self.prompt_tokens.inc(done.prompt_tokens)
        if done.cached_tokens:
            self.cache_hits.inc()
            self.cached_tokens.inc(done.cached_tokens)

    def request_quarantined(self) -> None:
        self.quarantined.inc()

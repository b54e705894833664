"""Prometheus metrics for `/metrics`, fed by the supervisors' events and the HTTP front.

A registry of our own, not prometheus_client's global one: `/metrics` then shows steward's
series only, and two apps in one process (tests) never collide. State, queue depth,
generation, batch and restarts in window come from one pool snapshot taken at scrape
time, so they never go stale between transitions and never mix two moments. With several
models every per-model series has a `model` label, its values the configured models alone
(bounded cardinality); with one, the series are unlabelled, as they always were.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from steward.ops.rank_metrics import RanksCollector
from steward.pool.snapshot import ModelState, PoolSnapshot
from steward.supervisor.events import Observer
from steward.supervisor.snapshot import Snapshot
from steward.supervisor.state import State

if TYPE_CHECKING:
    from steward.supervisor.faults import Fault
    from steward.wire.protocol import Done

RECOVERY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
TPS_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)


class ModelSeries(Observer):
    """One model's supervisor events into the shared series, under its `model` label (no
    label with one model: `/metrics` as it always was)."""

    def __init__(self, metrics: Metrics, model: str | None) -> None:
        self.metrics = metrics
        self.key = () if model is None else (model,)

    def at(self, metric: Any, *labels: str) -> Any:
        values = (*self.key, *labels)
        return metric.labels(*values) if values else metric

    def fault_settled(self, fault: Fault) -> None:
        m = self.metrics
        self.at(m.faults, fault.cls, fault.outcome).inc()
        if fault.recovery_s is not None:
            self.at(m.recovery).observe(fault.recovery_s)

    def worker_started(self, generation: int) -> None:
        if generation > 1:
            self.at(self.metrics.restarts).inc()

    def canary_ran(self, passed: bool, seconds: float) -> None:
        self.at(self.metrics.canaries, "pass" if passed else "fail").inc()

    def request_done(self, done: Done) -> None:
        m = self.metrics
        self.at(m.ttft).observe(done.ttft)
        if done.decode_tps > 0:
            self.at(m.decode).observe(done.decode_tps)
        self.at(m.generated).inc(done.completion_tokens)
        self.at(m.prompt_tokens).inc(done.prompt_tokens)
        if done.cached_tokens:
            self.at(m.cache_hits).inc()
            self.at(m.cached_tokens).inc(done.cached_tokens)
        if drafts := done.accepted_prediction_tokens + done.rejected_prediction_tokens:
            self.at(m.drafts, "accepted").inc(done.accepted_prediction_tokens)
            self.at(m.drafts, "rejected").inc(drafts - done.accepted_prediction_tokens)
        if done.disk is not None:  # the disk tier's (--prompt-cache-dir)
            if done.disk.tokens or done.disk.missed:
                self.at(m.disk_lookups, "hit" if done.disk.tokens else "miss").inc()
            self.at(m.disk_tokens).inc(done.disk.tokens)
            self.at(m.disk_errors).inc(done.disk.errors)
            self.at(m.disk_bytes).set(done.disk.bytes)

    def request_quarantined(self) -> None:
        self.at(self.metrics.quarantined).inc()

    def suspicion_judged(self, verdict: str) -> None:
        self.at(self.metrics.suspicions, verdict).inc()

    def gauges(self, snapshot: Snapshot | None, state: str | None) -> None:
        """The scrape-time gauges from the model's supervisor's snapshot (none: unloaded)."""
        m = self.metrics
        states = [s.value for s in (ModelState if self.key else State)]
        for name in states:
            self.at(m.state, name).set(float(name == state))
        self.at(m.generation).set(snapshot.worker_generation if snapshot else 0)
        self.at(m.queue).set(snapshot.queue_depth if snapshot else 0)
        self.at(m.batch).set(snapshot.batch_size if snapshot else 0)
        self.at(m.limit).set(snapshot.batch_limit if snapshot else 0)
        self.at(m.in_window).set(snapshot.restarts_in_window if snapshot else 0)


class Metrics(ModelSeries):
    """The registry, and the series of the one model (`labelled`: of each model, through
    `series`)."""

    def __init__(self, supervisor: Any, labelled: bool = False) -> None:
        super().__init__(self, None)
        self.supervisor = supervisor  # read through `snapshot()` alone: a pool's, or one's
        self.labelled = labelled
        self._series: dict[str, ModelSeries] = {}
        by = ["model"] if labelled else []
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
            [*by, "class", "action"],
            registry=r,
        )
        self.restarts = Counter(
            "steward_worker_restarts_total", "Workers started after the first", by, registry=r
        )
        self.recovery = Histogram(
            "steward_recovery_seconds",
            "Fault detected to serving again",
            by,
            buckets=RECOVERY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "steward_time_to_first_token_seconds",
            "Time to first token, as the worker measured",
            by,
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.decode = Histogram(
            "steward_decode_tokens_per_second",
            "Decode speed per request",
            by,
            buckets=TPS_BUCKETS,
            registry=r,
        )
        self.quarantined = Counter(
            "steward_quarantined_requests_total",
            "Requests refused as quarantined",
            by,
            registry=r,
        )
        self.canaries = Counter(
            "steward_canary_runs_total", "Canary runs by result", [*by, "result"], registry=r
        )
        self.suspicions = Counter(
            "steward_stall_suspicions_total",
            "Workers suspected of a hang, by verdict: slow (no fault), hung, failed",
            [*by, "verdict"],
            registry=r,
        )
        self.state = Gauge(
            "steward_state", "1 for the current state, else 0", [*by, "state"], registry=r
        )
        self.generation = Gauge(
            "steward_worker_generation",
            "The serving worker's number, in start order",
            by,
            registry=r,
        )
        self.queue = Gauge("steward_queue_depth", "Requests waiting", by, registry=r)
        self.batch = Gauge("steward_batch_size", "Requests decoding together now", by, registry=r)
        self.limit = Gauge(
            "steward_batch_limit", "Requests that may decode together now", by, registry=r
        )
        self.generated = Counter(
            "steward_generated_tokens_total", "Completion tokens generated", by, registry=r
        )
        self.prompt_tokens = Counter(
            "steward_prompt_tokens_total", "Prompt tokens of finished requests", by, registry=r
        )
        self.cache_hits = Counter(
            "steward_prompt_cache_hits_total",
            "Requests whose prompt prefix came from the prompt cache",
            by,
            registry=r,
        )
        self.cached_tokens = Counter(
            "steward_prompt_cache_tokens_total",
            "Prompt tokens taken from the prompt cache instead of prefilled",
            by,
            registry=r,
        )
        self.drafts = Counter(
            "steward_draft_tokens_total",
            "Draft tokens verified (a prediction's, or found by lookup): the answer kept them "
            "(accepted) or not (rejected); acceptance is accepted over both",
            [*by, "result"],
            registry=r,
        )
        self.disk_lookups = Counter(
            "steward_prompt_disk_lookups_total",
            "Requests that asked the prompt cache's disk tier: a longer prefix loaded, or none",
            [*by, "result"],
            registry=r,
        )
        self.disk_tokens = Counter(
            "steward_prompt_disk_tokens_total",
            "Prompt tokens loaded from the disk tier instead of prefilled",
            by,
            registry=r,
        )
        self.disk_errors = Counter(
            "steward_prompt_disk_errors_total",
            "Disk tier writes that failed (a full disk included) and corrupt entries removed",
            by,
            registry=r,
        )
        self.disk_bytes = Gauge(
            "steward_prompt_disk_bytes",
            "Bytes in --prompt-cache-dir, as the worker saw them at its last answer",
            by,
            registry=r,
        )
        self.in_window = Gauge(
            "steward_restarts_in_window", "Worker restarts within --restart-window", by, registry=r
        )
        self.models = ModelsCollector()
        r.register(self.models)
        self.ranks = RanksCollector(labelled)
        r.register(self.ranks)
        if not labelled:
            for result in ("pass", "fail"):
                self.canaries.labels(result)

    def series(self, model: str) -> ModelSeries:
        """A model's events, labelled by its name (label values: the configured models)."""
        if model not in self._series:
            self._series[model] = series = ModelSeries(self, model)
            for result in ("pass", "fail"):
                series.at(self.canaries, result)
        return self._series[model]

    # -- the HTTP front ---------------------------------------------------------------

    def request(self, route: str, status: int) -> None:
        self.requests.labels(route, str(status)).inc()

    def error(self, type: str) -> None:
        self.errors.labels(type).inc()

    def render(self) -> tuple[bytes, str]:
        """One snapshot, taken whole: a pool's (each model's), or one supervisor's."""
        snapshot = self.supervisor.snapshot()
        if isinstance(snapshot, Snapshot):
            self.gauges(snapshot, snapshot.status.value)
        elif not self.labelled:
            (only,) = snapshot.models
            self.gauges(only.detail, only.detail and only.detail.status.value)
        else:
            for model in snapshot.models:
                self.series(model.name).gauges(model.detail, model.state.value)
        self.models.snapshot = None if isinstance(snapshot, Snapshot) else snapshot
        self.ranks.taken = (
            [("", snapshot)]
            if isinstance(snapshot, Snapshot)
            else [(m.name, m.detail) for m in snapshot.models if m.detail is not None]
        )
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class ModelsCollector(Collector):
    """The pool's own series, from the snapshot `render` took: every configured model's
    loads and evictions (counted by the pool), what it needs, and the budget."""

    def __init__(self) -> None:
        self.snapshot: PoolSnapshot | None = None

    def collect(self) -> Iterator[Metric]:
        if self.snapshot is None:
            return
        loads = CounterMetricFamily(
            "steward_model_loads", "Models brought up, at start or on demand", labels=["model"]
        )
        evictions = CounterMetricFamily(
            "steward_model_evictions", "Models unloaded (budget or idle_ttl)", labels=["model"]
        )
        need = GaugeMetricFamily(
            "steward_model_memory_bytes", "What a model takes of the budget", labels=["model"]
        )
        for model in self.snapshot.models:
            loads.add_metric([model.name], model.loads)
            evictions.add_metric([model.name], model.evictions)
            need.add_metric([model.name], model.need_bytes)
        yield loads
        yield evictions
        yield need
        yield GaugeMetricFamily(
            "steward_memory_budget_bytes",
            "Bytes resident models may take",
            self.snapshot.budget_bytes,
        )
        yield GaugeMetricFamily(
            "steward_memory_resident_bytes",
            "Bytes the resident models take",
            self.snapshot.resident_bytes,
        )

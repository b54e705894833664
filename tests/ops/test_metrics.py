"""Metrics over a stand-in supervisor: every event in, the exposition text parsed back out."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from steward.ops.metrics import Metrics
from steward.supervisor.faults import Fault, FaultClass, Outcome
from steward.supervisor.snapshot import Snapshot
from steward.supervisor.state import State
from steward.wire.protocol import Done

STARTING = Snapshot(
    status=State.STARTING,
    model="m",
    retry_after=1,
    worker_pid=7,
    worker_generation=1,
    workers_started=1,
    worker_alive=True,
    bring_up_s=1.0,
    faults_total=0,
    last_fault=None,
    restarts_in_window=0,
    queue_depth=0,
    standby={},
    batch_size=0,
    batch_limit=32,
    probation=0,
    quarantined=0,
    context_length=None,
    decode_baseline=0,
    decode_recent=0,
    uptime_s=0,
)


@pytest.fixture
def supervisor() -> SimpleNamespace:
    """What Metrics reads of a supervisor: its snapshot, and nothing else."""
    fake = SimpleNamespace(now=STARTING)
    fake.snapshot = lambda: fake.now
    return fake


def scrape(metrics: Metrics) -> dict[tuple[str, frozenset], float]:
    """{(sample name, labels): value} from the rendered text."""
    text, content_type = metrics.render()
    assert content_type.startswith("text/plain; version=")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }


def value(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def done(ttft: float, tps: float) -> Done:
    return Done(1, "stop", 5, 8, ttft, tps)


def test_scrape_time_gauges_follow_the_supervisor(supervisor: SimpleNamespace) -> None:
    metrics = Metrics(supervisor)
    samples = scrape(metrics)
    assert {k: v for k, v in samples.items() if k[0] == "steward_state"} == {
        ("steward_state", frozenset({("state", s.value)})): float(s is State.STARTING)
        for s in State
    }
    assert value(samples, "steward_queue_depth") == 0
    assert value(samples, "steward_worker_generation") == 1
    assert value(samples, "steward_restarts_in_window") == 0

    supervisor.now = dataclasses.replace(
        STARTING,
        status=State.RECOVERING,
        queue_depth=3,
        worker_generation=3,
        restarts_in_window=2,
    )
    samples = scrape(metrics)
    assert value(samples, "steward_state", state="recovering") == 1
    assert sum(v for k, v in samples.items() if k[0] == "steward_state") == 1
    assert value(samples, "steward_queue_depth") == 3
    assert value(samples, "steward_worker_generation") == 3
    assert value(samples, "steward_restarts_in_window") == 2


def test_counters_and_histograms(supervisor: SimpleNamespace) -> None:
    metrics = Metrics(supervisor)
    assert value(scrape(metrics), "steward_canary_runs_total", result="fail") == 0

    metrics.request("/v1/chat/completions", 200)
    metrics.request("/v1/chat/completions", 200)
    metrics.request("other", 404)
    metrics.error("model_not_found")
    metrics.worker_started(1)
    metrics.worker_started(2)
    metrics.canary_ran(True, 0.1)
    metrics.canary_ran(True, 0.1)
    metrics.canary_ran(False, 0.2)
    metrics.request_quarantined()
    kept = Fault(FaultClass.GPU_TIMEOUT, "GPU Timeout", 1)
    kept.decide(Outcome.KEPT, "kept worker (canary passed)")
    kept.recovery_s = 0.3
    lost = Fault(FaultClass.WORKER_CRASH, "killed by SIGSEGV", 2)
    lost.decide(Outcome.EXIT, "canary failed (worker_crash); exit 75")  # the words never matter
    metrics.fault_settled(kept)
    metrics.fault_settled(lost)
    metrics.request_done(done(0.02, 480.0))
    metrics.request_done(done(0.7, 5.0))
    metrics.request_done(done(0.03, 0.0))  # no decode step: speed not observed

    s = scrape(metrics)
    assert value(s, "steward_requests_total", route="/v1/chat/completions", status="200") == 2
    assert value(s, "steward_requests_total", route="other", status="404") == 1
    assert value(s, "steward_errors_total", type="model_not_found") == 1
    assert value(s, "steward_worker_restarts_total") == 1
    assert value(s, "steward_canary_runs_total", result="pass") == 2
    assert value(s, "steward_canary_runs_total", result="fail") == 1
    assert value(s, "steward_quarantined_requests_total") == 1
    faults = {k: v for k, v in s.items() if k[0] == "steward_faults_total"}
    assert faults == {
        (
            "steward_faults_total",
            frozenset({("class", "gpu_timeout"), ("action", "kept_worker")}),
        ): 1,
        ("steward_faults_total", frozenset({("class", "worker_crash"), ("action", "exit")})): 1,
    }
    assert value(s, "steward_recovery_seconds_count") == 1
    assert value(s, "steward_recovery_seconds_sum") == pytest.approx(0.3)
    assert value(s, "steward_recovery_seconds_bucket", le="0.25") == 0
    assert value(s, "steward_recovery_seconds_bucket", le="0.5") == 1
    assert value(s, "steward_time_to_first_token_seconds_count") == 3
    assert value(s, "steward_time_to_first_token_seconds_bucket", le="0.025") == 1
    assert value(s, "steward_time_to_first_token_seconds_bucket", le="0.05") == 2
    assert value(s, "steward_time_to_first_token_seconds_bucket", le="1.0") == 3
    assert value(s, "steward_decode_tokens_per_second_count") == 2
    assert value(s, "steward_decode_tokens_per_second_sum") == pytest.approx(485.0)
    assert value(s, "steward_decode_tokens_per_second_bucket", le="5.0") == 1
    assert value(s, "steward_decode_tokens_per_second_bucket", le="500.0") == 2


def test_registries_are_private(supervisor: SimpleNamespace) -> None:
    """Two instances (two apps in one test process) neither collide nor share counts."""
    first, second = Metrics(supervisor), Metrics(supervisor)
    first.request("/health", 200)
    assert ("steward_requests_total", frozenset({("route", "/health"), ("status", "200")})) in (
        scrape(first)
    )
    assert not [k for k in scrape(second) if k[0] == "steward_requests_total"]


def test_a_groups_ranks_have_a_series_each(supervisor: SimpleNamespace) -> None:
    """Labelled by rank and host, never by pid; a model served by one process has none."""
    metrics = Metrics(supervisor)
    assert not any(name.startswith("steward_rank_") for name, _ in scrape(metrics))
    rank = {"alive": True, "serving": True, "steps": 46, "since_progress_s": 0.5}
    supervisor.now = dataclasses.replace(
        STARTING,
        ranks=[
            {"rank": 0, "host": "127.0.0.1", "pid": 7, **rank},
            {"rank": 1, "host": "mac2", "pid": 8, **rank, "alive": False, "serving": False},
        ],
    )
    samples = scrape(metrics)
    assert value(samples, "steward_rank_alive", rank="0", host="127.0.0.1") == 1.0
    assert value(samples, "steward_rank_alive", rank="1", host="mac2") == 0.0
    assert value(samples, "steward_rank_serving", rank="1", host="mac2") == 0.0
    assert value(samples, "steward_rank_steps_total", rank="1", host="mac2") == 46.0
    assert value(samples, "steward_rank_since_progress_seconds", rank="0", host="127.0.0.1") == 0.5

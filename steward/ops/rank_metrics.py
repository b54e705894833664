"""`/metrics` series for the ranks of a group (docs/distributed.md), one per rank.

Read from the snapshot `/metrics` takes at scrape time, as `/health` shows them: labelled
by `rank` and `host` (and `model` with several models), never by pid, which changes with
every formation. A model served by one process has no rank series.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from steward.supervisor.snapshot import Snapshot


class RanksCollector(Collector):
    def __init__(self, labelled: bool) -> None:
        self.by = ["model"] if labelled else []
        self.taken: list[tuple[str, Snapshot]] = []  # each resident model's, at the scrape

    def collect(self) -> Iterator[Metric]:
        ranks = [(model, rank) for model, snap in self.taken for rank in snap.ranks]
        if not ranks:
            return
        labels = [*self.by, "rank", "host"]
        alive = GaugeMetricFamily(
            "steward_rank_alive", "1 while the rank's process runs", labels=labels
        )
        serving = GaugeMetricFamily(
            "steward_rank_serving", "1 once the rank's batch loop runs", labels=labels
        )
        steps = CounterMetricFamily(
            "steward_rank_steps", "Batch steps the rank's group has run (per group)", labels=labels
        )
        quiet = GaugeMetricFamily(
            "steward_rank_since_progress_seconds",
            "Seconds since the rank joined, began serving or stepped",
            labels=labels,
        )
        for model, rank in ranks:
            values = [*([model] if self.by else []), str(rank["rank"]), str(rank["host"])]
            alive.add_metric(values, float(bool(rank["alive"])))
            serving.add_metric(values, float(bool(rank["serving"])))
            steps.add_metric(values, float(rank["steps"]))
            quiet.add_metric(values, float(rank["since_progress_s"]))
        yield from (alive, serving, steps, quiet)

"""What the supervisor publishes about itself: one immutable record, taken whole.

Health, metrics and the systemd notifier read this and nothing else of the supervisor, so
its insides can change without breaking them, and one answer never mixes two moments.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from steward.supervisor.state import State


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    status: State
    model: str
    retry_after: int  # what a 503 would say now
    worker_pid: int | None
    worker_generation: int  # which worker serves
    workers_started: int  # so far, spares included
    worker_alive: bool
    bring_up_s: float
    faults_total: int
    last_fault: dict[str, object] | None
    restarts_in_window: int
    queue_depth: int
    standby: dict[str, object]
    batch_size: int
    batch_limit: int
    probation: int
    quarantined: int
    context_length: int | None
    decode_baseline: float
    decode_recent: float
    uptime_s: float
    model_bytes: int = 0  # what the serving worker measured its model takes (0: not yet)
    device_bytes: int = 0  # the device's memory, or its recommended working set (0: unknown)
    phases: dict[str, float] = field(default_factory=dict)  # the serving worker's bring-up
    suspects: list[dict[str, object]] = field(default_factory=list)  # workers aside
    ranks: list[dict[str, object]] = field(default_factory=list)  # the worker's, in a group

    def health(self) -> dict[str, Any]:
        """The SPEC §2 body, and what else an operator wants at a glance."""
        return {
            "status": str(self.status),
            "model": self.model,
            "service": "steward",
            "worker": {
                "pid": self.worker_pid,
                "generation": self.worker_generation,
                "started": self.workers_started,
                "alive": self.worker_alive,
                "bring_up_s": round(self.bring_up_s, 3),
                "phases": self.phases,
                "ranks": self.ranks,
            },
            "suspects": self.suspects,
            "faults": {"total": self.faults_total, "last": self.last_fault},
            "restarts_in_window": self.restarts_in_window,
            "queue_depth": self.queue_depth,
            "standby": self.standby,
            "in_flight": self.batch_size + self.probation,
            "batch": {
                "size": self.batch_size,
                "limit": self.batch_limit,
                "probation": self.probation,
            },
            "quarantined": self.quarantined,
            "context_length": self.context_length,
            "decode_tps": {"baseline": self.decode_baseline, "recent": self.decode_recent},
            "uptime_s": round(self.uptime_s, 1),
        }

"""What the pool publishes: one immutable record of every configured model, taken whole.

`/health`, `/health/ready?model=`, `/v1/models` and `/metrics` read this and nothing else of
the pool. With one model, `/health` keeps today's body (that model's supervisor's, SPEC §2)
and adds the `models` section; with several, the body is the pool's, the overall state
derived from the models' (`overall`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from steward.supervisor.snapshot import Snapshot
from steward.supervisor.state import State


class ModelState(StrEnum):
    UNLOADED = "unloaded"
    LOADING = "loading"  # its first worker is coming up (or waits for memory to be freed)
    READY = "ready"
    DEGRADED = "degraded"
    RECOVERING = "recovering"
    UNLOADING = "unloading"  # evicted or idle too long: its workers are stopping
    FAILED = "failed"  # its restart budget is spent, or it cannot load
    STOPPING = "stopping"  # the server drains

    @property
    def answers(self) -> bool:
        """A request for it is served, at once or after a load."""
        return self in (ModelState.READY, ModelState.DEGRADED, ModelState.UNLOADED)


OF_SUPERVISOR = {
    State.STARTING: ModelState.LOADING,
    State.READY: ModelState.READY,
    State.DEGRADED: ModelState.DEGRADED,
    State.RECOVERING: ModelState.RECOVERING,
    State.FAILED: ModelState.FAILED,
    State.STOPPING: ModelState.STOPPING,
}


@dataclass(frozen=True, kw_only=True)
class ModelSnapshot:
    name: str
    aliases: tuple[str, ...]
    kind: str
    state: ModelState
    pinned: bool
    idle_ttl: float | None
    loads: int  # workers' models brought up on demand or at start, reloads included
    evictions: int
    need_bytes: int  # what it takes of the budget (measured once it has loaded)
    measured: bool
    idle_s: float | None  # since it was last used, while resident
    load_s: float | None  # its last bring-up that loaded it (not a spare's swap), once measured
    context_length: int | None
    created: int
    retry_after: int
    failure: str | None  # why it is failed
    detail: Snapshot | None  # its supervisor's, while one is resident

    def section(self) -> dict[str, Any]:
        """Its `/health` section: the pool's view, and its supervisor's body when resident."""
        body: dict[str, Any] = {
            "state": str(self.state),
            "kind": self.kind,
            "aliases": list(self.aliases),
            "pinned": self.pinned,
            "idle_ttl": self.idle_ttl,
            "loads": self.loads,
            "evictions": self.evictions,
            "memory": {"need_bytes": self.need_bytes, "measured": self.measured},
            "idle_s": None if self.idle_s is None else round(self.idle_s, 1),
            "load_s": None if self.load_s is None else round(self.load_s, 3),
        }
        if self.failure:
            body["failure"] = self.failure
        if self.detail is not None:
            skip = ("status", "model", "service")
            body |= {k: v for k, v in self.detail.health().items() if k not in skip}
        return body


@dataclass(frozen=True, kw_only=True)
class PoolSnapshot:
    status: State  # overall
    models: tuple[ModelSnapshot, ...]  # in configured order, the default first
    single: bool  # one model configured: /health keeps today's body
    budget_bytes: int
    resident_bytes: int
    retry_after: int
    uptime_s: float

    def model(self, name: str) -> ModelSnapshot:
        return next(m for m in self.models if m.name == name)

    def health(self) -> dict[str, Any]:
        sections = {m.name: m.section() for m in self.models}
        only = self.models[0].detail
        if self.single and only is not None:
            return only.health() | {"models": sections}
        return {
            "status": str(self.status),
            "model": self.models[0].name,
            "service": "steward",
            "models": sections,
            "memory": {"budget_bytes": self.budget_bytes, "resident_bytes": self.resident_bytes},
            "uptime_s": round(self.uptime_s, 1),
        }


def overall(states: list[ModelState], starting: bool, exiting: bool, stopping: bool) -> State:
    """The server's state from its models': `starting` until the models loaded at start
    have come up; `degraded` while any model is failed, recovering or degraded (the others
    serve); else `ready`."""
    if stopping:
        return State.STOPPING
    if exiting or all(s is ModelState.FAILED for s in states):
        return State.FAILED
    if starting:
        return State.STARTING
    sick = (ModelState.FAILED, ModelState.RECOVERING, ModelState.DEGRADED)
    return State.DEGRADED if any(s in sick for s in states) else State.READY

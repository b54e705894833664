"""The supervisor's states (SPEC §2) and what each means for health and new requests."""

from __future__ import annotations

from enum import StrEnum


class State(StrEnum):
    STARTING = "starting"
    READY = "ready"
    DEGRADED = "degraded"
    RECOVERING = "recovering"
    FAILED = "failed"
    STOPPING = "stopping"

    @property
    def serving(self) -> bool:
        """Health answers 200 and requests are served."""
        return self in (State.READY, State.DEGRADED)

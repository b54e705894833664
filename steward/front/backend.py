"""Which supervisor serves a request: the pool's (SPEC §9), for the model it named.

A dialect names the model first (`route`, a 404 for an unknown name, nothing loaded);
the supervisor is asked for only when there is work for it (`supervisor`), which loads
an unloaded model there and then: a request refused before that loads nothing.
"""

from __future__ import annotations

from fastapi import Request

from steward.pool.pool import Pool
from steward.pool.slot import Slot
from steward.supervisor.supervisor import Supervisor


def pool(request: Request) -> Pool:
    return request.app.state.pool


def route(request: Request, name: str | None) -> Slot:
    """The model `name` names, noted on the request (and for the access log)."""
    slot = pool(request).find(name)
    request.state.slot = slot
    request.state.model = slot.name
    return slot


def supervisor(request: Request) -> Supervisor:
    """The routed model's supervisor, loading the model now if it is not resident."""
    return pool(request).supervisor(request.state.slot)

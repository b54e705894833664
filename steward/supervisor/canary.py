"""The canary: a fixed short greedy generation whose token ids must not change.

The first worker's answer is the golden one; after a fault, a canary that raises, hangs,
or answers differently means the backend is poisoned and the worker is replaced.
"""

from __future__ import annotations

import itertools

from steward.supervisor.faults import CANARY_MISMATCH
from steward.supervisor.link import FaultError, WorkerLink
from steward.worker.protocol import Done, Generate

PROMPT = "The capital of France is"
MAX_TOKENS = 8

_ids = itertools.count(-1, -1)  # negative: never a client request's id


async def run(link: WorkerLink, timeout: float) -> tuple[tuple[int, ...], float]:
    """The canary's token ids and decode speed; FaultError if it raised, hung or crashed."""
    req = Generate(id=next(_ids), seq=0, attempt=1, prompt=PROMPT, max_tokens=MAX_TOKENS)
    tokens: list[int] = []
    link.send(req)
    done = await link.follow(
        req.id, lambda t: tokens.append(t.token) if t.token >= 0 else None, timeout, "canary"
    )
    if not isinstance(done, Done) or not tokens:
        raise FaultError(link.fault(CANARY_MISMATCH, f"canary produced no tokens ({done})"))
    return tuple(tokens), done.decode_tps

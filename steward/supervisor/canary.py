"""The canary: a fixed short greedy generation whose token ids must not change.

The first worker's answer is the golden one; after a fault, a canary that raises, hangs,
or answers differently means the backend is poisoned and the worker is replaced. The
supervisor runs it alone (nothing else in flight), so its speed is a batch-of-one speed.
"""

from __future__ import annotations

import asyncio
import itertools

from steward.supervisor.faults import FaultClass
from steward.supervisor.link import FaultError, WorkerLink
from steward.wire.protocol import Done, Generate, Rejected, Token

PROMPT = "The capital of France is"
MAX_TOKENS = 8

_ids = itertools.count(-1, -1)  # negative: never a client request's id


async def run(link: WorkerLink, timeout: float) -> tuple[tuple[int, ...], float]:
    """The canary's token ids and decode speed; FaultError if it raised, hung or crashed."""
    req = Generate(id=next(_ids), seq=0, attempt=1, prompt=PROMPT, max_tokens=MAX_TOKENS)
    tokens: list[int] = []
    finished: asyncio.Future[Done | Rejected] = asyncio.get_running_loop().create_future()

    def token(t: Token) -> None:
        if t.token >= 0:
            tokens.append(t.token)

    link.start(req, token, finished.set_result)
    await asyncio.wait({finished, link.failure}, timeout=timeout, return_when="FIRST_COMPLETED")
    if not finished.done():
        link.sinks.pop(req.id, None)
        if link.failure.done():
            raise FaultError(link.failure.result())
        raise FaultError(
            link.fault(FaultClass.STALL, f"no answer to the canary within {timeout:.0f} s")
        )
    done = finished.result()
    if not isinstance(done, Done) or not tokens:
        raise FaultError(
            link.fault(FaultClass.CANARY_MISMATCH, f"canary produced no tokens ({done})")
        )
    return tuple(tokens), done.decode_tps

"""The canary: a fixed greedy generation whose token ids must not change.

It checks the backend, not the model's manners: end tokens are suppressed, so every model
answers exactly `MAX_TOKENS` tokens (a model whose greedy answer is its end token at once is
as checkable as any). The first worker's answer is the golden one; after a fault, a canary
that raises, falls silent, or answers differently means the backend is poisoned and the
worker is replaced. It runs alone (nothing else in flight), so its speeds are a batch of
one's; silence is judged as any request's is, from the speeds measured (speeds.py).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable

from steward.supervisor.faults import Fault, FaultClass
from steward.supervisor.link import FaultError, Sink, WorkerLink
from steward.wire.protocol import Done, Generate, Rejected, Token

PROMPT = "The capital of France is"
MAX_TOKENS = 8

_ids = itertools.count(-1, -1)  # negative: never a client request's id


async def run(link: WorkerLink, allowed: Callable[[int], float]) -> tuple[tuple[int, ...], Done]:
    """The canary's token ids and its answer; FaultError if it raised, crashed, or was
    silent for longer than `allowed(prompt tokens to prefill)` seconds."""
    req = Generate(
        id=next(_ids), seq=0, attempt=1, prompt=PROMPT, max_tokens=MAX_TOKENS, ignore_eos=True
    )
    tokens: list[int] = []
    prefill = len(PROMPT)  # until the worker says: a token is at least a character
    finished: asyncio.Future[Done | Rejected] = asyncio.get_running_loop().create_future()

    def token(t: Token) -> None:
        nonlocal prefill
        prefill = 0
        if t.token >= 0:
            tokens.append(t.token)

    def admitted(n: int) -> None:
        nonlocal prefill
        prefill = n

    link.start(req, Sink(token, finished.set_result, admitted))
    started = time.monotonic()
    while not finished.done() and not link.failure.done():
        since = max(started, link.progress)
        left = since + allowed(prefill) - time.monotonic()
        if left <= 0:
            link.sinks.pop(req.id, None)
            silent = time.monotonic() - since
            raise FaultError(
                link.fault(FaultClass.STALL, f"no answer to the canary for {silent:.1f} s")
            )
        await asyncio.wait({finished, link.failure}, timeout=left, return_when="FIRST_COMPLETED")
    if not finished.done():
        link.sinks.pop(req.id, None)
        raise FaultError(link.failure.result())
    done = finished.result()
    if not isinstance(done, Done) or len(tokens) != MAX_TOKENS:
        raise FaultError(mismatch(link, f"canary answered {len(tokens)} tokens ({done})"))
    return tuple(tokens), done


def mismatch(link: WorkerLink, message: str) -> Fault:
    return link.fault(FaultClass.CANARY_MISMATCH, message)

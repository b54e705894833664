"""The canary: a fixed greedy generation whose token ids must not change (for an embedding
model: a fixed text's vector, finite, of the model's dimensions, the same as the first's).

It checks the backend, not the model's manners: end tokens are suppressed, so every model
answers exactly `MAX_TOKENS` tokens (a model whose greedy answer is its end token at once is
as checkable as any). The first worker's answer is the golden one; after a fault, a canary
that raises, falls silent, or answers differently means the backend is poisoned and the
worker is replaced. It runs alone (nothing else in flight), so its speed is a batch of
one's. Its silence is bounded by `--stall-timeout`, the ceiling, alone: it checks a worker
that serves nobody yet (or a kept one, its clients waiting for the verdict), and a canary
slowed by a busy machine must never cost a worker.
"""

from __future__ import annotations

import array
import asyncio
import itertools
import math
import sys
import time
from collections.abc import Callable, Sequence

from steward.supervisor.faults import Fault, FaultClass
from steward.supervisor.line import FaultError, Link, Sink
from steward.wire.protocol import Done, Embed, Generate, Rejected, Token

PROMPT = "The capital of France is"
MAX_TOKENS = 8
# How far a vector's values may move from the golden ones: a replacement runs the same
# forward on the same device, but its kernels may sum in another order.
TOLERANCE = 1e-3

_ids = itertools.count(-1, -1)  # negative: never a client request's id


async def run(link: Link, allowed: float) -> tuple[tuple[int, ...], Done]:
    """The canary's token ids and its answer; FaultError if it raised, crashed, or was
    silent for longer than `allowed` seconds."""
    req = Generate(
        id=next(_ids),
        seq=0,
        attempt=1,
        prompt=PROMPT,
        max_tokens=MAX_TOKENS,
        ignore_eos=True,
        internal=True,
    )
    tokens: list[int] = []
    done = await _answer(link, req, allowed, tokens.append)
    if len(tokens) != MAX_TOKENS:
        raise FaultError(mismatch(link, f"canary answered {len(tokens)} tokens ({done})"))
    return tuple(tokens), done


async def embed(link: Link, allowed: float, dimensions: int) -> tuple[tuple[float, ...], Done]:
    """The canary of an embedding model: PROMPT's vector, checked finite and whole."""
    req = Embed(id=next(_ids), seq=0, attempt=1, inputs=[PROMPT])
    done = await _answer(link, req, allowed, lambda token: None)
    vector = array.array("f", done.embedding.data if done.embedding else b"")
    if sys.byteorder == "big":
        vector.byteswap()  # the wire's float32 is little-endian
    if len(vector) != dimensions or not all(map(math.isfinite, vector)):
        finite = all(map(math.isfinite, vector))
        message = f"canary vector of {len(vector)} dimensions (of {dimensions}), finite: {finite}"
        raise FaultError(mismatch(link, message))
    return tuple(vector), done


def same(answer: Sequence[float], golden: Sequence[float]) -> bool:
    """A canary's answer is the golden one: token ids equal, a vector's values within
    TOLERANCE of the vector's scale (an unnormalized vector's values may be large)."""
    if len(answer) != len(golden):
        return False
    if not any(isinstance(value, float) for value in golden):
        return list(answer) == list(golden)
    allowed = TOLERANCE * max(1.0, *(abs(value) for value in golden))
    return all(abs(a - b) <= allowed for a, b in zip(answer, golden, strict=True))


async def _answer(
    link: Link, req: Generate | Embed, allowed: float, on_token: Callable[[int], None]
) -> Done:
    """The worker's answer to a canary request, its tokens to `on_token`."""
    finished: asyncio.Future[Done | Rejected] = asyncio.get_running_loop().create_future()

    def token(t: Token) -> None:
        if t.token >= 0:
            on_token(t.token)

    link.start(req, Sink(token, finished.set_result))
    started = time.monotonic()
    while not finished.done() and not link.failure.done():
        since = max(started, link.progress)
        left = since + allowed - time.monotonic()
        if left <= 0:
            link.forget(req.id)
            silent = time.monotonic() - since
            raise FaultError(
                link.fault(FaultClass.STALL, f"no answer to the canary for {silent:.1f} s")
            )
        await asyncio.wait({finished, link.failure}, timeout=left, return_when="FIRST_COMPLETED")
    if not finished.done():
        link.forget(req.id)
        raise FaultError(link.failure.result())
    done = finished.result()
    if not isinstance(done, Done):
        raise FaultError(mismatch(link, f"canary answered {done}"))
    return done


def mismatch(link: Link, message: str) -> Fault:
    return link.fault(FaultClass.CANARY_MISMATCH, message)

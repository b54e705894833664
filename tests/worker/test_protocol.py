"""The front/worker channel: typed messages and framing (their cost: bench/protocol.py)."""

from __future__ import annotations

import asyncio
import socket
import threading

from steward.wire.channel import AsyncChannel, BlockingChannel
from steward.wire.protocol import (
    Done,
    Failed,
    Generate,
    Step,
    Token,
    decode_from_worker,
    decode_to_worker,
    encode,
)


def test_messages_round_trip() -> None:
    msg = Generate(
        id=3,
        seq=7,
        attempt=1,
        max_tokens=5,
        messages=[{"role": "user", "content": "hé 世界"}],
        stop=["\n"],
        seed=1,
    )
    assert decode_to_worker(encode(msg)) == msg
    step = Step(
        tokens=[Token(3, 42, "hé"), Token(4, -1, "")],
        done=[Done(5, "stop", 10, 4, 0.5, 30.0, cached_tokens=6, batch=2)],
        prefilled=[6],
    )
    assert decode_from_worker(encode(step)) == step
    failed = Failed([3, 4], "RuntimeError: boom", "Traceback ...")
    assert decode_from_worker(encode(failed)) == failed


def test_every_token_streamed_arrives_in_order() -> None:
    """A worker thread sends tokens as fast as it can; the front's asyncio side decodes them
    all, in order (their cost per token is bench.protocol's to measure)."""
    count = 20_000
    front, worker = socket.socketpair()

    def produce() -> None:
        channel = BlockingChannel(worker)
        for i in range(count):
            channel.send(encode(Step(tokens=[Token(1, i, " token")])))
        channel.send(encode(Step(done=[Done(1, "length", 1, count, 0.0, 0.0)])))

    async def consume() -> list[int]:
        channel = await AsyncChannel.open(front)
        seen: list[int] = []
        while not (step := decode_from_worker(await channel.recv())).done:
            seen += [t.token for t in step.tokens]
        return seen

    threading.Thread(target=produce).start()
    assert asyncio.run(consume()) == list(range(count))

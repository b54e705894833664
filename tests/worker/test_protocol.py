"""The front/worker channel: typed messages, framing, and a per-token cost far below 1 ms."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

from steward.worker.channel import AsyncChannel, BlockingChannel
from steward.worker.protocol import (
    Done,
    Generate,
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
    done = Done(3, "stop", 10, 4, 0.5, 30.0)
    assert decode_from_worker(encode(done)) == done


def test_token_streaming_overhead_is_far_below_a_millisecond() -> None:
    """Worker thread sends tokens as fast as it can; the front's asyncio side decodes them."""
    count = 20_000
    front, worker = socket.socketpair()

    def produce() -> None:
        channel = BlockingChannel(worker)
        for i in range(count):
            channel.send(encode(Token(1, i, " token")))
        channel.send(encode(Done(1, "length", 1, count, 0.0, 0.0)))

    async def consume() -> int:
        channel = await AsyncChannel.open(front)
        seen = 0
        while not isinstance(decode_from_worker(await channel.recv()), Done):
            seen += 1
        return seen

    started = time.perf_counter()
    threading.Thread(target=produce).start()
    seen = asyncio.run(consume())
    per_token = (time.perf_counter() - started) / count
    assert seen == count
    assert per_token < 100e-6, f"{per_token * 1e6:.1f} µs per token"

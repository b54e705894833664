"""The front/worker channel: typed messages, framing, and a per-token cost far below 1 ms."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

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


def test_a_step_of_32_members_costs_the_front_little() -> None:
    """One message per decode step for the whole batch: decoding it stays far below the
    time of a GPU decode step (milliseconds)."""
    step = encode(Step(tokens=[Token(i, 1000 + i, " token") for i in range(32)]))
    started = time.perf_counter()
    for _ in range(2000):
        decode_from_worker(step)
    per_step = (time.perf_counter() - started) / 2000
    assert per_step < 200e-6, f"{per_step * 1e6:.1f} µs per 32-member step"


def test_token_streaming_overhead_is_far_below_a_millisecond() -> None:
    """Worker thread sends tokens as fast as it can; the front's asyncio side decodes them."""
    count = 20_000
    front, worker = socket.socketpair()

    def produce() -> None:
        channel = BlockingChannel(worker)
        for i in range(count):
            channel.send(encode(Step(tokens=[Token(1, i, " token")])))
        channel.send(encode(Step(done=[Done(1, "length", 1, count, 0.0, 0.0)])))

    async def consume() -> int:
        channel = await AsyncChannel.open(front)
        seen = 0
        while not (step := decode_from_worker(await channel.recv())).done:
            seen += len(step.tokens)
        return seen

    started = time.perf_counter()
    threading.Thread(target=produce).start()
    seen = asyncio.run(consume())
    per_token = (time.perf_counter() - started) / count
    assert seen == count
    assert per_token < 100e-6, f"{per_token * 1e6:.1f} µs per token"

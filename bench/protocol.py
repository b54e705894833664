"""What the front/worker line costs the front: decoding one batch step's message, and a
token streamed end to end through the socketpair, against a GPU decode step (milliseconds).

    python -m bench.protocol
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time

from steward.wire.channel import AsyncChannel, BlockingChannel
from steward.wire.protocol import Done, Step, Token, decode_from_worker, encode

STEPS = 2000
TOKENS = 20_000


def per_step(members: int) -> float:
    """Seconds to decode one step's message of `members` tokens."""
    step = encode(Step(tokens=[Token(i, 1000 + i, " token") for i in range(members)]))
    started = time.perf_counter()
    for _ in range(STEPS):
        decode_from_worker(step)
    return (time.perf_counter() - started) / STEPS


def per_token() -> float:
    """Seconds per token sent by a worker thread and decoded on the front's event loop."""
    front, worker = socket.socketpair()

    def produce() -> None:
        channel = BlockingChannel(worker)
        for i in range(TOKENS):
            channel.send(encode(Step(tokens=[Token(1, i, " token")])))
        channel.send(encode(Step(done=[Done(1, "length", 1, TOKENS, 0.0, 0.0)])))

    async def consume() -> None:
        channel = await AsyncChannel.open(front)
        while not decode_from_worker(await channel.recv()).done:
            pass

    started = time.perf_counter()
    threading.Thread(target=produce).start()
    asyncio.run(consume())
    return (time.perf_counter() - started) / TOKENS


def main() -> None:
    for members in (1, 32, 128):
        print(f"decode a {members}-member step: {per_step(members) * 1e6:.1f} us")
    print(f"a token streamed end to end: {per_token() * 1e6:.1f} us")


if __name__ == "__main__":
    main()

"""Warm shapes: compile, at bring-up, the kernels a batch's first burst will need, and
measure what `--max-batch auto` and the prefill chunks are sized by.

On a GPU, MLX builds kernels the first time it meets an operation's shapes, and a batch
meets new ones as members join in prefill groups, decode together and prefill long prompts
in chunks. A worker that has served only its canary (a hot spare, or any new worker) would
pay that in its first burst, which after a fault is every resumed stream at once: seconds
of silence that every client sees. So before it says `Ready`, a worker on a GPU runs a
bounded batch: members join, a few at a time, until the batch is at each width a batch may
take (powers of two), decoding a few timed steps at each (width.py finds the knee in those
speeds); then long prompts prefill together in chunks beside members decoding and leave
one by one, which times the prefill speed the chunks are sized by (chunks.py). It is
bounded by `BUDGET` seconds (half of it for the widths: a big model on a small GPU measures
fewer) and counted in the load time (`bring_up_s`). On a CPU there is nothing to compile
and no knee to find: the warm-up is skipped.
"""

from __future__ import annotations

import itertools
import time

import mlx.core as mx

from steward.wire.protocol import Generate
from steward.worker.engine import Engine

PROMPT = "Warm the kernels for the shapes of a batch."  # about ten tokens
LENGTHS = 4  # distinct prompt lengths: prefill groups of unequal prompts pad differently
TIMED = 12  # steps timed at each width, after two untimed
LONG = 3  # long prompts prefilled together
DECODING = 2  # members decoding beside them
LONG_REPEATS = 800  # of the prompt: about 8,000 tokens each, several chunks
BUDGET = 30.0  # seconds the warm-up may take: a big model on a small GPU stops early

_ids = itertools.count(-(2**40), -1)  # never a client's id, nor the canary's


def on_gpu() -> bool:
    return mx.default_device().type == mx.DeviceType.gpu


def run(engine: Engine, widths: list[int]) -> dict[int, float]:
    """Tokens/s at each width (empty on a CPU, where nothing is warmed)."""
    if not on_gpu():
        return {}
    speeds: dict[int, float] = {}
    started = time.perf_counter()
    try:
        for width in widths:
            _grow(engine, width)
            speeds[width] = _speed(engine, width)
            if time.perf_counter() - started > BUDGET / 2:
                break  # the widths measured so far are the ones auto picks from
        engine.drop_all()
        _long_prompts(engine, started + BUDGET)
    finally:
        engine.drop_all()  # nothing of the warm-up stays (its prompts in the prompt cache)
    return speeds


def _member(prompt: str, tokens: int) -> Generate:
    return Generate(
        id=next(_ids), seq=0, attempt=1, max_tokens=tokens, prompt=prompt, ignore_eos=True
    )


def _grow(engine: Engine, width: int) -> None:
    """Members join until `width` of them decode (each outlives the warm-up)."""
    lives = engine.backend.context_length // 2
    for i in range(len(engine.members), width):
        engine.add(_member(PROMPT * (1 + i % LENGTHS), lives))
    while len(engine.generator._generation_batch) < width and engine.busy:
        engine.step()


def _speed(engine: Engine, width: int) -> float:
    for _ in range(2):
        engine.step()
    started = time.perf_counter()
    for _ in range(TIMED):
        engine.step()
    return width * TIMED / (time.perf_counter() - started)


def _long_prompts(engine: Engine, deadline: float) -> None:
    """Long prompts prefilled together beside members decoding, each leaving at its own
    step, until they are done or `deadline`: the kernels of chunks, of prompts joining a
    batch that decodes and of a member leaving one are built (a first leaving compiled for
    3 s on an H200, every stream silent), and the prefill speed is measured (engine.chunks
    keeps it)."""
    limit = engine.backend.context_length // 2
    repeats = max(1, min(LONG_REPEATS, limit // 12))
    _grow(engine, DECODING)
    longs = [_member(f"{i} " + PROMPT * (repeats - i), 2 + i) for i in range(LONG)]
    for member in longs:
        engine.add(member)
    while any(m.id in engine.uids for m in longs) and time.perf_counter() < deadline:
        engine.step()

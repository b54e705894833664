"""How many requests decode together under `--max-batch auto`: as many as their KV fits in
memory, no more than where the aggregate speed stops growing.

On a GPU a decode step is bound by the host (building and launching the graph), not the
device: on an H200 a 1B model's step takes about the same time at 32 members and at 64, so
a batch twice as wide is twice the tokens for nothing. That stops where the device becomes
the bound: the knee, measured at bring-up (warmup.py times a few steps at each width) as
the widest batch whose tokens per second still grew by `GAIN` over half its width (the
measurement stops at the first width that did not). Memory
bounds it too: each member may hold a context of `CONTEXT` tokens (or the model's, if
shorter), at the KV bytes per token measured on the model. On a CPU each member costs
its whole share of the step, there is no knee worth a warm-up, and the width is `CPU`.
"""

from __future__ import annotations

import itertools
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

CONTEXT = 32_768  # tokens of context a member is sized for: an agent's long conversation
CEILING = 256  # the widest batch measured
CPU = 32
GAIN = 0.05  # growth in tokens/s that a doubling must bring to be worth it
HEADROOM = 0.9  # of the device's memory, for the model, its KV and the runtime
STEP = 256  # positions mlx-lm's KV cache allocates at once


def kv_bytes_per_token(model: Any) -> int:
    """Measured, not read from the config (whose names vary by family, and nest for some):
    one token through a fresh cache, which allocates `STEP` positions at once. A layer
    with a sliding window or a fixed state is counted as if it grew (the bound stays
    safe)."""
    cache = make_prompt_cache(model)
    model(mx.array([[0]]), cache=cache)
    mx.eval([c.state for c in cache])
    return max(1, sum(c.nbytes for c in cache) // STEP)


def fits(per_token: int, context: int, free: int) -> int:
    """Members whose whole contexts fit in `free` bytes (at least 1)."""
    return max(1, free // (per_token * min(context, CONTEXT)))


def free_bytes(device: int, used: int, prompt_cache: int) -> int:
    """What the members' KV may take: the device's memory less headroom, the loaded model
    and the prompt cache's bound."""
    return max(0, int(device * HEADROOM) - used - prompt_cache)


def knee(speeds: dict[int, float]) -> int:
    """The widest measured width whose tokens/s grew by `GAIN` over the one before."""
    widths = sorted(speeds)
    best = widths[0]
    for narrow, wide in itertools.pairwise(widths):
        if speeds[wide] < (1 + GAIN) * speeds[narrow]:
            break
        best = wide
    return best


def passed(speeds: dict[int, float]) -> bool:
    """The knee is behind the widest width measured: wider ones would only cost bring-up."""
    return knee(speeds) < max(speeds)


def widths(limit: int) -> list[int]:
    """The widths a warm-up measures: powers of two from 8 up to `limit`."""
    found, width = [], 8
    while width <= min(limit, CEILING):
        found.append(width)
        width *= 2
    return found or [max(1, limit)]

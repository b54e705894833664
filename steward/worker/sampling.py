"""Samplers for a batch: shared where requests agree, a random key of their own if seeded.

mlx-lm's batch step makes one sampler call for the whole batch when every member holds
the same sampler object, else one call per member. So all greedy requests share one
object, unseeded requests share one per (temperature, top_p), and a seeded request draws
from keys of its own, one per token position: its answer depends on its seed, not on who
else is in the batch, nor on when it moved from running alone into the batch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import mlx.core as mx
from mlx_lm.sample_utils import apply_top_p, greedy_sampler, make_sampler

Sampler = Callable[[mx.array], mx.array]


@functools.lru_cache(maxsize=64)
def _shared(temperature: float, top_p: float) -> Sampler:
    return make_sampler(temperature, top_p)


GREEDY_BELOW = 1e-5  # temperatures this low are argmax (dividing by them overflows)


class Seeded:
    def __init__(self, temperature: float, top_p: float, seed: int, position: int = 0) -> None:
        self.scale = 1.0 / temperature
        self.top_p = top_p
        self.seed = seed
        self.position = position  # the token this call samples

    def __call__(self, logprobs: mx.array) -> mx.array:
        key = mx.random.key((self.seed * 1_000_003 + self.position) % 2**64)
        self.position += 1
        if 0.0 < self.top_p < 1.0:
            logprobs = apply_top_p(logprobs, self.top_p)
        return mx.random.categorical(logprobs * self.scale, key=key)

    def rewind(self, tokens: int) -> None:
        """Tokens sampled ahead and dropped will be sampled again, with the same keys."""
        self.position -= tokens


def sampler(temperature: float, top_p: float, seed: int | None, position: int = 0) -> Sampler:
    """`position`: the answer's first token to draw (a resumed answer's is not 0)."""
    if temperature < GREEDY_BELOW:
        return greedy_sampler
    if seed is None:
        return _shared(temperature, top_p)
    return Seeded(temperature, top_p, seed, position)

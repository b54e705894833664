"""Samplers for a batch: shared where requests agree, a random key of their own if seeded.

mlx-lm's batch step makes one sampler call for the whole batch when every member holds
the same sampler object, else one call per member. So all greedy requests share one
object, unseeded requests share one per (temperature, top_p, top_k, min_p), and a seeded
request draws from keys of its own, one per token position: its answer depends on its
seed, not on who else is in the batch, nor on when it moved from running alone into the
batch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p, greedy_sampler

from steward.wire.protocol import Generate

Sampler = Callable[[mx.array], mx.array]
Filters = tuple[float, int, float]  # top_p, top_k, min_p


GREEDY_BELOW = 1e-5  # temperatures this low are argmax (dividing by them overflows)


def truncate(logprobs: mx.array, filters: Filters) -> mx.array:
    """The filters mlx-lm's sampler applies, in its order; a top_k of the whole
    vocabulary or more filters nothing (mlx-lm's would raise)."""
    top_p, top_k, min_p = filters
    if 0.0 < top_p < 1.0:
        logprobs = apply_top_p(logprobs, top_p)
    if min_p > 0.0:
        logprobs = apply_min_p(logprobs, min_p)
    if 0 < top_k < logprobs.shape[-1]:
        logprobs = apply_top_k(logprobs, top_k)
    return logprobs


@functools.lru_cache(maxsize=64)
def _shared(temperature: float, filters: Filters) -> Sampler:
    scale = 1.0 / temperature
    return lambda logprobs: mx.random.categorical(truncate(logprobs, filters) * scale)


class Seeded:
    def __init__(self, temperature: float, filters: Filters, seed: int, position: int) -> None:
        self.scale = 1.0 / temperature
        self.filters = filters
        self.seed = seed
        self.position = position  # the token this call samples

    def __call__(self, logprobs: mx.array) -> mx.array:
        key = mx.random.key((self.seed * 1_000_003 + self.position) % 2**64)
        self.position += 1
        return mx.random.categorical(truncate(logprobs, self.filters) * self.scale, key=key)

    def rewind(self, tokens: int) -> None:
        """Tokens sampled ahead and dropped will be sampled again, with the same keys."""
        self.position -= tokens


def positions(draw: Sampler, logprobs: mx.array) -> mx.array:
    """A token for each of consecutive positions (the rows of `logprobs`, a verify step's):
    a seeded sampler draws each with that position's own key, as one token at a time would."""
    if isinstance(draw, Seeded):
        return mx.concatenate([draw(logprobs[j : j + 1]) for j in range(logprobs.shape[0])])
    return draw(logprobs)


def sampler(req: Generate, position: int = 0) -> Sampler:
    """`position`: the answer's first token to draw (a resumed answer's is not 0)."""
    if req.temperature < GREEDY_BELOW:
        return greedy_sampler
    filters = (req.top_p, req.top_k, req.min_p)
    if req.seed is None:
        return _shared(req.temperature, filters)
    return Seeded(req.temperature, filters, req.seed, position)

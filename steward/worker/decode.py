"""The batch's decode step without what nobody asked for.

mlx-lm's `GenerationBatch._step` normalizes every row's logits and splits them into one
array per member, every step, so that any member may read its log-probabilities. On a GPU
the step is bound by the host (building and launching the graph), and each of those
per-member arrays is one more operation to launch: at 64 members, 64 slices and their
outputs. When no member wants log-probabilities, no row has a logits processor and the
whole batch shares one sampler (sampling.py makes greedy and unseeded requests share),
`Lean` draws from the normalized rows as they are, one array for the batch (normalized
first, as mlx-lm does: in bf16 the subtraction rounds near-equal logits into ties, so an
argmax of the raw logits would not give mlx-lm's greedy token). Anything else is mlx-lm's
own step, unchanged.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.generate import GenerationBatch


class Lean(GenerationBatch):
    rows_wanted = False  # a member wants its log-probabilities (the engine says, each step)

    def _step(self) -> tuple[list[int], list[Any]]:
        first = self.samplers[0] if self.samplers else None
        if (
            self.rows_wanted
            or any(self.logits_processors)
            or any(s is not first for s in self.samplers)
        ):
            return super()._step()
        draw = first or self.fallback_sampler
        self._current_tokens = inputs = self._next_tokens
        self._current_logprobs = self._next_logprobs  # rows of mlx-lm's step, or None
        logits = self.model(inputs[:, None], cache=self.prompt_cache)[:, -1, :]
        sampled = sample(draw, logits)
        self._next_tokens = sampled
        self._next_logprobs = [None] * len(self.uids)
        mx.async_eval(sampled)
        mx.eval(inputs, self._current_logprobs)
        tokens = inputs.tolist()
        for held, token in zip(self.tokens, tokens, strict=True):
            held.append(token)
        return tokens, self._current_logprobs


def sample(draw: Any, logits: mx.array) -> mx.array:
    """The batch's tokens, drawn from its normalized rows (mlx-lm's order of operations)."""
    return draw(logits - mx.logsumexp(logits, axis=-1, keepdims=True))

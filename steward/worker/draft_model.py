"""A draft model's continuation of a member's tokens (`--draft-model`): the third source of
draft tokens, after a prediction and lookup (speculation.py).

The draft model (a smaller or more quantized model with the target's tokenizer, which the
front checked at start) keeps a KV cache of its own for each member, holding the tokens it
has read of the member's prompt and answer. Asked for a continuation, it reads what it has
not read yet (trimming first whatever it read that the member's tokens no longer have), then
decodes greedily, one token at a time, and forgets those tokens again: they are drafts, and
the answer's own tokens come next time. It reads a long prompt over many steps, no more a
step than the target prefills in a prefill chunk's time budget (chunks.py), so that no step
is kept long by it: the supervisor bounds a step's silence by what the steps before took
(SPEC §3), and a draft model's reading is no part of their clock. It reads at most `MOST`
tokens a step, padded to a power of two, and a worker on a GPU has it read each of those
shapes once at bring-up (`warm`): MLX builds a shape's kernels on its first step, and a
draft model met cold by a server's first request on the H200 kept that step silent for 46 s,
past the stall bound. Members draft one after the other: a draft model pays where the
target's step is dear next to the draft model's (a large target on a GPU, a member or a
few), not where a batch is wide.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx
from mlx_lm.generate import generation_stream
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

MOST = 1024  # tokens read in one step, at most (a power of two)


class DraftModel:
    """The worker's draft model; `reader()` is one member's view of it."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def warm(self) -> None:
        """Every shape a reader feeds, fed once: each power of two up to `MOST` read on a
        cache of its own, then a token decoded after it."""
        size = 1
        while size <= MOST:
            self.reader(lambda: MOST).continuation(list(range(size)), 2)
            size *= 2

    def reader(self, budget: Callable[[], int]) -> Reader:
        """`budget()`: the most tokens it may read in one step."""
        return Reader(self.model, budget)


class Reader:
    """One member's draft cache, and the tokens it holds."""

    def __init__(self, model: Any, budget: Callable[[], int]) -> None:
        self.model = model
        self.budget = budget
        self.cache = make_prompt_cache(model)
        self.held: list[int] = []

    def continuation(self, tokens: list[int], count: int) -> list[int]:
        """The draft model's `count` greedy tokens after `tokens`; none while it is still
        reading a long prompt (`budget()` tokens a call)."""
        same = 0
        for ours, theirs in zip(self.held, tokens, strict=False):
            if ours != theirs:
                break
            same += 1
        if same < len(self.held):
            trim_prompt_cache(self.cache, len(self.held) - same)
            del self.held[same:]
        unread = tokens[same:]
        if not unread or count < 1:
            return []  # nothing new to read from (the member's tokens went nowhere)
        if len(unread) > (most := self.budget()):
            self._read(unread[:most])
            return []
        made = [self._read(unread)]
        while len(made) < count:
            made.append(self._read([made[-1]]))
        trim_prompt_cache(self.cache, len(made) - 1)  # drafts, not the member's tokens
        del self.held[len(tokens) :]
        return made

    def _read(self, tokens: list[int]) -> int:
        """Feed `tokens`; the greedy token after them. They are fed padded to a power of
        two, the padding then trimmed from the cache (it comes after them, so nothing they
        see changes): a GPU builds kernels for each new shape on its first step, seconds on
        the H200, in which the step stays silent."""
        padded = 1 << (len(tokens) - 1).bit_length()
        fed = tokens + [tokens[-1]] * (padded - len(tokens))
        with mx.stream(generation_stream):
            logits = self.model(mx.array(fed)[None], cache=self.cache)[0, len(tokens) - 1]
            token = int(mx.argmax(logits).item())
        trim_prompt_cache(self.cache, padded - len(tokens))
        self.held += tokens
        return token

"""One request decoding alone, on mlx-lm's single-sequence loop (`generate_step`'s).

A batch of one in mlx-lm's `BatchGenerator` decodes at about half of bare mlx-lm's speed on
a GPU (measured on an H200 with a 1B model: its batched KV cache builds an attention mask
every step, and its step keeps per-row bookkeeping). The common case of one client runs
here at bare speed instead. When another request arrives, `handover()` gives the batch the
KV cache and what is left of the request, and the batch continues it token for token.

The prompt is prefilled here in chunks, one per engine step, so a request that arrives
meanwhile is not kept waiting for the whole prompt. The decode loop is `generate_step`'s,
except that a logits processor gets the token just fed as its own array, queued a step
earlier: a grammar reads it at no cost (`generate_step` hands processors a growing
concatenation, a new operation to run and wait for at every token).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import mlx.core as mx
from mlx_lm.generate import generation_stream
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

from steward.worker.logits import Processor
from steward.worker.sampling import Sampler, Seeded


class Solo:
    def __init__(
        self,
        model: Any,
        prompt: list[int],
        cache: list[Any] | None,
        cached: int,
        sampler: Sampler,
        processors: list[Processor],
        max_tokens: int,
        prefill_step: int,
    ) -> None:
        self.model = model
        self.prompt = prompt
        self.cache = cache if cache is not None else make_prompt_cache(model)
        self.prefilled = cached  # prompt tokens in the cache
        self.sampler = sampler
        self.processors = processors
        self.max_tokens = max_tokens
        self.prefill_step = prefill_step
        self.out: list[int] = []
        self._steps: Iterator[tuple[int, mx.array]] | None = None

    def next(self) -> tuple[int, mx.array] | None:
        """One prefill chunk (None), or the next token and the log-probabilities it was
        drawn from."""
        if self._steps is None and len(self.prompt) - self.prefilled > 1:
            end = min(self.prefilled + self.prefill_step, len(self.prompt) - 1)
            with mx.stream(generation_stream):
                self.model(mx.array(self.prompt[self.prefilled : end])[None], cache=self.cache)
                mx.eval([c.state for c in self.cache])
            self.prefilled = end
            return None
        if self._steps is None:
            self._steps = self._decode(mx.array(self.prompt[self.prefilled :]))
        token, logprobs = next(self._steps)
        self.out.append(token)
        return token, logprobs

    def _decode(self, rest: mx.array) -> Iterator[tuple[int, mx.array]]:
        """Each token and its log-probabilities; the next step is queued before a token is
        read back, so the device never waits for the CPU."""
        y, logprobs = self._step(rest)
        mx.async_eval(y, logprobs)
        made = 0
        while True:
            next_y, next_logprobs = self._step(y)
            mx.async_eval(next_y, next_logprobs)
            yield y.item(), logprobs
            made += 1
            if made % 256 == 0:
                mx.clear_cache()
            y, logprobs = next_y, next_logprobs

    def _step(self, fed: mx.array) -> tuple[mx.array, mx.array]:
        with mx.stream(generation_stream):
            logits = self.model(fed[None], cache=self.cache)[:, -1, :]
            for processor in self.processors:
                logits = processor(fed, logits)
            logprobs = logits - mx.logsumexp(logits, keepdims=True)
            return self.sampler(logprobs), logprobs.squeeze(0)

    def held(self) -> list[int]:
        """The tokens whose KV the cache holds: the decode loop has fed each token it gave."""
        return self.prompt[: self.prefilled] if self._steps is None else self.prompt + self.out

    def handover(self) -> tuple[list[Any], list[int], list[int]]:
        """(cache, the tokens it holds, the tokens to feed next) for the batch to go on."""
        if self._steps is None:
            return self.cache, self.held(), self.prompt[self.prefilled :]
        trim_prompt_cache(self.cache, 1)  # the last token goes in again, through the batch
        if isinstance(self.sampler, Seeded):
            self.sampler.rewind(1)  # the decode loop sampled one token ahead
        for processor in self.processors:
            processor.rewind()
        return self.cache, self.prompt + self.out[:-1], self.out[-1:]

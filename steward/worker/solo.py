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

A request that drafts (speculation.py) verifies here too, where no processor shapes its
logits: the pending token and its drafts in one forward, each draft kept while the sample
before it agrees, the cache trimmed of the rest. A batch of one would verify the same way,
at the batch's cost per step.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.generate import generation_stream
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

from steward.worker.batch import agreed
from steward.worker.logits import Processor
from steward.worker.sampling import Sampler, Seeded, positions


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
        # The token drawn after the last the cache holds, and its log-probabilities: not
        # fed yet, maybe still on the device (None: the prompt is not in yet).
        self.pending: tuple[mx.array, mx.array] | None = None

    def next(self, drafts: list[int] | None = None) -> list[tuple[int, mx.array]] | None:
        """One prefill chunk (None), else the next token and the log-probabilities it was
        drawn from; with `drafts` (no processors), the next token and each draft that its
        own sample agrees with, verified in one forward."""
        if self.pending is None and len(self.prompt) - self.prefilled > 1:
            end = min(self.prefilled + self.prefill_step, len(self.prompt) - 1)
            with mx.stream(generation_stream):
                self.model(mx.array(self.prompt[self.prefilled : end])[None], cache=self.cache)
                mx.eval([c.state for c in self.cache])
            self.prefilled = end
            return None
        if self.pending is None:
            self.pending = self._step(mx.array(self.prompt[self.prefilled :]))
        made = self._verify(drafts) if drafts else [self._decode()]
        self.out += [token for token, _ in made]
        if len(self.out) % 256 < len(made):
            mx.clear_cache()
        return made

    def _decode(self) -> tuple[int, mx.array]:
        """The pending token, fed at once: the step after it is queued before the token is
        read back, so the device never waits for the CPU."""
        token, logprobs = self.pending
        self.pending = self._step(token)
        return token.item(), logprobs

    def _verify(self, drafts: list[int]) -> list[tuple[int, mx.array]]:
        """The pending token and `drafts` fed in one forward: the pending token and each
        draft the sample before it agrees with, up to the first that it does not; the
        sample after the last kept is pending next. The cache drops the drafts not kept
        (a single sequence's cache trims exactly). It waits for its samples."""
        token, logprobs = self.pending
        fed = mx.concatenate([token, mx.array(drafts, token.dtype)])
        with mx.stream(generation_stream):
            logits = self.model(fed[None], cache=self.cache)[0]
            rows = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            drawn = positions(self.sampler, rows)
        mx.eval(token, drawn)
        samples = drawn.tolist()
        took = agreed(drafts, samples)
        trim_prompt_cache(self.cache, len(drafts) - took)
        if isinstance(self.sampler, Seeded):
            self.sampler.rewind(len(drafts) - took)  # its later keys are drawn again
        self.pending = (drawn[took : took + 1], rows[took])
        return [(token.item(), logprobs), *((d, rows[j]) for j, d in enumerate(drafts[:took]))]

    def _step(self, fed: mx.array) -> tuple[mx.array, mx.array]:
        """The token after `fed` and its log-probabilities, queued on the device at once:
        each step is evaluated on its own, as mlx-lm's loop does. (Left to be evaluated with
        the step after it, two forwards of a pipeline-parallel model, whose ranks' graphs
        differ, would order their sends and receives differently on each rank: a deadlock.)"""
        with mx.stream(generation_stream):
            logits = self.model(fed[None], cache=self.cache)[:, -1, :]
            for processor in self.processors:
                logits = processor(fed, logits)
            logprobs = logits - mx.logsumexp(logits, keepdims=True)
            drawn = self.sampler(logprobs), logprobs.squeeze(0)
        mx.async_eval(*drawn)
        return drawn

    def held(self) -> list[int]:
        """The tokens whose KV the cache holds: every token given was fed."""
        return self.prompt[: self.prefilled] if self.pending is None else self.prompt + self.out

    def handover(self) -> tuple[list[Any], list[int], list[int]]:
        """(cache, the tokens it holds, the tokens to feed next) for the batch to go on."""
        if self.pending is None:
            return self.cache, self.held(), self.prompt[self.prefilled :]
        trim_prompt_cache(self.cache, 1)  # the last token goes in again, through the batch
        if isinstance(self.sampler, Seeded):
            self.sampler.rewind(1)  # the pending token is drawn again there
        for processor in self.processors:
            processor.rewind()
        return self.cache, self.prompt + self.out[:-1], self.out[-1:]

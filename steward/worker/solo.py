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

A verify step is pipelined as a decode step is: before its samples are read back, the next
verify step is queued (`Flight`), fed the last of those samples (still on the device) and
the drafts that follow them, on the bet that every draft is kept. When the bet holds (text
that copies keeps whole runs of drafts) the device never waits for the host, and a verify
step costs about a decode step on a GPU, whose steps are bound by launching kernels: its
drafts come nearly free. When it fails, the step queued ahead is dropped, the cache trimmed
of it, and the next step is fed from the sample after the last draft kept.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.generate import generation_stream
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

from steward.worker.batch import agreed
from steward.worker.logits import Processor
from steward.worker.sampling import Sampler, Seeded, positions

# The drafts to feed after the pending token and `skip` more positions queued before them
# (none: do not verify).
Drafts = Callable[[int], list[int]]


@dataclass
class Flight:
    """A verify step queued on the device and not read back yet."""

    fed: mx.array  # its first token, a sample of the step before (maybe not drawn yet)
    drafts: list[int]
    rows: mx.array  # its log-probabilities, one row per position
    drawn: mx.array  # its sample at each position

    @property
    def width(self) -> int:
        return 1 + len(self.drafts)


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
        self.flight: Flight | None = None  # a verify step queued ahead of the pending token
        self.landed: tuple[int, int] | None = None  # the last step's (drafts, kept)

    def next(self, drafts: Drafts | None = None) -> list[tuple[int, mx.array]] | None:
        """One prefill chunk (None), else the next token and the log-probabilities it was
        drawn from; with `drafts` (no processors), also each draft that its own sample
        agrees with, verified in one forward (`_land`)."""
        if self.pending is None and len(self.prompt) - self.prefilled > 1:
            end = min(self.prefilled + self.prefill_step, len(self.prompt) - 1)
            with mx.stream(generation_stream):
                self.model(mx.array(self.prompt[self.prefilled : end])[None], cache=self.cache)
                mx.eval([c.state for c in self.cache])
            self.prefilled = end
            return None
        if self.pending is None:
            self.pending = self._step(mx.array(self.prompt[self.prefilled :]))
        self.landed = None
        if self.flight is None and drafts is not None and (first := drafts(0)):
            self.flight = self._queue(self.pending[0], first)
        made = [self._decode()] if self.flight is None else self._land(drafts)
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

    def _queue(self, token: mx.array, drafts: list[int]) -> Flight:
        """A verify step of `token` and `drafts`, queued on the device."""
        fed = mx.concatenate([token, mx.array(drafts, token.dtype)])
        with mx.stream(generation_stream):
            logits = self.model(fed[None], cache=self.cache)[0]
            rows = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            drawn = positions(self.sampler, rows)
        mx.async_eval(drawn)
        return Flight(token, drafts, rows, drawn)

    def _land(self, drafts: Drafts | None) -> list[tuple[int, mx.array]]:
        """The step in flight read back, once the next is queued behind it (if the drafts
        go on): its fed token and each draft the sample before it agrees with, up to the
        first that it does not; the sample after the last kept is pending next. Where a
        draft was refused, the step queued behind (fed on the bet that none would be) is
        dropped, and the cache with it."""
        flight, self.flight = self.flight, None
        assert flight is not None
        after = drafts(flight.width) if drafts is not None else []
        ahead = self._queue(flight.drawn[-1:], after) if after else None
        mx.eval(flight.fed, flight.drawn)
        took = agreed(flight.drafts, flight.drawn.tolist())
        self.landed = (len(flight.drafts), took)
        made = [(flight.fed.item(), self.pending[1])]
        made += [(d, flight.rows[j]) for j, d in enumerate(flight.drafts[:took])]
        self.pending = (flight.drawn[took : took + 1], flight.rows[took])
        if took == len(flight.drafts):
            self.flight = ahead
        else:
            self._drop(len(flight.drafts) - took + (ahead.width if ahead else 0))
        return made

    def _drop(self, positions: int) -> None:
        """The cache's last `positions` were fed ahead and are not kept: they go, and a
        seeded sampler's keys for them are drawn again."""
        trim_prompt_cache(self.cache, positions)
        if isinstance(self.sampler, Seeded):
            self.sampler.rewind(positions)

    def settle(self) -> None:
        """No step in flight: the one queued ahead is dropped, so that the cache holds
        what `held` says (before the request leaves, or hands over to the batch)."""
        if self.flight is not None:
            self._drop(self.flight.width)
            self.flight = None

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
        self.settle()
        if self.pending is None:
            return self.cache, self.held(), self.prompt[self.prefilled :]
        trim_prompt_cache(self.cache, 1)  # the last token goes in again, through the batch
        if isinstance(self.sampler, Seeded):
            self.sampler.rewind(1)  # the pending token is drawn again there
        for processor in self.processors:
            processor.rewind()
        return self.cache, self.prompt + self.out[:-1], self.out[-1:]

"""The one place that knows mlx-lm's `BatchGenerator` from the inside.

The engine, the prefill chunks, the warm-up and the benches see a batch of rows (a request's
KV cache and the tokens it holds, by the generator's uid) through `Batch`; nothing else reads
or writes the generator's private state, so an mlx-lm release that moves it breaks this
module alone (hence the `mlx-lm<0.33` pin). What it relies on, of mlx-lm 0.32:

- `BatchGenerator`: `insert`, `remove(return_prompt_caches=)`, `extract_cache`, `next()`
  giving (prompt responses, generation responses), `close`, its `model`,
  `prefill_step_size`, `prefill_batch_size` and `completion_batch_size`; and privately its
  `_generation_batch` (the rows decoding), `_prompt_batch` (the rows prefilling, which keeps
  its own `prefill_step_size`), `_unprocessed_sequences` (rows not prefilling yet) and
  `_counters` (prompt tokens and seconds, summed).
- `GenerationBatch`: `uids`, `tokens` (each row's: those its cache holds), `prompt_cache`
  (one batched cache per layer; a `BatchKVCache`'s `keys`, `values`, `offset`,
  `left_padding` and `_idx` for a row's trim), `logits_processors`, `samplers`,
  `fallback_sampler`, `_next_tokens`, `_next_logprobs`, `_current_tokens`,
  `_current_logprobs`, `max_tokens`, `_num_tokens`, `_matchers`, `extract_cache`, `filter`,
  `Response`, and `_step()` and `next()`, which `Lean` replaces.

The per-row interface (`insert`, `remove`, `cache`, `length`, `trim`) is what speculative
decoding extends (speculation.py). `speculate` gives the next step each row's draft tokens:
`Lean` verifies them all in one forward (`_verify`), each row keeping the drafts its own
samples agree with, and `roll` rolls each row's cache back by its own amount (mlx-lm's
`BatchKVCache.trim(n)` trims every row by the same `n`). `next` then gives a row several
tokens, each checked for its end as mlx-lm checks one.

`Lean` is the batch's decode step without what nobody asked for. mlx-lm's
`GenerationBatch._step` normalizes every row's logits and splits them into one array per
member, every step, so that any member may read its log-probabilities. On a GPU the step is
bound by the host (building and launching the graph), and each of those per-member arrays is
one more operation to launch: at 64 members, 64 slices and their outputs. When no member
wants log-probabilities, no row has a logits processor and the whole batch shares one
sampler (sampling.py makes greedy and unseeded requests share), `Lean` draws from the
normalized rows as they are, one array for the batch (normalized first, as mlx-lm does: in
bf16 the subtraction rounds near-equal logits into ties, so an argmax of the raw logits
would not give mlx-lm's greedy token). Anything else is mlx-lm's own step, unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, GenerationBatch
from mlx_lm.models.cache import BatchKVCache

from steward.worker.sampling import Seeded, positions

PREFILL_BATCH = 8  # prompts prefilled together


class Lean(GenerationBatch):
    rows_wanted = False  # a member wants its log-probabilities (the engine says, each step)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.drafts: dict[int, list[int]] = {}  # by uid: what the next step verifies
        self.shaper: Shaper | None = None  # masks a verify step's grammar rows (grammar.py)
        self.verified: dict[int, tuple[int, int]] = {}  # by uid: last step's (offered, kept)
        super().__init__(*args, **kwargs)

    def next(self) -> list[GenerationBatch.Response]:
        """mlx-lm's `next`, with a row giving several tokens when a step verified drafts:
        each is counted and checked for its end as mlx-lm checks one, and the first that
        ends the row ends it (the row's cache is trimmed before it is handed back)."""
        if not self.uids:
            return []
        drafts, self.drafts, self.verified = self.drafts, {}, {}
        if any(drafts.values()) and not any(self.logits_processors):
            made, logprobs = self._verify([drafts.get(uid, []) for uid in self.uids])
        else:
            tokens, rows = self._step()
            made, logprobs = [[t] for t in tokens], [[row] for row in rows]
        keep, responses = [], []
        for i, uid in enumerate(self.uids):
            finish = None
            for token, logprob in zip(made[i], logprobs[i], strict=True):
                self._num_tokens[i] += 1
                if self._num_tokens[i] >= self.max_tokens[i]:
                    finish = "length"
                if self._matchers[i].advance(token):
                    finish = "stop"
                held = (self.extract_cache(i), self.tokens[i]) if finish else (None, None)
                responses.append(self.Response(uid, token, logprob, finish, *held))
                if finish is not None:
                    break
            if finish is None:
                keep.append(i)
        if len(keep) < len(self.uids):
            self.filter(keep)
        return responses

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

    def _verify(self, drafts: list[list[int]]) -> tuple[list[list[int]], list[list[Any]]]:
        """One forward over each row's fed token and its drafts (right-padded to the
        longest): a row keeps its fed token and each draft its own sample at that position
        agrees with, up to the first that it does not; its next token is its sample after
        the last kept. Each row's cache then drops what it did not keep (`roll`). It waits
        for its samples: the drafts kept decide the next step."""
        width = 1 + max(len(d) for d in drafts)
        padded = [d + [0] * (width - 1 - len(d)) for d in drafts]
        fed = self._next_tokens
        inputs = mx.concatenate([fed[:, None], mx.array(padded, fed.dtype)], axis=1)
        logits = self.model(inputs, cache=self.prompt_cache)
        if self.shaper is not None:
            logits = self.shaper.mask(logits, fed, drafts)  # cuts what a grammar forbids
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        sampled = self._sample(logprobs, [1 + len(d) for d in drafts])
        mx.eval(fed, sampled)
        made, rows, nexts, drops = [], [], [], []
        for i, (token, draft, drawn) in enumerate(
            zip(fed.tolist(), drafts, sampled.tolist(), strict=True)
        ):
            took = agreed(draft, drawn)
            made.append([token, *draft[:took]])
            self.tokens[i].extend(made[-1])
            rows.append([self._next_logprobs[i], *self._rows(logprobs, i, range(took))])
            nexts.append(drawn[took])
            drops.append(width - 1 - took)
            self.verified[self.uids[i]] = (len(draft), took)
            if isinstance(self.samplers[i], Seeded):
                self.samplers[i].rewind(len(draft) - took)  # its later keys are drawn again
        if self.shaper is not None:
            self.shaper.settle([len(m) - 1 for m in made])
        roll(self.prompt_cache, drops)
        self._next_tokens = mx.array(nexts, fed.dtype)
        self._next_logprobs = [self._rows(logprobs, i, [len(m) - 1])[0] for i, m in enumerate(made)]
        return made, rows

    def _rows(self, logprobs: mx.array, i: int, positions: Iterable[int]) -> list[Any]:
        """Row `i`'s log-probabilities at `positions`, where a member wants them."""
        return [logprobs[i, j] if self.rows_wanted else None for j in positions]

    def _sample(self, logprobs: mx.array, lengths: list[int]) -> mx.array:
        """Each row's sample at each position (rows, width): one call when the batch shares
        a sampler, else each row's own (a seeded one draws its row's positions alone, each
        with that position's key)."""
        samplers = [s or self.fallback_sampler for s in self.samplers]
        rows, width, vocab = logprobs.shape
        if all(s is samplers[0] for s in samplers) and not isinstance(samplers[0], Seeded):
            return samplers[0](logprobs.reshape(rows * width, vocab)).reshape(rows, width)
        drawn = [
            positions(s, logprobs[i, :n])
            for i, (s, n) in enumerate(zip(samplers, lengths, strict=True))
        ]
        return mx.stack([mx.pad(d, (0, width - d.shape[0])) for d in drawn])


class Shaper(Protocol):
    """What masks a verify step's rows under a grammar (grammar.py's `Drafted`)."""

    def mask(self, logits: mx.array, fed: mx.array, drafts: list[list[int]]) -> mx.array: ...

    def settle(self, kept: list[int]) -> None: ...


def agreed(draft: list[int], drawn: list[int]) -> int:
    """How many of `draft` the samples `drawn` at their positions agree with, in order."""
    took = 0
    while took < len(draft) and drawn[took] == draft[took]:
        took += 1
    return took


def roll(layers: list[Any], drops: list[int]) -> None:
    """Each row of the batched caches drops its last `drops[row]` tokens. What every row
    drops goes by shortening the batch's shared length (no copy: a batch of one always);
    the rest of a row's drop by moving its keys and values right by that many, behind as
    much more left padding (what wraps round lies there, masked; what passes the shared
    length lies where the next step writes), so no row moves another. The whole buffer
    moves, not its filled part: its size changes only as it grows, so each step's new
    buffers are the sizes the last step freed (a filled part one token longer each step
    is a new allocation each step), and one index serves every layer."""
    common = min(drops, default=0)
    if common:
        for layer in layers:
            layer.trim(common)
        drops = [drop - common for drop in drops]
    if not any(drops):
        return
    shift = mx.array(drops)
    index = None
    for layer in layers:
        size = layer.keys.shape[2]
        if index is None or index.shape[2] != size:
            index = (mx.arange(size)[:, None] - shift[:, None, None, None]) % size
        layer.keys = mx.take_along_axis(layer.keys, index, axis=2)
        layer.values = mx.take_along_axis(layer.values, index, axis=2)
        layer.offset = layer.offset - shift
        layer.left_padding = layer.left_padding + shift


def sample(draw: Any, logits: mx.array) -> mx.array:
    """The batch's tokens, drawn from its normalized rows (mlx-lm's order of operations)."""
    return draw(logits - mx.logsumexp(logits, axis=-1, keepdims=True))


class Batch:
    """mlx-lm's continuous batch: rows join (prefilled in chunks), decode together, leave."""

    def __init__(self, model: Any, eos: set[int], width: int) -> None:
        self.generator = BatchGenerator(
            model,
            stop_tokens=[[t] for t in eos],
            completion_batch_size=width,
            prefill_batch_size=min(PREFILL_BATCH, width),
        )
        self.generator._generation_batch = Lean.empty(model, self.generator.sampler)

    # The batch as a whole

    def widen(self, width: int) -> None:
        """Decode up to `width` rows together from the next step."""
        self.generator.prefill_batch_size = min(PREFILL_BATCH, width)
        self.generator.completion_batch_size = width

    def next(self) -> tuple[list[Any], list[Any], int]:
        """One step: (prompt responses, generation responses, prompt tokens it prefilled)."""
        counted = self.generator._counters.prompt_tokens
        prompts, outputs = self.generator.next()
        return prompts, outputs, self.generator._counters.prompt_tokens - counted

    def close(self) -> None:
        self.generator.close()

    @property
    def decoding(self) -> int:
        """Rows past their prompt, decoding."""
        return len(self.generator._generation_batch)

    @property
    def uids(self) -> list[int]:
        """The decoding rows, in the order of the step's rows."""
        return self.generator._generation_batch.uids

    @property
    def fed(self) -> mx.array | None:
        """The tokens the next step feeds its decoding rows, still on the device."""
        return self.generator._generation_batch._next_tokens

    def speculate(self, drafts: dict[int, list[int]], shaper: Shaper | None) -> None:
        """The next step verifies each decoding row's `drafts` (by uid) after the token it
        feeds, `shaper` masking its rows under a grammar; it is a plain step while a row
        is in mlx-lm's per-row logits-processor loop (penalties, a bias)."""
        batch = self.generator._generation_batch
        batch.drafts, batch.shaper = drafts, shaper

    @property
    def verified(self) -> dict[int, tuple[int, int]]:
        """By uid: the drafts the last step verified for the row, and how many it kept."""
        return self.generator._generation_batch.verified

    def processing(self) -> bool:
        """Whether a decoding row is in mlx-lm's per-row logits-processor loop."""
        return any(self.generator._generation_batch.logits_processors)

    def want_rows(self, wanted: bool) -> None:
        """Whether a member wants its log-probabilities this step (`Lean`)."""
        self.generator._generation_batch.rows_wanted = wanted

    def unprocess(self, row: int) -> None:
        """The decoding row leaves mlx-lm's per-row logits-processor loop (its grammar is
        applied to the whole batch instead: grammar.py's `BatchStep`)."""
        self.generator._generation_batch.logits_processors[row] = ()

    def stock(self) -> None:
        """mlx-lm's own decode step instead of `Lean` (for a bench or a test to compare)."""
        self.generator._generation_batch.__class__ = GenerationBatch

    def swap_model(self, model: Any) -> None:
        """Every stage calls `model` (a bench that times the model's calls)."""
        generator = self.generator
        for holder in (generator, generator._prompt_batch, generator._generation_batch):
            holder.model = model

    # Prefill, for the chunks

    def prefill_counters(self) -> tuple[int, float]:
        """Prompt tokens prefilled and the seconds they took, since the batch began."""
        counters = self.generator._counters
        return counters.prompt_tokens, counters.prompt_time

    def prompts_waiting(self) -> int:
        """Prompts that the next step prefills (or that wait to)."""
        generator = self.generator
        return len(generator._prompt_batch) + len(generator._unprocessed_sequences)

    def chunk(self, size: int) -> None:
        """Prefill at most `size` tokens of each prompt per step."""
        self.generator.prefill_step_size = size
        self.generator._prompt_batch.prefill_step_size = size

    # Rows

    def insert(
        self,
        *,
        rest: list[int],
        held: list[int],
        cache: list[Any] | None,
        sampler: Any,
        processors: list[Any],
        max_tokens: int,
    ) -> int:
        """A row that prefills `rest` after `held`, whose KV `cache` holds (None: nothing);
        its uid."""
        (uid,) = self.generator.insert(
            [rest],
            max_tokens=[max_tokens],
            caches=[cache],
            all_tokens=[held],
            samplers=[sampler],
            logits_processors=[processors],
        )
        return uid

    def remove(self, uid: int, keep: bool) -> tuple[list[Any], list[int]] | None:
        """The row leaves; with `keep`, its cache and the tokens it holds."""
        kept = self.generator.remove([uid], return_prompt_caches=keep)
        return kept.get(uid)

    def cache(self, uid: int) -> tuple[list[Any], list[int]] | None:
        """A copy of the row's cache and of the tokens it holds (None: no such row)."""
        found = self.generator.extract_cache([uid]).get(uid)
        return None if found is None else (found[0], list(found[1]))

    def length(self, uid: int) -> int:
        """Tokens the row's cache holds."""
        found = self.generator._find_uids([uid]).get(uid)
        if found is None:
            raise KeyError(uid)
        stage, i = found
        generator = self.generator
        if stage == 2:
            return len(generator._generation_batch.tokens[i])
        if stage == 1:
            return len(generator._prompt_batch.tokens[i])
        return len(generator._unprocessed_sequences[i][4])

    def can_trim(self) -> bool:
        """Whether a decoding row's cache can drop its last tokens (plain KV layers)."""
        layers = self.generator._generation_batch.prompt_cache
        return bool(layers) and all(type(c) is BatchKVCache for c in layers)

    def trim(self, uid: int, count: int) -> None:
        """A decoding row's last `count` tokens leave its cache: its keys and values move
        right by `count` inside the batch's shared length, behind more left padding, so the
        other rows are untouched."""
        batch = self.generator._generation_batch
        row = batch.uids.index(uid)
        if not 0 <= count <= len(batch.tokens[row]) or not self.can_trim():
            raise ValueError(f"cannot trim {count} tokens from row {uid}")
        if count == 0:
            return
        for layer in batch.prompt_cache:
            end = layer._idx
            for name in ("keys", "values"):
                held = getattr(layer, name)
                kept = held[row : row + 1, :, : end - count]
                pad = mx.zeros((1, held.shape[1], count, held.shape[3]), held.dtype)
                held[row : row + 1, :, :end] = mx.concatenate([pad, kept], axis=2)
            shift = mx.zeros_like(layer.offset).at[row].add(count)
            layer.offset = layer.offset - shift
            layer.left_padding = layer.left_padding + shift
        del batch.tokens[row][-count:]

"""Grammar-constrained decoding with llguidance: the tokens a grammar allows next, as a mask.

llguidance (Microsoft's, the engine behind OpenAI-style structured outputs in several
servers) compiles a JSON schema or a Lark grammar lazily and computes a mask over the
whole vocabulary in tens of microseconds. It has no dependencies and covers most of JSON
Schema; xgrammar needs torch and triton; outlines-core builds a whole automaton per schema
up front (`python -m bench.grammars` compares them). Its MLX helper is a Metal kernel, so
the mask is applied here with plain MLX operations that run on every device.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import llguidance
import llguidance.hf
import mlx.core as mx
import numpy as np
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

COMPILED = 64  # grammars kept compiled: a client repeats its schema
ALONE = np.zeros(1, np.bool_)  # one row, under a grammar
FIRST = np.zeros(1, np.uint32)  # its index among the distinct masks
Masks = tuple[np.ndarray, np.ndarray, np.ndarray]  # `_prepared`'s: rows, index, free rows
MASKER = ThreadPoolExecutor(1, thread_name_prefix="grammar")  # the worker steps one call at once


class Grammar:
    """One answer's grammar state: fed each token the answer gets, it masks the logits of
    the next."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab: int, eos: int) -> None:
        self.matcher = matcher
        self.eos = eos
        self.words = allocate_token_bitmask(1, vocab)  # what the next token may be

    def accept(self, token: int) -> bool:
        """False: the grammar does not allow `token` (it is in its error state now)."""
        return self.matcher.consume_token(token)

    def mask(self, logits: mx.array, token: int | None) -> mx.array:
        """`logits` masked for the next token, once the grammar is fed `token` (None: the
        answer's first); alone (`BatchStep` masks a batch's rows together)."""

        def masks() -> Masks:
            if token is not None:
                self.accept(token)
            fill_next_token_bitmask(self.matcher, self.words)
            self.check(self.words[0])
            return self.words, FIRST, ALONE

        return launched(logits, masks)

    def check(self, words: np.ndarray) -> None:
        """In an error state (a token the grammar refused, which llguidance reports rather
        than raises) only EOS is allowed: the answer ends."""
        if self.matcher.is_error():
            words[:] = 0
            words.view(np.uint32)[self.eos // 32] = 1 << self.eos % 32


class Armed(NamedTuple):
    """A batch step's grammar rows: the tokens it feeds (still on the device) and each
    row's processor."""

    tokens: mx.array
    rows: list[tuple[int, Any]]  # (row, processor) of each member under a grammar
    size: int  # rows in the batch


class BatchStep:
    """A batch step's grammar masks, applied to the whole batch's logits at once.

    The engine arms it before each step with the tokens the step feeds and the rows under
    a grammar. When the model call's logits come (`Masked`), it reads the tokens (which
    waits for the step before to end, when the CPU is the bottleneck long ended) and masks
    the logits as `launched` does: the grammars are fed and the masks computed on the
    grammar thread while this one launches the call.
    """

    def __init__(self, executor: llguidance.LLExecutor) -> None:
        self.executor = executor
        self.bits = np.empty((0, 0), np.int32)  # reused: a fresh buffer each step faults
        self.armed: Armed | None = None

    def arm(self, tokens: mx.array, rows: list[tuple[int, Any]], size: int) -> None:
        self.armed = Armed(tokens, rows, size)

    def disarm(self) -> None:
        """Forget an armed step whose model call did not come (a fault), or the last one
        when this step has no grammar."""
        self.armed = None

    def apply(self, logits: mx.array) -> mx.array:
        """`logits` of a model call; masked if it is the armed step's (size, 1, vocab)."""
        armed = self.armed
        if armed is None or logits.shape[:2] != (armed.size, 1):
            return logits
        self.armed = None
        width = armed.rows[0][1].grammar.words.shape[1]
        if self.bits.shape != (armed.size, width):
            self.bits = np.empty((armed.size, width), np.int32)
        fed = armed.tokens.tolist()
        return launched(logits, functools.partial(self._masks, armed, fed, self.bits))

    def _masks(self, armed: Armed, fed: list[int], bits: np.ndarray) -> Masks:
        """Feed each grammar its row's token, then the step's masks, as `_prepared` gives
        them; a row fed a token its grammar refused allows only EOS."""
        bits.fill(-1)  # rows without a grammar: every token allowed
        free = np.ones(armed.size, np.bool_)
        matchers, refused = [], []
        for i, processor in armed.rows:
            if not processor.give(fed[i]):
                refused.append((i, processor.grammar))
            matchers.append((processor.grammar.matcher, i))
            free[i] = False
        self.executor.unsafe_compute_mask_ptr(
            matchers, bits.ctypes.data, bits.shape[1] * 4, bits.shape[0]
        )
        for i, grammar in refused:
            grammar.check(bits[i])
        return _prepared(bits, free)


class Masked:
    """The model as the batch calls it: `BatchStep` masks the armed step's logits.
    Anything else is the model's own."""

    def __init__(self, model: Any, step: BatchStep) -> None:
        self.model = model
        self.step = step

    def __call__(self, *args: Any, **kwargs: Any) -> mx.array:
        return self.step.apply(self.model(*args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


def launched(logits: mx.array, masks: Callable[[], Masks]) -> mx.array:
    """`logits` masked by `masks()`, which runs on the grammar thread while this one
    launches the model call. `mx.async_eval` releases the GIL while it encodes the call's
    kernels, which is most of a decode step when the CPU is the bottleneck (a 1B model on
    the H200: 3.5-6.3 ms of a 5-10 ms step), so the grammars are fed and the masks
    computed meanwhile; when the device is the bottleneck, the masks are computed while it
    runs the call. (Computed while the call was built, or after it, they cost 13% of a
    step at a batch of 32; this way, 3%: docs/benchmarks.md.)"""
    job = MASKER.submit(masks)
    try:
        mx.async_eval(logits)
    finally:
        job.exception()  # waits: the grammars are left alone, whatever happened here
    return _masked(logits, *job.result())


def _prepared(bits: np.ndarray, free: np.ndarray) -> Masks:
    """`bits`' distinct rows, each row's index among them, and which of them are `free` (a
    row without a grammar never shares one with a row that has: past the tokenizer's ids
    they differ). A batch under one schema has few distinct masks, and on CUDA each page of
    a mask costs as it moves between host and device. The distinct rows are padded to a
    power of two, so that `_apply` is traced for few shapes."""
    keys = bits.sum(axis=1, dtype=np.int64) * 2 + free
    _, first, index = np.unique(keys, return_index=True, return_inverse=True)
    if not np.array_equal(bits[first][index], bits):  # two masks with one sum: all rows
        return bits, np.arange(len(bits), dtype=np.uint32), free
    padding = (1 << (len(first) - 1).bit_length()) - len(first)
    first = np.concatenate([first, np.repeat(first[:1], padding)])
    return bits[first], index.astype(np.uint32), free[first]


def _masked(logits: mx.array, bits: np.ndarray, index: np.ndarray, free: np.ndarray) -> mx.array:
    """Each row of `logits` (rows, [1,] vocab) masked by its row `bits[index[row]]`; the ids
    past the tokenizer's vocabulary (padding rows of the embedding) only in `free` rows."""
    missing = (logits.shape[-1] + 31) // 32 - bits.shape[1]
    if missing > 0:
        tail = np.where(free[:, None], np.int32(-1), np.int32(0)).repeat(missing, axis=1)
        bits = np.concatenate([bits, tail], axis=1)
    return _apply(logits, RESIDENT.get(bits.view(np.uint32)), RESIDENT.get(index))


class Resident:
    """Small host arrays kept on the device, found again by their bytes. A batch's masks
    repeat from step to step (every step inside a string has the same), and on CUDA each
    fresh one cost the H200 0.1 ms of the main thread (its pages move to the device)."""

    def __init__(self, entries: int, largest: int) -> None:
        self.entries = entries
        self.largest = largest  # bytes: past this, hashing would cost what it saves
        self.arrays: OrderedDict[tuple[bytes, tuple[int, ...], str], mx.array] = OrderedDict()

    def get(self, host: np.ndarray) -> mx.array:
        if host.nbytes > self.largest:
            return mx.array(host)
        key = host.tobytes(), host.shape, host.dtype.str
        if (found := self.arrays.get(key)) is not None:
            self.arrays.move_to_end(key)
            return found
        self.arrays[key] = array = mx.array(host)
        if len(self.arrays) > self.entries:
            self.arrays.popitem(last=False)
        return array

    def clear(self) -> None:
        """After a fault: what the device holds is not to be trusted."""
        self.arrays.clear()


RESIDENT = Resident(entries=128, largest=32 << 10)


@mx.compile
def _apply(logits: mx.array, bits: mx.array, index: mx.array) -> mx.array:
    """Unpacked by shifting each word by 0..31, not by gathering a word per id: with a
    fresh mask each step the gather cost the H200 1.7 ms a step (1B, batch of 32), the
    shift nothing measurable in the same run (docs/benchmarks.md). A vocabulary of whole
    words is masked in its words' shape, one fused operation."""
    bits = bits[index]
    rows, words = bits.shape
    allowed = (bits[:, :, None] >> mx.arange(32, dtype=mx.uint32)) & 1
    if 32 * words == logits.shape[-1]:
        return mx.where(allowed > 0, logits.reshape(rows, words, 32), -mx.inf).reshape(logits.shape)
    allowed = allowed.reshape(rows, 32 * words)[:, : logits.shape[-1]]
    return mx.where(allowed.reshape(logits.shape) > 0, logits, -mx.inf)


class Grammars:
    """The worker's compiler: one llguidance tokenizer (about a second to build, so built
    at the first request that needs it) and the last grammars compiled."""

    def __init__(self, hf_tokenizer: Any, eos: list[int]) -> None:
        self.hf_tokenizer = hf_tokenizer
        self.eos = eos
        self._compiled = functools.lru_cache(maxsize=COMPILED)(self._compile)
        self.executor = llguidance.LLExecutor()

    @functools.cached_property
    def tokenizer(self) -> llguidance.LLTokenizer:
        return llguidance.hf.from_tokenizer(self.hf_tokenizer, eos_token=self.eos)

    def start(self, grammar: str, tokens: list[int]) -> Grammar:
        """A grammar at the answer's start, fed the tokens the answer has already (after a
        resume). ValueError: the grammar does not compile (the request's 400)."""
        matcher = self._compiled(grammar).deep_copy()
        if not matcher.consume_tokens(tokens) and tokens:
            raise ValueError(f"the answer so far does not match: {matcher.get_error()}")
        return Grammar(matcher, self.tokenizer.vocab_size, self.eos[0])

    def _compile(self, grammar: str) -> llguidance.LLMatcher:
        matcher = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        return matcher


class Drafted:
    """A verify step's masks for its rows under a grammar (batch.py's `Shaper`).

    A row's position j is masked as its grammar allows after the token the row feeds and
    its first j drafts, so each sample is the one a step at a time would draw. A draft the
    grammar forbids is cut, with those after it: the row's sample there cannot be it. Once
    the step knows what each row kept, each grammar forgets the drafts it was fed and the
    row did not keep, and is where a plain step would have left it.
    """

    def __init__(self, rows: list[tuple[int, Any]]) -> None:
        self.rows = rows  # (row, processor) of each member under a grammar
        self.fed: dict[int, int] = {}  # row -> tokens its grammar was fed this step

    def mask(self, logits: mx.array, fed: mx.array, drafts: list[list[int]]) -> mx.array:
        rows, width, vocab = logits.shape
        words = self.rows[0][1].grammar.words.shape[1]
        bits = np.full((rows * width, words), -1, np.int32)
        free = np.ones(rows * width, np.bool_)
        tokens = fed.tolist()
        for i, processor in self.rows:
            grammar = processor.grammar
            given = [tokens[i], *drafts[i]]
            allowed = max(grammar.matcher.validate_tokens(given), 1)
            del drafts[i][allowed - 1 :]
            self.fed[i] = allowed
            for j, token in enumerate(given[:allowed]):
                grammar.accept(token)  # refused (only the fed token can be): EOS alone
                fill_next_token_bitmask(grammar.matcher, bits, i * width + j)
                grammar.check(bits[i * width + j])
                free[i * width + j] = False
        flat = logits.reshape(rows * width, vocab)
        return _masked(flat, *_prepared(bits, free)).reshape(logits.shape)

    def settle(self, kept: list[int]) -> None:
        """Each row kept its fed token and `kept[row]` drafts."""
        for i, processor in self.rows:
            processor.grammar.matcher.rollback(self.fed[i] - 1 - kept[i])

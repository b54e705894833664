"""Grammar-constrained decoding with llguidance: the tokens a grammar allows next, as a mask.

llguidance (Microsoft's, the engine behind OpenAI-style structured outputs in several
servers) compiles a JSON schema or a Lark grammar lazily and computes a mask over the
whole vocabulary in tens of microseconds. It has no dependencies and covers most of JSON
Schema; xgrammar needs torch and triton; outlines-core builds a whole automaton per schema
up front (`python -m bench.grammars` compares them). Its MLX helper is a Metal kernel, so
the mask is applied here with plain MLX operations that run on every device.
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import llguidance
import llguidance.hf
import mlx.core as mx
import numpy as np
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

COMPILED = 64  # grammars kept compiled: a client repeats its schema
PROBE = 64  # steps between tries of the mask thread while the device is the bottleneck
SMOOTH = 1 / 8  # weight of a step's wait in the average: one slow step does not decide
SWITCH = sys.getswitchinterval()
SWITCH_ARMED = 0.0002  # seconds the batch's thread holds the GIL while a mask thread waits
ALONE = np.zeros(1, np.bool_)  # one row, under a grammar


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

    def mask(self, logits: mx.array) -> mx.array:
        """The next token's mask, computed and applied here (alone; `BatchStep` masks a
        batch's rows together)."""
        fill_next_token_bitmask(self.matcher, self.words)
        self.check(self.words[0])
        return _masked(logits, self.words, ALONE)

    def check(self, words: np.ndarray) -> None:
        """In an error state (a token the grammar refused, which llguidance reports rather
        than raises) only EOS is allowed: the answer ends."""
        if self.matcher.is_error():
            words[:] = 0
            words.view(np.uint32)[self.eos // 32] = 1 << self.eos % 32


@dataclass(eq=False)
class Armed:
    """A batch step's grammar rows: the tokens it feeds (still on the device), each row's
    processor, and its masks once started."""

    tokens: mx.array
    rows: list[tuple[int, Any]]  # (row, processor) of each member under a grammar
    size: int  # rows in the batch
    masks: Future[np.ndarray] | None = None
    refused: list[tuple[int, Grammar]] = field(default_factory=list)  # fed a token it forbids


class BatchStep:
    """A batch step's grammar masks, applied to the whole batch's logits at once.

    The engine arms it before each step with the tokens the step feeds, still on the
    device. At a batch of 1B-model size the step is bound by the CPU (building the model
    call), so the masks are computed on a thread meanwhile: `arm` reads the tokens (the
    step that drew them is done or nearly), feeds each grammar, and starts every mask on
    llguidance's threads, which release the GIL; the batch's model call (`Masked`) then
    takes the masks and masks the logits in one operation. When the device is the
    bottleneck instead, reading the tokens before building the call would leave it idle
    for the build: once that wait (on average) outgrows what the masks cost, they are read
    and computed after the build (`late`), trying the thread again every `PROBE` steps.
    """

    def __init__(self, executor: llguidance.LLExecutor) -> None:
        self.executor = executor
        self.thread = ThreadPoolExecutor(1, thread_name_prefix="grammar")
        self.bits = np.empty((0, 0), np.int32)  # reused: a fresh buffer each step faults
        self.armed: Armed | None = None
        self.late = 0  # steps computed after the build since the thread last paid off
        self.cost = math.inf  # seconds the last masks took to feed and compute
        self.wait = 0.0  # seconds reading a step's tokens waits, on average (thread path)

    def arm(self, tokens: mx.array, rows: list[tuple[int, Any]], size: int, behind: bool) -> None:
        """`behind`: the device has work queued after these tokens (a prompt's chunk), which
        reading them may wait for: the masks wait until the model call is built."""
        self.disarm()
        self.armed = Armed(tokens, rows, size)
        if behind:
            return
        if self.late % PROBE == 0:
            waited = self._start(self.armed, threaded=True)
            self.wait += (waited - self.wait) * SMOOTH if self.late == 0 else waited - self.wait
            self.late = 1 if self.wait > self.cost else 0
        else:
            self.late += 1

    def disarm(self) -> None:
        """Forget an armed step whose model call did not come (a fault): its masks are
        finished first, so no thread still feeds a grammar."""
        if self.armed is not None and self.armed.masks is not None:
            with contextlib.suppress(Exception):
                self.armed.masks.result()
            sys.setswitchinterval(SWITCH)
        self.armed = None

    def apply(self, logits: mx.array) -> mx.array:
        """`logits` of a model call; masked if it is the armed step's (size, 1, vocab)."""
        armed = self.armed
        if armed is None or logits.shape[:2] != (armed.size, 1):
            return logits
        if armed.masks is None:
            self._start(armed, threaded=False)
        assert armed.masks is not None
        bits = armed.masks.result()
        self.armed = None
        sys.setswitchinterval(SWITCH)
        for i, grammar in armed.refused:
            grammar.check(bits[i])
        free = np.ones(armed.size, np.bool_)
        free[[i for i, _ in armed.rows]] = False
        return _masked(logits, bits, free)

    def _start(self, armed: Armed, threaded: bool) -> float:
        """Read the step's tokens (returns how long that waited), feed each grammar, and
        compute the masks on the thread or here."""
        start = time.perf_counter()
        fed = armed.tokens.tolist()
        read = time.perf_counter()
        width = armed.rows[0][1].grammar.words.shape[1]
        if self.bits.shape != (armed.size, width):
            self.bits = np.empty((armed.size, width), np.int32)
        self.bits.fill(-1)  # rows without a grammar: every token allowed
        matchers = []
        for i, processor in armed.rows:
            if not processor.give(fed[i]):
                armed.refused.append((i, processor.grammar))
            matchers.append((processor.grammar.matcher, i))
        fill = functools.partial(self._fill, matchers, self.bits, time.perf_counter() - read)
        if threaded:
            sys.setswitchinterval(SWITCH_ARMED)  # the thread returns without waiting 5 ms
            armed.masks = self.thread.submit(fill)
        else:
            armed.masks = Future()
            armed.masks.set_result(fill())
        return read - start

    def _fill(
        self, matchers: list[tuple[llguidance.LLMatcher, int]], bits: np.ndarray, fed: float
    ) -> np.ndarray:
        """`fed`: seconds feeding the grammars took; with the masks', what `late` saves."""
        start = time.perf_counter()
        self.executor.unsafe_compute_mask_ptr(
            matchers, bits.ctypes.data, bits.shape[1] * 4, bits.shape[0]
        )
        self.cost = fed + time.perf_counter() - start
        return bits


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


def _masked(logits: mx.array, bits: np.ndarray, free: np.ndarray) -> mx.array:
    """Each row of `logits` (rows, [1,] vocab) masked by its row of `bits`; the ids past the
    tokenizer's vocabulary (padding rows of the embedding) only in `free` rows."""
    word, bit, inside = _positions(logits.shape[-1], bits.shape[1])
    return _apply(logits, mx.array(bits.view(np.uint32)), mx.array(free), word, bit, inside)


@functools.lru_cache(maxsize=4)
def _positions(vocab: int, words: int) -> tuple[mx.array, mx.array, mx.array]:
    """Each logit's word in a bitmask, its bit there, and whether the bitmask covers it."""
    ids = np.arange(vocab)
    word = np.minimum(ids // 32, words - 1)
    return mx.array(word), mx.array((ids % 32).astype(np.uint32)), mx.array(ids < words * 32)


@mx.compile
def _apply(
    logits: mx.array,
    bits: mx.array,
    free: mx.array,
    word: mx.array,
    bit: mx.array,
    inside: mx.array,
) -> mx.array:
    allowed = ((mx.take(bits, word, axis=-1) >> bit) & 1) > 0
    allowed = mx.where(inside, allowed, free[:, None])
    return mx.where(allowed.reshape(logits.shape), logits, -mx.inf)


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

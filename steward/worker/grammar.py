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
import statistics
import sys
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import llguidance
import llguidance.hf
import mlx.core as mx
import numpy as np
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

COMPILED = 64  # grammars kept compiled: a client repeats its schema
PROBE = 64  # steps between tries of the path not taken
TRIES = 4  # steps each try takes, and the steps whose median stands for a path
SWITCH = sys.getswitchinterval()
SWITCH_ARMED = 0.0002  # seconds the batch's thread holds the GIL while a mask thread waits
ALONE = np.zeros(1, np.bool_)  # one row, under a grammar
FIRST = np.zeros(1, np.uint32)  # its index among the distinct masks
Masks = tuple[np.ndarray, np.ndarray, np.ndarray]  # `_prepared`'s: rows, index, free rows


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
        return _masked(logits, self.words, FIRST, ALONE)

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
    masks: Future[Masks] | None = None
    refused: list[tuple[int, Grammar]] = field(default_factory=list)  # fed a token it forbids

    @property
    def free(self) -> np.ndarray:
        """The rows without a grammar."""
        free = np.ones(self.size, np.bool_)
        free[[i for i, _ in self.rows]] = False
        return free


class BatchStep:
    """A batch step's grammar masks, applied to the whole batch's logits at once.

    The engine arms it before each step with the tokens the step feeds, still on the
    device. At a batch of 1B-model size the step is bound by the CPU (building the model
    call), so the masks are computed on a thread meanwhile: `arm` reads the tokens (the
    step that drew them is done or nearly), feeds each grammar, and starts every mask on
    llguidance's threads, which release the GIL; the batch's model call (`Masked`) then
    takes the masks and masks the logits in one operation. The other path reads the tokens
    and computes the masks after the build (`late`): it leaves the device busy while the
    call is built, which wins when the device is the bottleneck (a large model), and it
    wakes no thread, which wins on a host where that costs (in four runs on the H200's
    virtual machine the thread path measured 0.60 to 0.97 of an unmasked step, late 0.79 to
    0.82, and how long reading the tokens waited did not tell which would win). So each
    path's own steps are timed (from one arm to the next, at an unchanged batch size) and
    the path whose last `TRIES` steps took less, by their median, is taken, with the other
    tried `TRIES` steps in every `PROBE`.
    """

    def __init__(self, executor: llguidance.LLExecutor) -> None:
        self.executor = executor
        self.thread = ThreadPoolExecutor(1, thread_name_prefix="grammar")
        self.bits = np.empty((0, 0), np.int32)  # reused: a fresh buffer each step faults
        self.armed: Armed | None = None
        self.fixed: bool | None = None  # the path every step takes (benches, tests)
        self.spent: dict[bool, deque[float]] = {  # each path's last steps (threaded?), seconds
            path: deque(maxlen=TRIES) for path in (True, False)
        }
        self.steps = 0
        self.last: tuple[float, int, bool] | None = None  # (when, size, threaded): to be timed

    def arm(self, tokens: mx.array, rows: list[tuple[int, Any]], size: int, behind: bool) -> None:
        """`behind`: the device has work queued after these tokens (a prompt's chunk), which
        reading them may wait for: the masks wait until the model call is built."""
        now = time.perf_counter()
        if self.last is not None and not behind:  # the last step, timed
            when, before, threaded = self.last
            if before == size:
                self.spent[threaded].append(now - when)
            else:  # another batch: the times before do not compare
                for times in self.spent.values():
                    times.clear()
        self.disarm()
        self.armed = Armed(tokens, rows, size)
        if not behind:
            threaded = self._threaded()
            self.last = (now, size, threaded)
            if threaded:
                self._start(self.armed, threaded=True)

    def disarm(self) -> None:
        """Forget an armed step whose model call did not come (a fault), or the last one
        when this step has no grammar (its time, too: the next step's is not its path's).
        Its masks are finished first, so no thread still feeds a grammar."""
        if self.armed is not None and self.armed.masks is not None:
            with contextlib.suppress(Exception):
                self.armed.masks.result()
            sys.setswitchinterval(SWITCH)
        self.armed = None
        self.last = None

    def _threaded(self) -> bool:
        """The path of this step: the faster so far, or, `TRIES` steps in `PROBE`, the other
        (an untried path counts as the faster)."""
        if self.fixed is not None:
            return self.fixed
        self.steps += 1
        took = {
            path: statistics.median(times) if times else 0.0 for path, times in self.spent.items()
        }
        return (took[True] <= took[False]) != (self.steps % PROBE < TRIES)

    def apply(self, logits: mx.array) -> mx.array:
        """`logits` of a model call; masked if it is the armed step's (size, 1, vocab)."""
        armed = self.armed
        if armed is None or logits.shape[:2] != (armed.size, 1):
            return logits
        if armed.masks is None:
            self._start(armed, threaded=False)
        assert armed.masks is not None
        masks = armed.masks.result()
        self.armed = None
        sys.setswitchinterval(SWITCH)
        return _masked(logits, *masks)

    def _start(self, armed: Armed, threaded: bool) -> None:
        """Read the step's tokens, feed each grammar, and compute the masks on the thread or
        here."""
        fed = armed.tokens.tolist()
        width = armed.rows[0][1].grammar.words.shape[1]
        if self.bits.shape != (armed.size, width):
            self.bits = np.empty((armed.size, width), np.int32)
        self.bits.fill(-1)  # rows without a grammar: every token allowed
        matchers = []
        for i, processor in armed.rows:
            if not processor.give(fed[i]):
                armed.refused.append((i, processor.grammar))
            matchers.append((processor.grammar.matcher, i))
        fill = functools.partial(self._fill, armed, matchers, self.bits)
        if threaded:
            sys.setswitchinterval(SWITCH_ARMED)  # the thread returns without waiting 5 ms
            armed.masks = self.thread.submit(fill)
        else:
            armed.masks = Future()
            armed.masks.set_result(fill())

    def _fill(
        self, armed: Armed, matchers: list[tuple[llguidance.LLMatcher, int]], bits: np.ndarray
    ) -> Masks:
        """The step's masks, as `_prepared` gives them; a row fed a token its grammar
        refused allows only EOS."""
        self.executor.unsafe_compute_mask_ptr(
            matchers, bits.ctypes.data, bits.shape[1] * 4, bits.shape[0]
        )
        for i, grammar in armed.refused:
            grammar.check(bits[i])
        return _prepared(bits, armed.free)


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
    return _apply(logits, mx.array(bits.view(np.uint32)), mx.array(index))


@mx.compile
def _apply(logits: mx.array, bits: mx.array, index: mx.array) -> mx.array:
    """Unpacked by shifting each word by 0..31, not by gathering a word per id: with a
    fresh mask each step the gather cost the H200 1.7 ms a step (1B, batch of 32), the
    shift nothing measurable in the same run (docs/benchmarks.md)."""
    bits = bits[index]
    rows, words = bits.shape
    allowed = (bits[:, :, None] >> mx.arange(32, dtype=mx.uint32)) & 1
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

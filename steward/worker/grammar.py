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
from typing import Any

import llguidance
import llguidance.hf
import mlx.core as mx
import numpy as np
from llguidance.numpy import (
    allocate_token_bitmask,
    fill_next_token_bitmask,
    fill_next_token_bitmask_par,
)

COMPILED = 64  # grammars kept compiled: a client repeats its schema


class Grammar:
    """One answer's grammar state: fed each token the answer gets, it masks the logits of
    the next."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab: int, eos: int) -> None:
        self.matcher = matcher
        self.eos = eos
        self.words = allocate_token_bitmask(1, vocab)  # what the next token may be
        self.padded = np.zeros((1, self.words.shape[1] + 1), np.int32)  # and past the vocab

    def accept(self, token: int) -> None:
        self.matcher.consume_token(token)

    def mask(self, logits: mx.array) -> mx.array:
        """The next token's mask, computed and applied here (alone; `BatchStep` masks a
        batch's rows together)."""
        fill_next_token_bitmask(self.matcher, self.words)
        self.check(self.words[0])
        self.padded[:, :-1] = self.words
        return _masked(logits, self.padded)

    def check(self, words: np.ndarray) -> None:
        """In an error state (a token the grammar refused, which llguidance reports rather
        than raises) only EOS is allowed: the answer ends."""
        if self.matcher.is_error():
            words[:] = 0
            words.view(np.uint32)[self.eos // 32] = 1 << self.eos % 32


class BatchStep:
    """A batch step's grammar masks, applied to the whole batch's logits at once.

    The engine arms it before the step with the tokens the step feeds (still on the
    device) and the rows under a grammar. The batch's model call (`Masked`) then reads
    those tokens (one read for the batch), feeds each grammar, computes every mask on
    llguidance's threads, and masks the logits in one operation: nothing is done row by
    row on the device.
    """

    def __init__(self, executor: llguidance.LLExecutor) -> None:
        self.executor = executor
        self.pending: tuple[mx.array, list[tuple[int, Any]], int] | None = None

    def arm(self, tokens: mx.array, rows: list[tuple[int, Any]], size: int) -> None:
        """`rows`: (row, processor) of each member under a grammar, of `size` rows."""
        self.pending = (tokens, rows, size)

    def apply(self, logits: mx.array) -> mx.array:
        """`logits` of a model call; masked if it is the armed step's (size, 1, vocab)."""
        if self.pending is None or logits.shape[:2] != (self.pending[2], 1):
            return logits
        tokens, rows, size = self.pending
        self.pending = None
        fed = tokens.tolist()
        grammars = []
        for i, processor in rows:
            processor.give(fed[i])
            grammars.append(processor.grammar)
        bits = allocate_token_bitmask(len(rows), grammars[0].words.shape[1] * 32)
        fill_next_token_bitmask_par(
            self.executor, [(g.matcher, k) for k, g in enumerate(grammars)], bits
        )
        words = np.full((size, bits.shape[1] + 1), -1, np.int32)  # free rows: all allowed
        for k, ((i, _), grammar) in enumerate(zip(rows, grammars, strict=True)):
            grammar.check(bits[k])
            words[i, :-1], words[i, -1] = bits[k], 0
        return _masked(logits, words)


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


def _masked(logits: mx.array, words: np.ndarray) -> mx.array:
    """Each row of `logits` (rows, [1,] vocab) masked by its bitmask row of `words`,
    whose last word stands for the ids past the tokenizer's vocabulary (padding rows of the
    embedding: 0 where a grammar applies)."""
    word, bit = _positions(logits.shape[-1], words.shape[1] - 1)
    return _apply(logits, mx.array(words.view(np.uint32)), word, bit)


@functools.lru_cache(maxsize=4)
def _positions(vocab: int, words: int) -> tuple[mx.array, mx.array]:
    """Each logit's word in a padded bitmask and its bit there."""
    ids = np.arange(vocab)
    return mx.array(np.minimum(ids // 32, words)), mx.array((ids % 32).astype(np.uint32))


@mx.compile
def _apply(logits: mx.array, words: mx.array, word: mx.array, bit: mx.array) -> mx.array:
    allowed = ((mx.take(words, word, axis=-1) >> bit) & 1) > 0
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

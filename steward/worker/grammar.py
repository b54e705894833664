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
        self.allowed: mx.array | None = None  # the same, on the device

    def accept(self, token: int) -> None:
        self.matcher.consume_token(token)

    def fill(self) -> None:
        """The mask for the next token, computed here (alone; `fill_all` for a batch)."""
        fill_next_token_bitmask(self.matcher, self.words)
        self._check(self.words[0])
        self.allowed = mx.array(self.words[0].view(np.uint32))

    def _check(self, words: np.ndarray) -> None:
        """In an error state (a token the grammar refused, which llguidance reports rather
        than raises) only EOS is allowed: the answer ends."""
        if self.matcher.is_error():
            words[:] = 0
            words.view(np.uint32)[self.eos // 32] = 1 << self.eos % 32

    def mask(self, logits: mx.array) -> mx.array:
        assert self.allowed is not None
        word, bit, inside = _positions(logits.shape[-1], self.allowed.size)
        return _masked(logits, self.allowed, word, bit, inside)


def fill_all(grammars: list[Grammar], executor: llguidance.LLExecutor) -> None:
    """Every member's mask for the next step, computed in parallel (llguidance's threads,
    without the GIL) and moved to the device in one array."""
    bits = allocate_token_bitmask(len(grammars), grammars[0].words.shape[1] * 32)
    fill_next_token_bitmask_par(executor, [(g.matcher, i) for i, g in enumerate(grammars)], bits)
    for grammar, words in zip(grammars, bits, strict=True):
        grammar._check(words)
    allowed = mx.array(bits.view(np.uint32))
    for i, grammar in enumerate(grammars):
        grammar.allowed = allowed[i]


class BatchStep:
    """The grammar rows of the coming batch step. The engine arms it with the tokens the
    step feeds, still on the device; the first constrained row's processor queues the
    forward pass, then reads those tokens (one wait, for the previous step only), feeds
    every row and computes their masks while the device runs the forward pass."""

    def __init__(self, executor: llguidance.LLExecutor) -> None:
        self.executor = executor
        self.pending: tuple[mx.array, list[tuple[int, Any]]] | None = None

    def arm(self, tokens: mx.array, rows: list[tuple[int, Any]]) -> None:
        """`rows`: (row, processor) of every member under a grammar."""
        self.pending = (tokens, rows)

    def ready(self, logits: mx.array) -> None:
        if self.pending is None:
            return
        tokens, rows = self.pending
        self.pending = None
        mx.async_eval(logits)
        fed = tokens.tolist()
        for i, processor in rows:
            processor.give(fed[i])
        fill_all([processor.grammar for _, processor in rows], self.executor)


@functools.lru_cache(maxsize=4)
def _positions(vocab: int, words: int) -> tuple[mx.array, mx.array, mx.array]:
    """Each logit's word in the bitmask, its bit there, and whether the tokenizer has it
    (logits past its vocabulary are padding rows of the embedding: never allowed)."""
    ids = np.arange(vocab)
    word = np.minimum(ids // 32, words - 1)
    return mx.array(word), mx.array((ids % 32).astype(np.uint32)), mx.array(ids < words * 32)


@mx.compile
def _masked(
    logits: mx.array, words: mx.array, word: mx.array, bit: mx.array, inside: mx.array
) -> mx.array:
    allowed = (((words[word] >> bit) & 1) > 0) & inside
    return mx.where(allowed, logits, -mx.inf).astype(logits.dtype)


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

"""mlx-lm's batch through its adapter (batch.py), on the tiny model: a row's length is the
tokens its cache holds, and trimming one row drops its last tokens as a single sequence's
cache would, leaving the other rows as they were."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def backend(tiny_model: Path):
    from steward.worker.backend import Backend
    from steward.worker.injection import Injector

    return Backend(tiny_model, Injector([], 1))


def decoding(backend, prompts: list[str], steps: int):
    """A batch whose rows (one per prompt) have decoded `steps` tokens together."""
    from mlx_lm.sample_utils import greedy_sampler

    from steward.worker.batch import Batch

    batch = Batch(backend.model, set(backend.tokenizer.eos_token_ids), 8)
    uids = [
        batch.insert(
            rest=backend.tokenizer.encode(prompt),
            held=[],
            cache=None,
            sampler=greedy_sampler,
            processors=[],
            max_tokens=100,
        )
        for prompt in prompts
    ]
    while batch.decoding < len(prompts):
        batch.next()
    for _ in range(steps):
        batch.next()
    return batch, uids


def keys(cache) -> list:
    """Each layer's keys and values over the tokens the cache holds."""
    import mlx.core as mx

    out = []
    for layer in cache:
        held = (layer.keys[..., : layer.offset, :], layer.values[..., : layer.offset, :])
        mx.eval(*held)
        out.append(held)
    return out


def same(a, b) -> bool:
    import mlx.core as mx

    return len(a) == len(b) and all(
        mx.array_equal(ka, kb).item() and mx.array_equal(va, vb).item()
        for (ka, va), (kb, vb) in zip(a, b, strict=True)
    )


def test_a_rows_length_is_what_its_cache_holds(backend) -> None:
    batch, (short, long) = decoding(backend, ["Hi", "A longer prompt than the other"], 3)
    for uid in (short, long):
        cache, tokens = batch.cache(uid)
        assert batch.length(uid) == len(tokens) == cache[0].offset
    assert batch.length(long) > batch.length(short)
    with pytest.raises(KeyError):
        batch.length(99)


def test_trimming_a_row_drops_its_last_tokens_and_leaves_the_others(backend) -> None:
    from mlx_lm.models.cache import trim_prompt_cache

    batch, (first, second) = decoding(backend, ["Once upon a time", "In the beginning"], 4)
    assert batch.can_trim()
    (cache, tokens), (other, other_tokens) = batch.cache(first), batch.cache(second)
    trim_prompt_cache(cache, 3)
    batch.trim(first, 3)
    trimmed, held = batch.cache(first)
    assert held == tokens[:-3] and batch.length(first) == len(tokens) - 3
    assert same(keys(trimmed), keys(cache))
    untouched, untouched_tokens = batch.cache(second)
    assert untouched_tokens == other_tokens and same(keys(untouched), keys(other))
    with pytest.raises(ValueError):
        batch.trim(first, len(held) + 1)

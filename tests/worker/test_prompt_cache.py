"""The prompt cache in memory: the entry mlx-lm's would pick, handed out as views that later
writes do not reach, found without per-token objects or a walk per node, and bounded."""

from __future__ import annotations

import gc
import time

import mlx.core as mx
from mlx_lm.models.cache import KVCache, LRUPromptCache, RotatingKVCache

from steward.worker.prompt_cache import PromptCache


def layer(tokens: int, salt: float = 0.0) -> KVCache:
    """A layer's cache whose token i holds i + salt."""
    cache = KVCache()
    rows = (mx.arange(tokens, dtype=mx.float32) + salt).reshape(1, 1, tokens, 1)
    cache.update_and_fetch(rows, rows + 0.5)
    return cache


def stored(tokens: list[int]) -> list[KVCache]:
    return [layer(len(tokens)), layer(len(tokens), 100.0)]


def test_a_longer_entry_gives_a_view_of_the_shared_prefix_that_writes_do_not_reach() -> None:
    cache = PromptCache(8, 1 << 30)
    entry = [5, 6, 7, 8, 9, 10]
    cache.insert(entry, stored(entry))
    (kept,) = cache.entries.values()
    before = [mx.array(c.keys) for c in kept.layers]
    got, rest = cache.fetch([5, 6, 7, 1, 2])
    assert rest == [1, 2]
    assert [c.offset for c in got] == [3, 3]
    assert got[0].keys.reshape(-1).tolist() == [0.0, 1.0, 2.0]
    assert got[1].values.reshape(-1).tolist() == [100.5, 101.5, 102.5]
    new = mx.full((1, 1, 2, 1), -1.0)
    for c in got:  # the request's own prefill writes after the prefix
        c.update_and_fetch(new, new)
    assert got[0].keys[..., :5, :].reshape(-1).tolist() == [0.0, 1.0, 2.0, -1.0, -1.0]
    assert all(mx.array_equal(a.keys, b) for a, b in zip(kept.layers, before, strict=True))
    assert [c.offset for c in kept.layers] == [6, 6]


def test_the_entry_held_and_the_tokens_left_are_mlx_lms() -> None:
    ours, theirs = PromptCache(8, 1 << 30), LRUPromptCache(8, 1 << 30)
    for entry in ([1, 2, 3], [1, 2, 3, 4, 5], [9, 9, 9, 9], [4, 4, 4]):
        ours.insert(entry, stored(entry))
        theirs.insert_cache("model", entry, stored(entry), cache_type="user")
    asked = ([1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 6, 7], [9, 9, 1], [1, 2, 3, 4], [7], [4, 4, 4, 4])
    for tokens in asked:
        got, rest = ours.fetch(tokens)
        want, want_rest = theirs.fetch_nearest_cache("model", tokens)
        assert rest == want_rest, tokens
        if want is None:
            assert got is None
            continue
        assert [c.offset for c in got] == [c.offset for c in want], tokens
        for a, b in zip(got, want, strict=True):
            assert a.keys[..., : a.offset, :].tolist() == b.keys[..., : b.offset, :].tolist()


def test_long_entries_are_found_at_once_and_make_no_object_per_token() -> None:
    """mlx-lm's trie: a dict per token (the garbage collector walks them all), and 0.5 s
    to find an entry that extends a template's few tokens among three of 13k on this CPU."""
    cache = PromptCache(8, 1 << 40)
    gc.collect()
    objects = len(gc.get_objects())
    for j in range(3):
        entry = [1, 2, 3, *range(10_000 * (j + 1), 10_000 * (j + 1) + 13_000)]
        cache.insert(entry, [layer(len(entry))])
    assert len(gc.get_objects()) - objects < 1_000
    started = time.perf_counter()
    got, rest = cache.fetch([1, 2, 3, 7, 7])
    assert time.perf_counter() - started < 0.1
    assert (got[0].offset, rest) == (3, [7, 7])


def test_the_bounds_hold_and_a_prefix_entry_gives_way_to_the_one_extending_it() -> None:
    entry_bytes = sum(c.nbytes for c in stored([1, 2]))
    cache = PromptCache(3, 3 * entry_bytes)
    for i in range(5):
        cache.insert([i, i], stored([i, i]))
    assert [e.tokens.tolist() for e in cache.entries.values()] == [[2, 2], [3, 3], [4, 4]]
    cache.fetch([2, 2, 9])  # used: now the most recent
    cache.insert([5, 5], stored([5, 5]))
    assert [e.tokens.tolist() for e in cache.entries.values()] == [[4, 4], [2, 2], [5, 5]]
    cache.insert([4, 4, 4, 4], stored([4, 4, 4, 4]))  # [4, 4] is its prefix: redundant
    assert [e.tokens.tolist() for e in cache.entries.values()] == [[2, 2], [5, 5], [4, 4, 4, 4]]
    assert cache.nbytes == sum(e.nbytes for e in cache.entries.values()) <= cache.max_bytes


def test_caches_that_cannot_be_viewed_serve_whole_as_copies() -> None:
    cache = PromptCache(8, 1 << 30)
    rotating = RotatingKVCache(max_size=16)
    rows = mx.ones((1, 1, 4, 1))
    rotating.update_and_fetch(rows, rows)
    cache.insert([1, 2, 3, 4], [rotating])
    got, rest = cache.fetch([1, 2, 3, 4, 5])
    assert rest == [5]
    assert type(got[0]) is RotatingKVCache and got[0] is not rotating
    assert cache.fetch([1, 2, 9]) == (None, [1, 2, 9])  # only a view could cut it


def test_views_handed_back_unchanged_are_not_kept_again() -> None:
    """A request that left before it computed anything hands back the views it was lent:
    kept, they would hold the entry's whole arrays while counting only their part."""
    cache = PromptCache(8, 1 << 30)
    entry = list(range(100))
    cache.insert(entry, stored(entry))
    cache.insert([7, 7], stored([7, 7]))
    lent, _ = cache.fetch([*range(40), 5])
    cache.insert(list(range(40)), lent)
    assert [e.tokens.tolist()[:3] for e in cache.entries.values()] == [[7, 7], [0, 1, 2]]
    assert cache.nbytes == sum(e.nbytes for e in cache.entries.values())


def test_an_entry_over_the_bound_alone_leaves_the_others_in_place() -> None:
    small = sum(c.nbytes for c in stored([1, 2]))  # a KV cache's first 256-token block
    cache = PromptCache(8, 3 * small)
    cache.insert([1, 2], stored([1, 2]))
    cache.insert([3, 4], stored([3, 4]))
    big = list(range(1000))  # four blocks
    cache.insert(big, stored(big))
    assert [e.tokens.tolist() for e in cache.entries.values()] == [[1, 2], [3, 4]]

"""The prompt cache in memory: the KV of recent prompts and answers, least recently used
first out, bounded in bytes and in entries.

mlx-lm's `LRUPromptCache` cost an agent's load most of a second per request on an H200
host (bench/agents.py), in three ways: its trie holds a Python dict per token, so a few
13k-token entries are hundreds of thousands of objects that every full garbage collection
walks (one insert took 200-300 ms of the worker's loop); finding an entry that extends a
prefix copies the path at every node of the branch, quadratic in the entry's length; and
the entry found is deep-copied whole, then trimmed to the handful of chat-template tokens
a new prompt shares with it. Here each entry's tokens are one numpy array, the entry
sharing the longest prefix is found by comparing them in C, and it is handed out as views
of its arrays: MLX arrays are values, so nothing written through a view reaches the entry
(a cache that grows concatenates a new array), and the batch copies what it is given into
its own buffers anyway.

An entry is computed as it is stored (asynchronously): what a batch hands over for a member
that leaves is a lazy slice of the batch's whole KV, and an entry left lazy would keep that
alive, far over the bytes the bound counts.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.models.cache import KVCache


@dataclass(eq=False)
class Entry:
    tokens: np.ndarray
    layers: list[Any]
    nbytes: int
    viewable: bool  # plain KV caches: any prefix can be lent as views (else whole, copied)


def viewable(layers: list[Any]) -> bool:
    return all(type(layer) is KVCache and layer.keys is not None for layer in layers)


def view(cache: KVCache, tokens: int) -> KVCache:
    """A layer's cache holding its first `tokens` tokens, sharing the stored arrays."""
    held = KVCache()
    held.keys = cache.keys[..., :tokens, :]
    held.values = cache.values[..., :tokens, :]
    held.offset = tokens
    return held


def shared(a: np.ndarray, b: np.ndarray) -> int:
    """How many first tokens `a` and `b` have in common."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


class PromptCache:
    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.nbytes = 0
        self.entries: OrderedDict[bytes, Entry] = OrderedDict()  # oldest use first

    def fetch(self, tokens: list[int]) -> tuple[list[Any] | None, list[int]]:
        """The cached KV of the longest prefix of `tokens` an entry holds, and the tokens
        after it (none: the whole prompt was cached). An entry that goes on past what it
        shares serves the shared part, less the prompt's last token (its logits are the
        first answer)."""
        query = np.asarray(tokens, dtype=np.int64)
        best, best_key, held = None, b"", 0
        for key, entry in self.entries.items():
            common = shared(entry.tokens, query)
            if common < len(entry.tokens):  # the entry goes on: only views can cut it
                common = min(common, len(query) - 1) if entry.viewable else 0
            if common > held:
                best, best_key, held = entry, key, common
        if best is None:
            return None, tokens
        self.entries.move_to_end(best_key)
        if best.viewable:
            return [view(layer, held) for layer in best.layers], tokens[held:]
        return copy.deepcopy(best.layers), tokens[held:]

    def insert(self, tokens: list[int], layers: list[Any]) -> None:
        """Keep `layers` as the KV of `tokens`; entries it makes redundant (its prefixes,
        served by views of it) and the least recently used beyond the bounds leave.

        Nothing is kept that an entry already serves by views (a request that left before
        it computed anything hands back the views it was lent, which hold their entry's
        whole arrays while counting only their part), nor what alone is over the bound
        (it would push every other entry out, and then itself)."""
        entry = Entry(
            np.asarray(tokens, dtype=np.int64),
            layers,
            sum(c.nbytes for c in layers),
            viewable(layers),
        )
        if entry.nbytes > self.max_bytes:
            return
        n, redundant = len(entry.tokens), []
        for key, held in self.entries.items():
            common = shared(held.tokens, entry.tokens)
            if held.viewable and common == n:  # held goes as far: it serves these
                self.entries.move_to_end(key)
                return
            if common == len(held.tokens) and (entry.viewable or common == n):
                redundant.append(key)  # a prefix the new entry serves, or the same tokens
        arrays = tree_flatten([layer.state for layer in layers])
        mx.async_eval([a for _, a in arrays if isinstance(a, mx.array)])
        for key in redundant:
            self._drop(key)
        key = entry.tokens.tobytes()
        self.entries[key] = entry
        self.nbytes += entry.nbytes
        while self.entries and (
            len(self.entries) > self.max_entries or self.nbytes > self.max_bytes
        ):
            self._drop(next(iter(self.entries)))

    def _drop(self, key: bytes) -> None:
        entry = self.entries.pop(key, None)
        if entry is not None:
            self.nbytes -= entry.nbytes

"""The memory budget (`--memory-budget`): what a model needs, and which idle models make
room for another. Pure functions; the pool acts on them.

A model's need is its weights times `FACTOR` (KV caches and activations of a batch), plus
its prompt cache (`prompt_cache_bytes`, which it may fill), twice over with a hot spare
(a second copy). Before its first load the weights are its weight files' sizes on disk;
after a load, what its worker measured it takes. The front never imports MLX, so the
default budget is the machine's memory with `HEADROOM` left over, refined to the device's
own (its recommended working set where it has one, as Metal does) once a worker said it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from steward.model.resolve import ModelSource

FACTOR = 1.2
HEADROOM = 0.9  # share of the device's memory the default budget may take
WEIGHTS = ("*.safetensors", "*.npz", "*.gguf", "*.bin")


def machine_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def default_budget(device_bytes: int = 0) -> int:
    return int(HEADROOM * (device_bytes or machine_bytes()))


def weight_bytes(source: ModelSource) -> int:
    """The model's weights on disk: a GGUF file, or a directory's weight files."""
    if source.path.is_file():
        return source.path.stat().st_size
    return sum(p.stat().st_size for pattern in WEIGHTS for p in Path(source.path).glob(pattern))


def need(weights: int, prompt_cache_bytes: int, copies: int) -> int:
    return copies * (int(FACTOR * weights) + prompt_cache_bytes)


@dataclass(frozen=True)
class Holder:
    """A model holding memory now."""

    name: str
    need: int
    evictable: bool  # idle, serving and not pinned
    last_used: float


def room(need: int, budget: int, holders: Sequence[Holder]) -> list[str] | None:
    """The models to evict, least recently used first, so that `need` fits the budget;
    None when even evicting every evictable one leaves too little."""
    used = sum(h.need for h in holders)
    victims: list[str] = []
    for holder in sorted((h for h in holders if h.evictable), key=lambda h: h.last_used):
        if used + need <= budget:
            break
        victims.append(holder.name)
        used -= holder.need
    return victims if used + need <= budget else None


def mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"

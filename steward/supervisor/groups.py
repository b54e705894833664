"""Group testing of suspects: in which groups the members in flight at a fault run again.

Most backend faults are transient, so the members of a faulted batch first run again
together, at batch speed. The fault itself may point at some of them (`primes`: the members
whose prefill or first step it struck, while most others had already decoded): those are
tried alone, after the rest have run together, so a poison member that joined a decoding
batch costs one more fault, and the innocents never wait on it. A group that faults again
is split into parts tried one after another; only the part holding the poison faults, so
each level of the split costs one fault. A fault that spends a worker replacement is paid
from a budget of restarts, so the split is as wide as the budget left demands: with `b`
faults affordable, `n` members split `ceil(n ** (1/b))` ways find a poison member within
`b`; a fault that kept its worker costs nothing, and halving is quickest.

Pure: members are whatever the caller groups (the supervisor's jobs), in their order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def after_fault(
    suspects: Sequence[T], primes: Sequence[T], regroup: bool, affordable: int | None
) -> list[list[T]]:
    """The groups to try, in order. `regroup`: these suspects already ran again together
    after an earlier fault (this is that group faulting again). `affordable`: faults that
    may still replace a worker, None when faults cost no worker (the canary kept it)."""
    if len(suspects) <= 1:
        return [list(suspects)]
    rest = [s for s in suspects if s not in primes]
    if primes and len(primes) <= len(rest):  # a few joined at the fault: they stand out
        return [rest, *([p] for p in primes)]
    if not regroup:
        return [list(suspects)]
    return split(suspects, affordable)


def split(group: Sequence[T], affordable: int | None) -> list[list[T]]:
    """`group` in parts, as wide as the faults affordable demand (halves when free)."""
    n = len(group)
    ways = 2 if affordable is None else math.ceil(n ** (1 / max(1, affordable)) - 1e-9)
    ways = max(2, min(n, ways))
    size = math.ceil(n / ways)
    return [list(group[i : i + size]) for i in range(0, n, size)]

"""Where a second copy of a group's model is tightest: the standby's choice for a group.

A spare group holds a whole second copy, spread as the serving group's is: in each memory
that holds ranks' parts (a host's, shared by its ranks; on nccl, each rank's own GPU), one
part for each of those ranks. So two copies must fit in every one of them, and the one
where the parts take the largest share decides. A rank's part is rank 0's measure (the
parts are alike: equal shards, or runs of layers); a memory's size is what its own ranks
said in their pulses (wire/ranks.py), so a remote host's is its own, never this machine's.
"""

from __future__ import annotations

from steward.wire.protocol import Room


def tightest(part: int, ranks: list[tuple[str, int]]) -> Room:
    """The tightest host (or GPU), from `part` (what one rank's part of the model takes)
    and each rank's holder (formation.py `holder`) and its memory (0: not known, which
    counts as no room)."""
    holders: dict[str, list[int]] = {}
    for holder, memory in ranks:
        holders.setdefault(holder, []).append(memory)

    def share(holder: str) -> float:
        memory = min(holders[holder])
        return part * len(holders[holder]) / memory if memory else float("inf")

    holder = max(holders, key=share)
    count, memory = len(holders[holder]), min(holders[holder])
    where = f"on {holder} ({count} rank{'' if count == 1 else 's'})"
    if len(holders) > 1:
        where += f", the tightest of {len(holders)}"
    if not memory:
        where += ", whose memory its ranks have not said"
    return Room(part * count, memory, where)

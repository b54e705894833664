"""Where a second copy of a group's model is tightest: the standby's choice for a group.

A spare group holds a whole second copy, spread as the serving group's is: on each host,
one part for each rank there. So two copies must fit on every host that runs a rank, and
the host whose ranks' parts take the largest share of its memory decides. A rank's part is
rank 0's measure (the parts are alike: equal shards, or runs of layers); a host's memory
is what its own ranks said in their pulses (wire/ranks.py), so a remote host's is its own,
never this machine's.
"""

from __future__ import annotations

from steward.wire.protocol import Room


def tightest(part: int, ranks: list[tuple[str, int]]) -> Room:
    """The tightest host, from `part` (what one rank's part of the model takes) and each
    rank's host and device memory (0: not known, which counts as no room)."""
    hosts: dict[str, list[int]] = {}
    for host, memory in ranks:
        hosts.setdefault(host, []).append(memory)

    def share(host: str) -> float:
        memory = min(hosts[host])
        return part * len(hosts[host]) / memory if memory else float("inf")

    host = max(hosts, key=share)
    count, memory = len(hosts[host]), min(hosts[host])
    where = f"on {host} ({_counted(count, 'rank')})"
    if len(hosts) > 1:
        where += f", the tightest of {_counted(len(hosts), 'host')}"
    if not memory:
        where += ", whose memory its ranks have not said"
    return Room(part * count, memory, where)


def _counted(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"

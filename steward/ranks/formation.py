"""Forming a group: fresh ports, MLX's hostfile, each rank's place.

Every formation takes new ports: a rank of the group before, killed but not yet gone from
the kernel's tables, or a socket in TIME_WAIT, may still hold the old ones. They are chosen
free here, and never one given to a group not yet reaped (the serving group's, while a
spare group forms beside it; one whose ranks have not bound theirs yet); a remote host's
are only new, since nothing here can see what is free there.
The hostfile is the JSON `mlx.launch` writes for the ring backend: one list of `ip:port`
per rank (one per address of its host), read by MLX from the path in `MLX_HOSTFILE`.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

from steward.wire.ranks import RankPlace

LOCAL = "127.0.0.1"  # local ranks meet on the loopback
BUILT = {"any": "ring", "ring": "ring"}  # the backends a group is formed on, as MLX names them
_given: set[int] = set()  # the ports of groups not yet reaped


def fresh_ports(count: int, host: str = LOCAL) -> list[int]:
    """`count` ports free now, all different, none given to a group not yet reaped (held
    together while they are chosen)."""
    held: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < count:
            sock = socket.socket()
            held.append(sock)
            sock.bind((host, 0))
            if (port := sock.getsockname()[1]) not in _given:
                ports.append(port)
        return ports
    finally:
        for sock in held:
            sock.close()


def form(
    addresses: list[tuple[str, ...]], backend: str, folder: Path
) -> tuple[list[RankPlace], list[int]]:
    """Each rank's place in a new group (`addresses`: each rank's host's), its hostfile
    written in `folder`; and the ports given to it, until it is reaped (`release`)."""
    ports = fresh_ports(sum(len(ips) for ips in addresses))
    _given.update(ports)
    each = iter(ports)
    listed = [[f"{ip}:{next(each)}" for ip in ips] for ips in addresses]
    hostfile = folder / "hostfile.json"
    hostfile.write_text(json.dumps(listed))
    size = len(addresses)
    return [RankPlace(rank, size, BUILT[backend], str(hostfile)) for rank in range(size)], ports


def release(ports: list[int]) -> None:
    """A group's ports, once its ranks are reaped: free to be given again."""
    _given.difference_update(ports)

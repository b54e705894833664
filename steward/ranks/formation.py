"""Forming a group: fresh ports, MLX's hostfile, each rank's place.

Every formation takes new ports: a rank of the group before, killed but not yet gone from
the kernel's tables, or a socket in TIME_WAIT, may still hold the old ones. They are chosen
free here; a remote host's are only new, since nothing here can see what is free there.
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


def fresh_ports(count: int, host: str = LOCAL) -> list[int]:
    """`count` ports free now, all different (held together while they are chosen)."""
    held = [socket.socket() for _ in range(count)]
    try:
        for sock in held:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in held]
    finally:
        for sock in held:
            sock.close()


def form(addresses: list[tuple[str, ...]], backend: str, folder: Path) -> list[RankPlace]:
    """Each rank's place in a new group (`addresses`: each rank's host's), its hostfile
    written in `folder`."""
    ports = iter(fresh_ports(sum(len(ips) for ips in addresses)))
    listed = [[f"{ip}:{next(ports)}" for ip in ips] for ips in addresses]
    hostfile = folder / "hostfile.json"
    hostfile.write_text(json.dumps(listed))
    size = len(addresses)
    return [RankPlace(rank, size, BUILT[backend], str(hostfile)) for rank in range(size)]

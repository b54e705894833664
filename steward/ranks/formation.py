"""Forming a group: fresh ports, what each backend of MLX reads to join, each rank's place.

Every formation takes new ports: a rank of the group before, killed but not yet gone from
the kernel's tables, or a socket in TIME_WAIT, may still hold the old ones. They are chosen
free here, and never one given to a group not yet reaped (the serving group's, while a
spare group forms beside it; one whose ranks have not bound theirs yet); a remote host's
are only new, since nothing here can see what is free there.
What each backend reads is what `mlx.launch` gives it:
- `ring`: a JSON hostfile, one list of `ip:port` per rank (one per address of its host),
  at the path in `MLX_HOSTFILE`;
- `nccl` (CUDA GPUs): rank 0's address and a port (`NCCL_HOST_IP`, `NCCL_PORT`), the
  group's size (`MLX_WORLD_SIZE`), and each rank's own GPU (`CUDA_VISIBLE_DEVICES`: its
  place among the ranks of its host, of the GPUs the front's environment makes visible
  where it says, for the ranks here);
- `jaccl` (RDMA over Thunderbolt): a coordinator, rank 0's address and a port
  (`MLX_JACCL_COORDINATOR`), and the hostfile's RDMA devices, each host's toward each other
  (a JSON file at the path in `MLX_IBV_DEVICES`);
- `mpi`: nothing: MPI forms the group of the ranks that one `mpirun` started (mpirun.py),
  and takes no port of ours.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Sequence
from pathlib import Path

from steward.wire.ranks import HERE, Hostfile, RankHost, RankPlace

LOCAL = "127.0.0.1"  # local ranks meet on the loopback
# The backends a group is formed on, as MLX names them (`any`: the ring, which every build
# of MLX has)
BUILT = {"any": "ring", "ring": "ring", "nccl": "nccl", "jaccl": "jaccl", "mpi": "mpi"}

Pairs = tuple[tuple[str, str], ...]
_given: set[int] = set()  # the ports of groups not yet reaped


def placed(hostfile: Hostfile | None, ranks: int) -> tuple[RankHost, ...]:
    """Where each rank runs: the hostfile's hosts, or `ranks` times here."""
    if hostfile is not None:
        return hostfile.hosts
    return (RankHost(HERE, (LOCAL,)),) * ranks


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
    hosts: Sequence[RankHost], backend: str, folder: Path
) -> tuple[list[RankPlace], list[int]]:
    """Each rank's place in a new group (`hosts`: each rank's), its files to be written
    in `folder` (or the folder of whatever starts it on its host); and the ports given to
    the group, until it is reaped (`release`)."""
    name = BUILT[backend]
    env, files, ports = _joining(name, hosts)
    _given.update(ports)
    return [
        RankPlace(rank, len(hosts), name, env + _device(name, hosts, rank), files, str(folder))
        for rank in range(len(hosts))
    ], ports


def release(ports: list[int]) -> None:
    """A group's ports, once its ranks are reaped: free to be given again."""
    _given.difference_update(ports)


def _joining(backend: str, hosts: Sequence[RankHost]) -> tuple[Pairs, Pairs, list[int]]:
    """The environment and the files every rank of the group reads to join it, and the
    ports they name."""
    if backend == "mpi":
        return (), (), []
    if backend == "ring":
        ports = fresh_ports(sum(len(host.ips) for host in hosts))
        each = iter(ports)
        listed = [[f"{ip}:{next(each)}" for ip in host.ips] for host in hosts]
        return (), (("MLX_HOSTFILE", json.dumps(listed)),), ports
    coordinator, ports = hosts[0].ips[0], fresh_ports(1)
    if backend == "nccl":
        size = ("MLX_WORLD_SIZE", str(len(hosts)))
        return (("NCCL_HOST_IP", coordinator), ("NCCL_PORT", str(ports[0])), size), (), ports
    devices = json.dumps([list(host.rdma) for host in hosts])
    jaccl = (("MLX_JACCL_COORDINATOR", f"{coordinator}:{ports[0]}"),)
    return jaccl, (("MLX_IBV_DEVICES", devices),), ports


def _device(backend: str, hosts: Sequence[RankHost], rank: int) -> Pairs:
    """nccl: the GPU a rank uses, one per rank of its host."""
    if backend != "nccl":
        return ()
    on = [machine(hosts, i) for i in range(len(hosts))]
    ordinal = on[:rank].count(on[rank])
    visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")]
    if on[rank] == HERE and any(visible):
        return (("CUDA_VISIBLE_DEVICES", visible[ordinal % len(visible)]),)
    return (("CUDA_VISIBLE_DEVICES", str(ordinal)),)


def machine(hosts: Sequence[RankHost], rank: int) -> str:
    """Where a rank runs: here (rank 0, whatever its host says, and a host started without
    ssh), else its host."""
    host = hosts[rank]
    return HERE if rank == 0 or not host.remote else host.ssh


def holder(hosts: Sequence[RankHost], place: RankPlace) -> str:
    """The memory a rank's part of the model takes: its host's, shared by the host's ranks
    (a CPU's, a Mac's unified memory), or on nccl its own GPU's."""
    gpu = dict(place.env).get("CUDA_VISIBLE_DEVICES")
    where = machine(hosts, place.rank)
    return f"{where} GPU {gpu}" if gpu else where

"""A model's group of ranks (steward/ranks/), as its settings ask for one: checked before
anything starts.

The flags (`--ranks`, `--hostfile`, `--distributed-backend`, `--parallel`) set every
model's; a models file's table may set its own (pool/catalog.py). Each model's settings are
configured here once: a group that cannot be formed is a ValueError saying why (exit 78).
Its standby is any worker's (`--standby`): a spare is a whole spare group, and `auto`
decides from every host's memory once the first group has loaded (ranks/room.py).
"""

from __future__ import annotations

from dataclasses import replace

from steward.config import ServeConfig
from steward.ranks import hostfile, mpirun
from steward.ranks.formation import placed


def configure(config: ServeConfig) -> ServeConfig:
    """`config` with its group's hosts read, where it has a hostfile."""
    if config.ranks < 1:
        raise ValueError(f"--ranks {config.ranks}: must be at least 1")
    if config.hostfile:
        config = _with_hostfile(config)
    if config.ranks == 1:
        return config
    why = ""
    if config.parallel == "pipeline" and config.distributed_backend == "nccl":
        why = "--parallel pipeline needs send and recv, which the nccl backend lacks"
    elif config.distributed_backend == "mpi" and (
        unstarted := mpirun.missing(placed(config.rank_hosts, config.ranks))
    ):
        why = f"--distributed-backend mpi: {unstarted}"
    elif config.distributed_backend == "jaccl" and config.rank_hosts is None:
        why = "jaccl joins hosts over RDMA: give a --hostfile with each host's rdma devices"
    elif config.distributed_backend == "jaccl" and (
        unmeshed := hostfile.unmeshed(config.rank_hosts.hosts)
    ):
        why = f"--hostfile {config.rank_hosts.path}: {unmeshed}"
    elif config.prompt_cache_dir:
        why = "--prompt-cache-dir (the disk tier) is not built for a group"
    elif config.draft_model:
        why = "--draft-model is not built for a group"
    elif config.model_kind == "embedding":
        why = "an embedding model is not sharded over ranks"
    if why:
        raise ValueError(f"--ranks {config.ranks}: {why}")
    return config


def _with_hostfile(config: ServeConfig) -> ServeConfig:
    """The hostfile, read: one rank per host, on the backend it names unless the flag does."""
    if config.ranks != 1:
        raise ValueError("--ranks and --hostfile: give one or the other")
    hosts = hostfile.read(config.hostfile or "")
    backend = config.distributed_backend
    if hosts.backend and backend not in ("any", hosts.backend):
        raise ValueError(
            f"--distributed-backend {backend}, but --hostfile {hosts.path} says {hosts.backend}"
        )
    return replace(
        config,
        ranks=len(hosts.hosts),
        rank_hosts=hosts,
        distributed_backend=hosts.backend or backend,
    )


def here(config: ServeConfig) -> int:
    """How many of its ranks run on this machine: rank 0 always, and every other unless a
    hostfile starts it over ssh."""
    if config.rank_hosts is None:
        return config.ranks
    return 1 + sum(not host.remote for host in config.rank_hosts.hosts[1:])

"""A rank's process, started on this host: by the group for a local rank, or by the tether
(tether.py) for a rank started over ssh. Spawned here, except on the mpi backend, whose
ranks mpirun starts and which meet steward for what a spawned rank is given (mpirank.py).
The worker's code is imported there alone."""

from __future__ import annotations

import importlib
import multiprocessing
from multiprocessing.process import BaseProcess

from steward.ranks.mpirank import MpiRank
from steward.wire.ranks import RankPlace, Wiring
from steward.wire.settings import WorkerSettings

_spawn = multiprocessing.get_context("spawn")
ENTRY = "steward.worker.rank"  # its `run(place, settings, wiring)`: never imported here


def start_rank(place: RankPlace, settings: WorkerSettings, wiring: Wiring) -> BaseProcess | MpiRank:
    """The rank's process started (`spawn_rank`), or on mpi, its meeting held for it."""
    if place.backend == "mpi":
        return MpiRank(place, settings, wiring)
    return spawn_rank(place, settings, wiring)


def spawn_rank(place: RankPlace, settings: WorkerSettings, wiring: Wiring) -> BaseProcess:
    """The rank's process, started with its sockets (worker/rank.py)."""
    process = _spawn.Process(
        target=_child,
        args=(place, settings, wiring),
        name=f"steward-rank-{settings.generation}.{place.rank}",
    )
    process.daemon = True
    process.start()
    return process


def _child(place: RankPlace, settings: WorkerSettings, wiring: Wiring) -> None:
    importlib.import_module(ENTRY).run(place, settings, wiring)

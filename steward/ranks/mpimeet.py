"""What a rank that mpirun starts runs first: it comes to its meeting (mpirank.py) for its
place, its settings and its sockets, then runs as any rank does (worker/rank.py), its parent,
whose death it dies with, mpirun (or mpirun's daemon, on another host).

Run as `python -m steward.ranks.mpimeet FOLDER WAIT` (mpirun.py's command), its rank from
mpirun's environment: it gives up after `WAIT` s without a meeting (a remote rank's tether
may come up after it), or at once when its meeting is there but gone (the front with it).
"""

from __future__ import annotations

import importlib
import os
import pickle
import socket
import sys
import time
from dataclasses import replace

from steward.ranks.child import ENTRY
from steward.ranks.mpirank import LOOK, PID, SIZE, exactly, meeting
from steward.wire.ranks import Wiring

RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMI_RANK")  # Open MPI's, and MPICH's


def come(folder: str, wait: float) -> None:
    """Meet, take what the rank is given, and run as a rank."""
    rank = next(int(os.environ[name]) for name in RANK_VARIABLES if name in os.environ)
    conn = socket.socket(socket.AF_UNIX)
    deadline = time.monotonic() + wait
    while True:
        try:
            conn.connect(meeting(folder, rank))
            break
        except FileNotFoundError:  # a remote rank's tether may not be up yet
            if time.monotonic() > deadline:
                sys.exit(f"steward mpi rank {rank}: no meeting at {folder} within {wait:.0f} s")
            time.sleep(LOOK)
        except ConnectionRefusedError:
            sys.exit(f"steward mpi rank {rank}: its meeting is over (its group was killed)")
    conn.sendall(PID.pack(os.getpid()))
    header, fds, _, _ = socket.recv_fds(conn, SIZE.size, 64)
    (size,) = SIZE.unpack(header)
    place, settings, speaks = pickle.loads(exactly(conn, size))
    conn.close()
    line, *rest = [socket.socket(fileno=fd) for fd in fds]
    wiring = Wiring(line, rest[0], rest[1:]) if speaks else Wiring(line, None, rest)
    settings = replace(settings, parent_pid=os.getppid())
    importlib.import_module(ENTRY).run(place, settings, wiring)


if __name__ == "__main__":
    come(sys.argv[1], float(sys.argv[2]))

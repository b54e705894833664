"""The far end of a rank started over ssh (remote.py): it holds the rank, relays its feed
and its line through the ssh session, and kills it when the session ends or the front
falls silent.

A separate process, since the rank itself cannot be relied on to notice: MLX's join, native
imports and loads hold its GIL for seconds or for ever, and a rank inside a collective does
not act on SIGTERM. The tether runs no MLX: it sees its stdin end (rank 0, the front's ssh
client or the session gone) at once, and the front's heartbeats stop (a link cut without a
reset, a front stopped) within `FRONT_SILENCE` s; then it SIGKILLs the rank and exits.
Were the tether itself killed, the rank dies with it (worker/lifeline.py: the parent-death
signal on Linux, a parent-pid watch elsewhere).

On the mpi backend the rank is not the tether's child but mpirun's (its daemon's, here): the
tether holds its meeting (mpirank.py) in the group's folder, at the same path as on the
front's host, where mpirun's command tells the rank to come; it kills it by its pid.

Run as `python -m steward.ranks.tether PAYLOAD`; it exits with its rank's status, 128 + N
for a rank killed by signal N (the ssh client passes it on).
"""

from __future__ import annotations

import base64
import os
import pickle
import select
import shutil
import socket
import sys
import tempfile
import time
from dataclasses import replace
from multiprocessing.process import BaseProcess
from pathlib import Path

from steward.ranks.child import start_rank
from steward.ranks.mpirank import MpiRank
from steward.wire.ranks import CHUNK, DOWN_BEAT, FRONT_SILENCE, Wiring

READ = 65536


def main(payload: str) -> int:
    """Hold the rank the front's `payload` describes (its place and settings) until its
    end; its exit status."""
    place, settings = pickle.loads(base64.b64decode(payload))
    out = os.dup(1)  # the rank's line, to the front
    os.dup2(2, 1)  # whatever else is printed here goes to stderr, never into the line
    if place.backend == "mpi":  # where the rank mpirun starts comes to meet
        folder = Path(place.folder)
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    else:
        folder = Path(tempfile.mkdtemp(prefix="steward-rank-"))  # the files MLX reads
    line, their_line = socket.socketpair()
    feed, their_feed = socket.socketpair()
    process = start_rank(
        replace(place, folder=str(folder)),
        replace(settings, parent_pid=os.getpid()),
        Wiring(their_line, None, [their_feed]),
    )
    their_line.close()
    their_feed.close()
    try:
        _relay(feed, line, out, process)
    finally:
        process.kill()
        process.join()
        shutil.rmtree(folder, ignore_errors=True)
    code = process.exitcode or 0
    return 128 - code if code < 0 else code


def _relay(
    feed: socket.socket, line: socket.socket, out: int, process: BaseProcess | MpiRank
) -> None:
    """stdin's chunks to the rank's feed, its line to `out`, until either ends, the rank
    exits (an mpi rank's end is its line's), or the front has been silent for
    `FRONT_SILENCE` s."""
    heard, pending = time.monotonic(), b""
    ends = [process.sentinel] if isinstance(process, BaseProcess) else []
    while time.monotonic() - heard < FRONT_SILENCE:
        ready, _, _ = select.select([0, line, *ends], [], [], DOWN_BEAT)
        try:
            if 0 in ready:
                data = os.read(0, READ)
                if not data:
                    return  # the session, the front or rank 0 is gone
                heard = time.monotonic()
                chunks, pending = _chunks(pending + data)
                for chunk in chunks:
                    feed.sendall(chunk)
            if line in ready:
                data = line.recv(READ)
                if not data:
                    return
                while data:
                    data = data[os.write(out, data) :]
        except OSError:
            return  # the rank's sockets or the session broke
        if ends and ends[0] in ready:
            return
    print(f"steward tether: no word from the front for {FRONT_SILENCE:.0f} s", file=sys.stderr)


def _chunks(data: bytes) -> tuple[list[bytes], bytes]:
    """The whole chunks at the start of `data` (heartbeats left out), and what is left."""
    chunks = []
    while len(data) >= CHUNK.size:
        (size,) = CHUNK.unpack_from(data)
        if len(data) < CHUNK.size + size:
            break
        if size:
            chunks.append(data[CHUNK.size : CHUNK.size + size])
        data = data[CHUNK.size + size :]
    return chunks, data


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

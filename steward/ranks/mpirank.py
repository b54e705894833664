"""A rank that `mpirun` starts (mpirun.py), as steward sees it: MLX's mpi backend joins only
processes that mpirun started, so steward cannot spawn them as it spawns any other rank
(child.py). What it would have given the rank, its place, its settings and its sockets (its
line, rank 0's channel, the feeds), waits instead at the rank's meeting, a Unix socket in
the group's folder (0700: only this user can come), `{folder}/{rank}.sock`, held before
mpirun starts. The rank comes for them first thing (mpimeet.py) and gets the sockets as
file descriptors: the very ones a spawned rank gets. A remote rank's meeting is held by its
tether (tether.py), on its own host, so the sockets never cross hosts.

`MpiRank` stands for the rank as a spawned rank's process does: its pid once it came, its
end (the pid gone: it is mpirun's child, so its status is mpirun's, read from what mpirun
reports), and SIGKILL by its pid. A rank that never comes never pulses: the group's join
bound sees it.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import socket
import struct
import threading
import time
from pathlib import Path

from steward.wire.ranks import RankPlace, Wiring
from steward.wire.settings import WorkerSettings

PID = struct.Struct("!I")  # the rank's pid, the first thing it says
SIZE = struct.Struct("!I")  # the payload's length, sent with the sockets
LOOK = 0.05  # seconds between two looks: for the rank, at its pid
TALK = 10.0  # seconds a rank that came has to say its pid and take what it is given
ENDED = 1  # its end as `exitcode` says it when mpirun did not report a signal


def meeting(folder: str, rank: int) -> str:
    """The Unix socket where rank `rank` of the group whose folder is `folder` meets."""
    return f"{folder}/{rank}.sock"


class MpiRank:
    """A rank mpirun starts, as the group (or its tether) sees a spawned rank's process:
    what `spawn_rank` would give it, held at its meeting socket until it comes."""

    def __init__(self, place: RankPlace, settings: WorkerSettings, wiring: Wiring) -> None:
        self.pid: int | None = None  # once it came
        line, sock, feeds = wiring
        self._given = [given.dup() for given in [line, *([sock] if sock else []), *feeds]]
        self._payload = pickle.dumps((place, settings, sock is not None))
        self._listener = socket.socket(socket.AF_UNIX)
        self._listener.bind(meeting(place.folder, place.rank))
        self._listener.listen(1)
        self._listener.settimeout(LOOK)
        self._killed = False
        self.signal: int | None = None  # the one mpirun reported it killed by (mpirun.py)
        self._gone = threading.Event()
        name = f"steward-mpi-rank-{settings.generation}.{place.rank}"
        threading.Thread(target=self._hold, daemon=True, name=name).start()

    @property
    def exitcode(self) -> int | None:
        """None while it runs (or has yet to come); once it has ended, minus the signal mpirun
        reported, else -SIGKILL if it was killed here, else `ENDED`."""
        if not self._gone.is_set():
            return None
        if self.signal is not None:
            return -self.signal
        return -signal.SIGKILL if self._killed else ENDED

    def kill(self) -> None:
        """SIGKILL it by its pid; one that has not come yet never will (its meeting ends)."""
        self._killed = True
        if self.pid is not None and _running(self.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def join(self, timeout: float | None = None) -> None:
        """Wait for its end (mpirun reaps it), or its meeting's if it never came."""
        self._gone.wait(timeout)

    def _hold(self) -> None:
        try:
            if (pid := self._meet()) is not None:
                self.pid = pid
                while _running(pid):
                    time.sleep(LOOK)
        finally:
            for given in self._given:
                given.close()
            self._gone.set()

    def _meet(self) -> int | None:
        """Its pid, once it came and took what it is given; None if it was killed first."""
        with self._listener:
            while not self._killed:
                try:
                    conn, _ = self._listener.accept()
                except TimeoutError:
                    continue
                with conn, contextlib.suppress(OSError, EOFError):  # it died coming: wait on
                    conn.settimeout(TALK)
                    (pid,) = PID.unpack(exactly(conn, PID.size))
                    fds = [given.fileno() for given in self._given]
                    socket.send_fds(conn, [SIZE.pack(len(self._payload))], fds)
                    conn.sendall(self._payload)
                    return pid
        return None


def _running(pid: int) -> bool:
    """The process is there and not a zombie (Linux says so; elsewhere its parent reaps it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True


def exactly(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        if not (more := conn.recv(size - len(data))):
            raise EOFError("the meeting ended")
        data += more
    return data

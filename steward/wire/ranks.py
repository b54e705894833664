"""What crosses `spawn` to one rank of a group (ranks/group.py), and the pulse every rank
sends the supervisor on a line of its own (worker/rank.py).

The pulse is how a hung rank is seen while the others spin in a collective that waits for
it: each rank beats every `BEAT` s, with whether it has joined the group, whether it serves
(its batch loop runs), how many steps it has run, and its pid (a remote rank's is known
only from its pulses). Only a serving rank's silence means
it is stopped or wedged: MLX's `mx.distributed.init` holds the GIL while it waits for the
peers, and so do native imports and loads (measured: a rank silent for over 3 s while it
imported, on a loaded machine), while a serving rank's beats go on even inside a
collective (`mx.eval` releases the GIL). The pulse also carries its device's memory, from
when it has joined: a remote host's is known from its rank alone, and whether a spare group
fits is decided from every host's (ranks/room.py).
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from typing import NamedTuple

# joined, serving, steps run so far, its pid (on its host), its device's memory (0: not known)
PULSE = struct.Struct("!??QIQ")
BEAT = 0.25  # seconds between two pulses

# Down an ssh session to a remote rank (ranks/remote.py, ranks/tether.py): rank 0's feed in
# chunks, each after its length, and the front's heartbeat, an empty chunk every `DOWN_BEAT`
# s. A far side that hears nothing for `FRONT_SILENCE` s takes the front for lost (a link
# cut without a reset, a front stopped) and kills its rank.
CHUNK = struct.Struct("!I")
DOWN_BEAT = 1.0
FRONT_SILENCE = 10.0


class Wiring(NamedTuple):
    """A rank's sockets: `line` its pulse's, `sock` rank 0's worker channel (None on the
    others), `feeds` rank 0's to every other rank, or another rank's from rank 0."""

    line: socket.socket
    sock: socket.socket | None
    feeds: list[socket.socket]


@dataclass(frozen=True)
class RankPlace:
    """One rank's place in its group: what MLX needs to join it (ranks/formation.py)."""

    rank: int
    size: int
    backend: str  # MLX's name for it: "ring", "nccl", "jaccl"
    env: tuple[tuple[str, str], ...]  # set in the rank's environment
    files: tuple[tuple[str, str], ...]  # (variable, text): written on the rank's host, the
    # variable set to the file's path (MLX reads the ring's hostfile and jaccl's devices so)
    folder: str  # where on the rank's host they are written (its spawner's, removed with it)

    def environment(self) -> dict[str, str]:
        """What the rank sets before MLX joins it to the group, its files written."""
        written = {}
        for name, text in self.files:
            path = f"{self.folder}/{self.rank}.{name.lower()}.json"  # ranks here share it
            with open(path, "w") as out:
                out.write(text)
            written[name] = path
        return {**dict(self.env), "MLX_RANK": str(self.rank), **written}


HERE = "127.0.0.1"  # a hostfile's host started without ssh, as mlx.launch has it


@dataclass(frozen=True)
class RankHost:
    """One host of a hostfile (ranks/hostfile.py): one rank."""

    ssh: str  # what ssh is given to reach it
    ips: tuple[str, ...]  # where its peers reach it
    rdma: tuple[str | None, ...] = ()  # jaccl: its RDMA device toward each rank (None: itself)

    @property
    def remote(self) -> bool:
        return self.ssh != HERE


@dataclass(frozen=True)
class Hostfile:
    """The operator's `--hostfile`, read."""

    path: str
    hosts: tuple[RankHost, ...]
    backend: str  # as the file names it; "" when it names none
    envs: tuple[str, ...]  # KEY=VALUE, set on every host

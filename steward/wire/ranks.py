"""What crosses `spawn` to one rank of a group (ranks/group.py), and the pulse every rank
sends the supervisor on a line of its own (worker/rank.py).

The pulse is how a hung rank is seen while the others spin in a collective that waits for
it: each rank beats every `BEAT` s, with whether it has joined the group and how many steps
it has run. MLX's `mx.distributed.init` holds the GIL while it waits for the peers, so a
rank is silent until it joins; a joined rank's beats go on inside a collective (`mx.eval`
releases the GIL), so a silent joined rank is a stopped or wedged process.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

PULSE = struct.Struct("!?Q")  # joined, steps run so far
BEAT = 0.25  # seconds between two pulses


@dataclass(frozen=True)
class RankPlace:
    """One rank's place in its group: what MLX needs to join it."""

    rank: int
    size: int
    backend: str  # MLX's name for it: "ring"
    hostfile: str  # the path of MLX's JSON hostfile (MLX_HOSTFILE)

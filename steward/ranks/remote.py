"""A rank on another host, started over ssh as `mlx.launch` starts one: the same Python,
from the same directory where that exists there, running the same steward.

The rank's place and settings go on the command line (pickled; the front is the only one
that writes them). The ssh session carries everything else, so no other port is opened
between the hosts: its stdin is rank 0's feed to the rank, its stdout the rank's line
(pulses), its stderr the front's. On the far side the tether (tether.py) holds the rank.

No rank is left orphaned: the tether kills its rank once its stdin ends, which it does when
rank 0 or this ssh client dies (rank 0 and the front die together: worker/lifeline.py), or
when the session or the link drops; on a fault the group also kills the rank by its pid
over a second ssh, and SIGKILLs this client. The tether exits with its rank's status
(128 + N for a rank killed by signal N), which ssh passes on.
"""

from __future__ import annotations

import base64
import os
import pickle
import shlex
import signal
import socket
import subprocess
import sys
import time

from steward.ranks.hostfile import RankHost
from steward.wire.ranks import RankPlace
from steward.wire.settings import WorkerSettings

# never prompt (a host that wants a password fails the bring-up); give up on a dead host
SSH = ("ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR")
TETHER = "steward.ranks.tether"
SSH_FAILED = 255  # ssh's own status: no session, or one that was cut
KEPT = ("PYTHONPATH",)  # the front's environment the far side needs to find the same steward


class SshRank:
    """The ssh client that holds one remote rank, as the group sees a rank's process."""

    def __init__(self, host: RankHost, client: subprocess.Popen[bytes]) -> None:
        self.host = host
        self.client = client
        self._killer: subprocess.Popen[bytes] | None = None

    @classmethod
    def start(
        cls,
        host: RankHost,
        place: RankPlace,
        settings: WorkerSettings,
        hostfile: str,
        feed: socket.socket,
        line: socket.socket,
    ) -> SshRank:
        """The rank started over ssh: `hostfile` the group's MLX hostfile (its text),
        `feed` rank 0's to it, `line` its pulses'."""
        payload = base64.b64encode(pickle.dumps((place, settings, hostfile))).decode()
        kept = [f"export {k}={shlex.quote(os.environ[k])};" for k in KEPT if k in os.environ]
        script = (
            f"cd {shlex.quote(os.getcwd())} 2>/dev/null; {' '.join(kept)} "
            f"exec {shlex.quote(sys.executable)} -m {TETHER} {payload}"
        )
        client = subprocess.Popen(
            [*SSH, host.ssh, script],
            stdin=feed.fileno(),
            stdout=line.fileno(),
            start_new_session=True,  # a Ctrl-C at the front's terminal drains, never cuts it
        )
        return cls(host, client)

    @property
    def exitcode(self) -> int | None:
        """As multiprocessing says it: negative for a rank killed by a signal."""
        code = self.client.poll()
        if code is not None and 128 < code < SSH_FAILED:
            return 128 - code
        return code

    def kill(self, pid: int | None) -> None:
        """SIGKILL the rank by its `pid` (its pulses said it) over another ssh, and this
        client at once (which ends the session: the tether kills the rank too)."""
        if pid is not None and self._killer is None and self.client.poll() is None:
            self._killer = subprocess.Popen(
                [*SSH, self.host.ssh, f"kill -9 {pid}"],
                stdin=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        if self.client.poll() is None:
            self.client.send_signal(signal.SIGKILL)

    def join(self, timeout: float | None = None) -> None:
        """Reap the client (and the killer, SIGKILLed if it is not done by then)."""
        deadline = time.monotonic() + (timeout or 0.0)
        for process in [self.client, self._killer]:
            if process is None:
                continue
            try:
                process.wait(None if timeout is None else max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                if process is self._killer:
                    process.kill()
                    process.wait()

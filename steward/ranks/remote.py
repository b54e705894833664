"""A rank on another host, started over ssh as `mlx.launch` starts one: the same Python,
from the same directory where that exists there, running the same steward.

The rank's place and settings go on the command line (pickled; the front is the only one
that writes them). The ssh session carries everything else, so no other port is opened
between the hosts: its stdin rank 0's feed to the rank, relayed here in chunks between the
front's heartbeats (wire/ranks.py), its stdout the rank's line (pulses), its stderr the
front's. On the far side the tether (tether.py) holds the rank.

No rank is left orphaned: the tether kills its rank once its stdin ends, which it does when
rank 0, the front or this ssh client dies, or the session drops, and once it has heard no
heartbeat for `FRONT_SILENCE` s (a link cut without a reset, which neither sshd nor TCP
would notice for many minutes; a front stopped). On a fault the group also kills the rank
by its pid over a second ssh, and SIGKILLs this client. The tether exits with its rank's
status (128 + N for a rank killed by signal N), which ssh passes on.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import pickle
import shlex
import signal
import socket
import subprocess
import sys
import time

from steward.ranks.hostfile import RankHost
from steward.wire.ranks import CHUNK, DOWN_BEAT, RankPlace
from steward.wire.settings import WorkerSettings

# never prompt (a host that wants a password fails the bring-up); give up on a dead host
SSH = ("ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR")
TETHER = "steward.ranks.tether"
SSH_FAILED = 255  # ssh's own status: no session, or one that was cut
KEPT = ("PYTHONPATH",)  # the front's environment the far side needs to find the same steward


class SshRank:
    """The ssh client that holds one remote rank, as the group sees a rank's process."""

    def __init__(
        self, host: RankHost, client: subprocess.Popen[bytes], relay: asyncio.Task[None]
    ) -> None:
        self.host = host
        self.client = client
        self.relay = relay  # rank 0's feed and the heartbeats, down the session
        self._killer: subprocess.Popen[bytes] | None = None

    @classmethod
    def start(
        cls,
        host: RankHost,
        place: RankPlace,
        settings: WorkerSettings,
        feed: socket.socket,
        line: socket.socket,
    ) -> SshRank:
        """The rank started over ssh (its place carries the files MLX reads, as text):
        `feed` rank 0's to it (this keeps its own copy, to relay), `line` its pulses'."""
        payload = base64.b64encode(pickle.dumps((place, settings))).decode()
        kept = [f"export {k}={shlex.quote(os.environ[k])};" for k in KEPT if k in os.environ]
        script = (
            f"cd {shlex.quote(os.getcwd())} 2>/dev/null; {' '.join(kept)} "
            f"exec {shlex.quote(sys.executable)} -m {TETHER} {payload}"
        )
        down, stdin = socket.socketpair()
        client = subprocess.Popen(
            [*SSH, host.ssh, script],
            stdin=stdin.fileno(),
            stdout=line.fileno(),
            start_new_session=True,  # a Ctrl-C at the front's terminal drains, never cuts it
        )
        stdin.close()
        return cls(host, client, asyncio.ensure_future(_relay(feed.dup(), down)))

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
        self.relay.cancel()

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


async def _relay(feed: socket.socket, down: socket.socket) -> None:
    """Rank 0's feed down the session in chunks, a heartbeat between them, until the feed
    ends (rank 0 gone: the session's stdin ends with it) or the session does."""
    reader, upstream = await asyncio.open_connection(sock=feed)
    _, writer = await asyncio.open_connection(sock=down)

    async def beat() -> None:
        while True:
            writer.write(CHUNK.pack(0))
            await writer.drain()
            await asyncio.sleep(DOWN_BEAT)

    beating = asyncio.ensure_future(beat())
    try:
        while data := await reader.read(65536):
            writer.write(CHUNK.pack(len(data)) + data)
            await writer.drain()
    except OSError:
        pass  # the session is gone
    finally:
        beating.cancel()
        writer.close()
        upstream.close()
        with contextlib.suppress(OSError, asyncio.CancelledError):
            await beating

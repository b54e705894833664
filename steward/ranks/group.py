"""A group of ranks with the handle of one worker process (wire/process.py `Worker`).

Rank 0 speaks the worker's channel; every rank also has a line of its own to this handle,
on which it pulses (wire/ranks.py). The group is faulted, and every rank killed, when any
rank:
- exits, or its line ends (seen at once: a SIGKILLed rank's line ends with it);
- serves, and falls silent for `SILENCE` s (stopped, wedged: its peers spin in a
  collective that waits for it, and no backend of MLX has a timeout for that; before it
  serves, native imports and MLX's join hold the GIL, and silence means nothing);
- has not joined `join_timeout` s after the group was spawned (MLX's own join waits for
  ever).
Killed means SIGKILL, after `GRACE` s for rank 0 to report what it saw itself (a
`LoadFailed`, a `Failed`): a rank inside a collective does not act on SIGTERM. A rank on
another host (a hostfile's, remote.py) is killed over ssh, and its session ended. Every
rank is reaped. On the mpi backend one mpirun starts every rank (mpirun.py, mpirank.py):
each is still watched and killed by its own pid; then mpirun, whose exit also faults the
group, ends the job itself and is reaped (or SIGKILLed, with its process group). Rank 0's
channel then ends, and the supervisor replaces the worker as it replaces one that
crashed: a new group, on fresh ports. The log names the cause: the rank killed by a signal,
when one is seen within the grace, rather than its peers that exited on the lost link
first. A front that was itself stopped reads its ranks' waiting pulses before it judges
their silence.

What rank 0 says when it is ready carries where a second copy of the model is tightest
(room.py), from rank 0's part and the memory each rank's pulses said: the supervisor
chooses the standby from it without learning of hosts or ranks. A spare group is another
group, formed on ports of its own (formation.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from pathlib import Path

import msgspec

from steward.ranks.child import start_rank
from steward.ranks.formation import form, holder, placed, release
from steward.ranks.mpirank import ENDED, MpiRank
from steward.ranks.mpirun import Mpirun
from steward.ranks.remote import SSH_FAILED, SshRank
from steward.ranks.room import tightest
from steward.wire.channel import AsyncChannel
from steward.wire.process import describe_exit
from steward.wire.protocol import (
    FromWorker,
    Ready,
    Room,
    Shutdown,
    ToWorker,
    decode_from_worker,
    encode,
)
from steward.wire.ranks import HERE, PULSE, RankPlace, Wiring
from steward.wire.settings import WorkerSettings

log = logging.getLogger("steward.ranks")

SILENCE = 3.0  # seconds a serving rank may go without a pulse
GRACE = 0.5  # seconds rank 0 has to report a fault itself before every rank is killed
WATCH = 0.1  # seconds between two looks at the ranks
KILLED = 5.0  # seconds every rank killed has to be reaped (a remote one: its ssh, too)


@dataclass(eq=False)
class Rank:
    """One rank's process and what its pulses said."""

    place: RankPlace
    process: BaseProcess | SshRank | MpiRank  # an ssh client holds a remote rank; mpi: its meeting
    host: str  # as the hostfile names it (its `ssh`); local ranks: 127.0.0.1
    holder: str  # the memory its part takes: its host's, or its GPU's (formation.py)
    pid: int | None = None  # on its host; a remote rank's is known from its pulses
    joined: bool = False
    serving: bool = False
    steps: int = 0
    memory: int = 0  # its device's, as its pulses said (0: not yet)
    pulse: float = field(default_factory=time.monotonic)  # its last pulse (monotonic)
    progress: float = field(default_factory=time.monotonic)  # it joined or stepped last
    ended: bool = False  # its line ended
    ended_at: float = float("inf")  # when (monotonic)

    def heard(self, joined: bool, serving: bool, steps: int, pid: int, memory: int) -> None:
        now = time.monotonic()
        if (joined, serving, steps) != (self.joined, self.serving, self.steps):
            self.progress = now
        self.joined, self.serving, self.steps, self.pulse = joined, serving, steps, now
        self.pid, self.memory = pid, memory

    def kill(self) -> None:
        """SIGKILL it, on its own host (a remote one, over ssh)."""
        if isinstance(self.process, SshRank):
            self.process.kill(self.pid)
        elif isinstance(self.process, MpiRank):
            self.process.kill()
        elif self.process.exitcode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid or 0, 9)

    def state(self, now: float) -> dict[str, object]:
        """As /health shows it."""
        return {
            "rank": self.place.rank,
            "host": self.host,
            "pid": self.pid,
            "alive": self.process.exitcode is None,
            "joined": self.joined,
            "serving": self.serving,
            "steps": self.steps,
            "since_progress_s": round(now - self.progress, 3),
        }


class RankGroup:
    def __init__(
        self,
        ranks: list[Rank],
        channel: AsyncChannel,
        folder: Path,
        ports: list[int],
        join_timeout: float,
        launcher: Mpirun | None = None,
    ) -> None:
        self.ranks = ranks
        self.channel = channel
        self.folder = folder  # the files MLX reads, of the ranks here
        self.ports = ports  # given to this group until it is reaped
        self.join_timeout = join_timeout
        self.launcher = launcher  # mpi: the mpirun that started every rank
        self.started = time.monotonic()
        self._closing = False
        self._naming: asyncio.Task[None] | None = None  # saying what faulted it
        self._lines: list[asyncio.Task[None]] = []
        self._watch = asyncio.ensure_future(self._watching())

    @classmethod
    async def spawn(cls, settings: WorkerSettings) -> RankGroup:
        """Every rank started, on fresh ports; none has joined yet."""
        folder = Path(tempfile.mkdtemp(prefix="steward-ranks-"))
        hosts = placed(settings.hostfile, settings.ranks)
        places, ports = form(hosts, settings.distributed_backend, folder)
        ours, theirs = socket.socketpair()
        feeds = [socket.socketpair() for _ in places[1:]]
        lines = [socket.socketpair() for _ in places]
        ranks: list[Rank] = []
        for place, host, (_, line) in zip(places, hosts, lines, strict=True):
            process: BaseProcess | SshRank | MpiRank
            if place.rank == 0:  # here, whatever its host: it speaks the worker channel
                wiring = Wiring(line, theirs, [lead for lead, _ in feeds])
                process = start_rank(place, settings, wiring)
            elif host.remote:
                feed = feeds[place.rank - 1][1]
                process = SshRank.start(host, place, settings, feed, line)
            else:
                process = start_rank(
                    place, settings, Wiring(line, None, [feeds[place.rank - 1][1]])
                )
            pid = None if isinstance(process, SshRank) else process.pid  # else its pulses'
            held = holder(hosts, place)
            ranks.append(Rank(place, process, host.ssh, held, pid=pid))
        for sock in [theirs, *(s for pair in feeds for s in pair), *(s for _, s in lines)]:
            sock.close()
        launcher = None
        if places[0].backend == "mpi":  # every rank's meeting is held: mpirun starts them
            launcher = Mpirun.start(hosts, folder, settings.rank_join_timeout, _reported(ranks))
        channel = await AsyncChannel.open(ours)
        group = cls(ranks, channel, folder, ports, settings.rank_join_timeout, launcher)
        for rank, (line, _) in zip(ranks, lines, strict=True):
            group._lines.append(asyncio.ensure_future(group._listen(rank, line)))
        log.info(
            "group %d: %d %s ranks (pids %s)%s",
            settings.generation,
            len(ranks),
            places[0].backend,
            ", ".join(_where(rank) for rank in ranks),
            f", started by mpirun (pid {launcher.pid})" if launcher else "",
        )
        return group

    @property
    def pid(self) -> int:
        """Rank 0's (an mpi rank's once it came: its mpirun's until then)."""
        return self.ranks[0].process.pid or (self.launcher.pid if self.launcher else 0)

    @property
    def exitcode(self) -> int | None:
        """The first rank's exit status that is known: one rank gone is the group gone."""
        codes = [rank.process.exitcode for rank in self.ranks]
        return next((code for code in codes if code is not None), None)

    def send(self, msg: ToWorker) -> None:
        self.channel.send(encode(msg))

    async def recv(self) -> FromWorker:
        """Rank 0's next message, a `Ready` with the group's room; EOFError once it is gone."""
        msg = decode_from_worker(await self.channel.recv())
        if isinstance(msg, Ready):
            return msgspec.structs.replace(msg, room=await self._room(msg.model_bytes))
        return msg

    async def _room(self, part: int) -> Room:
        """Where a second copy is tightest, once every rank has said its memory (each says
        it as it joins; its pulse may still be on its way: `SILENCE` s at most)."""
        deadline = time.monotonic() + SILENCE
        while not all(rank.memory for rank in self.ranks) and time.monotonic() < deadline:
            await asyncio.sleep(WATCH)
        return tightest(part, [(rank.holder, rank.memory) for rank in self.ranks])

    def state(self) -> list[dict[str, object]]:
        now = time.monotonic()
        return [rank.state(now) for rank in self.ranks]

    async def stop(self, timeout: float) -> None:
        """Shutdown to rank 0 (which relays it to every rank), then SIGKILL what is left."""
        self._closing = True
        self.send(Shutdown())
        await self.wait(timeout)
        await self.kill()

    async def kill(self) -> None:
        """SIGKILL every rank and reap them all; a group killed because one of its ranks
        ended (rank 0's channel closed before the watch's next look) says which first."""
        if not self._closing and (fault := self.verdict(time.monotonic())) is not None:
            self._name(fault)
        self._closing = True
        if self._naming is not None:
            await self._naming
        await self._kill_ranks()
        self.channel.close()
        for task in [self._watch, *self._lines]:
            task.cancel()

    async def _kill_ranks(self) -> None:
        for rank in self.ranks:
            rank.kill()
        await self.wait(KILLED)
        if self.launcher is not None:
            await self._end(self.launcher)
        shutil.rmtree(self.folder, ignore_errors=True)
        release(self.ports)
        self.ports = []

    async def _end(self, launcher: Mpirun) -> None:
        """mpirun, its ranks reaped: it ends the job itself (reaping what it started, here and
        through each host's daemon; measured: 16 ms), or after `KILLED` s is SIGKILLed with
        its process group."""
        await asyncio.to_thread(launcher.join, KILLED)
        launcher.kill()
        await asyncio.to_thread(launcher.join)

    async def wait(self, timeout: float) -> bool:
        """Reap every rank within `timeout` s; True if all have exited."""
        deadline = time.monotonic() + timeout
        for rank in self.ranks:
            left = max(0.0, deadline - time.monotonic())
            await asyncio.to_thread(rank.process.join, left)
        return all(rank.process.exitcode is not None for rank in self.ranks)

    async def _listen(self, rank: Rank, line: socket.socket) -> None:
        reader, writer = await asyncio.open_connection(sock=line)
        try:
            while True:
                rank.heard(*PULSE.unpack(await reader.readexactly(PULSE.size)))
        except (asyncio.IncompleteReadError, OSError):
            rank.ended, rank.ended_at = True, time.monotonic()
        finally:
            writer.close()

    async def _watching(self) -> None:
        looked = time.monotonic()
        while not self._closing:
            await asyncio.sleep(WATCH)
            now = time.monotonic()
            # the front itself was stopped: the ranks' pulses wait unread, and say so next
            stalled, looked = now - looked > SILENCE, now
            if self._closing or stalled or (fault := self.verdict(now)) is None:
                continue
            naming = self._name(fault)
            await asyncio.sleep(GRACE)  # for rank 0 to report what it saw itself
            await naming
            await self._kill_ranks()  # rank 0's channel ends: the supervisor sees a crash
            return

    def _name(self, fault: str) -> asyncio.Task[None]:
        """Say, once, what faulted the group: `fault`, unless within `GRACE` s a rank is
        seen killed by a signal (the cause: a remote rank's end comes over ssh, after its
        peers have already exited on the lost link)."""
        self._closing = True  # what follows is the killing
        self._naming = asyncio.ensure_future(self._named(fault))
        return self._naming

    async def _named(self, fault: str) -> None:
        started = time.monotonic()
        while not self._cause_seen() and time.monotonic() - started < self._patience():
            await asyncio.sleep(WATCH)
        said = self.verdict(time.monotonic()) or fault
        log.error("rank group (pid %d) faulted: %s; killing every rank", self.pid, said)

    def _cause_seen(self) -> bool:
        """A rank killed by a signal, or no rank left to end and nothing left for mpirun
        to report of them."""
        if any(_signalled(rank) for rank in self.ranks):
            return True
        running = any(rank.process.exitcode is None for rank in self.ranks)
        return not running and (self.launcher is None or self.launcher.said.is_set())

    def _patience(self) -> float:
        """How long the cause may take to be seen: `GRACE`, or `KILLED` once every rank of
        an mpi group has ended, its signal to come in mpirun's report (mpirun reaps the
        ranks, then says: on a loaded machine, after more than `GRACE`)."""
        ended = all(rank.process.exitcode is not None for rank in self.ranks)
        return KILLED if self.launcher is not None and ended else GRACE

    def verdict(self, now: float) -> str | None:
        """What faults the group now, if anything."""
        if ended := [r for r in self.ranks if r.ended or r.process.exitcode is not None]:
            for rank in ended:  # a line closes a moment before its process can be reaped
                if rank.process.exitcode is None:
                    rank.process.join(0.1)
            # the one killed by a signal is the cause (else the first whose line ended: an mpi
            # rank's status is mpirun's); its peers exit on the lost link after
            first = min(ended, key=lambda r: (not _signalled(r), r.ended_at, r.place.rank))
            return f"{_name(first)} {_ended(first)}"
        if self.launcher is not None and (code := self.launcher.exitcode) is not None:
            return f"mpirun (pid {self.launcher.pid}) {describe_exit(code)}"
        for rank in self.ranks:
            if rank.serving and now - rank.pulse > SILENCE:
                return f"{_name(rank)} silent for {now - rank.pulse:.1f} s (hung)"
        late = [str(rank.place.rank) for rank in self.ranks if not rank.joined]
        if late and now - self.started > self.join_timeout:
            named = f"rank {late[0]}" if len(late) == 1 else f"ranks {', '.join(late)}"
            return f"{named} did not join within {self.join_timeout:.0f} s"
        return None


def _reported(ranks: list[Rank]) -> Callable[[int, int], None]:
    """What mpirun reports a rank killed by (a local rank's status is mpirun's alone)."""

    def killed(rank: int, number: int) -> None:
        if isinstance(process := ranks[rank].process, MpiRank):
            process.signal = number

    return killed


def _where(rank: Rank) -> str:
    """As the log names a rank just started: a remote one's pid is not known yet, nor one
    that mpirun starts."""
    if rank.pid is not None:
        return str(rank.pid)
    return f"ssh {rank.host}" if isinstance(rank.process, SshRank) else "to come"


def _name(rank: Rank) -> str:
    """`rank 1 (pid 6220)`, `rank 1 (pid 6220 on mac2)`, `rank 1 (on mac2)` before it pulsed."""
    where = [] if rank.pid is None else [f"pid {rank.pid}"]
    where += [] if rank.host == HERE else [f"on {rank.host}"]
    return f"rank {rank.place.rank} ({' '.join(where)})"


def _signalled(rank: Rank) -> bool:
    return (rank.process.exitcode or 0) < 0


def _ended(rank: Rank) -> str:
    code = rank.process.exitcode
    if code is None:
        return "closed its line"
    if code == SSH_FAILED and isinstance(rank.process, SshRank):
        return "was lost: its ssh failed (status 255: the host unreachable, or the session cut)"
    if code == ENDED and isinstance(rank.process, MpiRank):
        return "ended (its status is mpirun's: it reports it, if a signal)"
    return describe_exit(code)

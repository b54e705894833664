"""Ranks in lockstep: every rank of a group runs the same engine on the same inputs, so that
every forward's collectives (the tensor-sharded layers' `all_sum`, the pipeline's `send`,
`recv` and `all_gather`: sharding.py) line up.

Rank 0 speaks the channel and runs the batch loop as one worker does (main.py). Each time
it takes messages from its inbox, between two steps, it sends the same messages first to
every other rank, on a socket of their own (`Relayed`), an empty list included, since a
step follows it; the other ranks take their inbox from that socket (`Fed`) and run the same
loop, whose answers nobody reads. The engine is deterministic given its inputs, once what
each rank would decide from its own clock is agreed: the batch width and the prefill rate
come from rank 0 (its calibration, sent first), and the chunk size never follows a rank's
own measurement (`Agreed`). Unseeded sampling draws from MLX's global generator, which every
rank seeds alike before its first step. A warm spare group's word to load (or to stop) is
relayed the same way, before rank 0 acts on it, so every rank loads its shard together.

A plain socket, not an `mx.distributed` broadcast: an idle group then waits in `recv`, where
a collective would spin (the ring backend busy-waits) between requests.

Anything a rank raises while it steps leaves the others inside a collective that will never
complete: the group is faulted. The rank says so (`Failed`, for rank 0's supervisor) and
exits; the supervisor kills every rank and forms the group again (ranks/group.py).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from steward.wire.channel import BlockingChannel
from steward.wire.protocol import (
    Calibration,
    Failed,
    FromWorker,
    Shutdown,
    Step,
    ToWorker,
    decode_to_worker,
    encode,
)
from steward.wire.settings import WorkerSettings
from steward.worker.chunks import Chunks, sized
from steward.worker.prepared import Prepared

if TYPE_CHECKING:
    from steward.worker.backend import Backend
    from steward.worker.engine import Engine
    from steward.worker.vision import VisionBackend

EX_FAULTED = 1  # a rank that raised while stepping: its group is faulted


class Taking(Protocol):
    def take(self, wait: bool) -> list[Any]: ...


class Agreed(Chunks):
    """Chunks sized from the rate rank 0 gave every rank, never from one rank's clock: two
    ranks that chose two sizes would run two shapes, and their collectives would not match."""

    def observe(self, tokens: int, seconds: float, timed: bool = True) -> None:
        return None


class Pulse:
    """What a rank tells the supervisor on its own line (worker/rank.py beats it)."""

    def __init__(self) -> None:
        self.joined = False
        self.serving = False  # its batch loop runs: from now on, silence is a hang
        self.steps = 0
        self.memory = 0  # its device's bytes (its recommended working set where it has one)


class Lockstep:
    """One rank's part in the group: its model's shard, its engine, its inbox."""

    def __init__(self, group: Any, pulse: Pulse, feeds: list[socket.socket]) -> None:
        self.group = group  # mx.distributed.Group
        self.pulse = pulse
        self.feeds = [BlockingChannel(feed) for feed in feeds]  # rank 0's: to every other rank

    def shard(self, backend: Backend | VisionBackend, parallel: str) -> Backend:
        """Keep this rank's part of the model, as `--parallel` asks (sharding.py).
        ValueError (a configuration error: exit 78) where it cannot."""
        import mlx.core as mx

        from steward.worker import sharding
        from steward.worker.backend import Backend

        if not isinstance(backend, Backend):
            raise ValueError("a vision model cannot be split over ranks")
        sharding.split(backend.model, self.group, parallel)
        mx.eval(backend.model.parameters())
        return backend

    def engine(self, backend: Backend, settings: WorkerSettings, given: Calibration) -> Engine:
        """The engine every rank builds alike, from rank 0's calibration."""
        from steward.worker.engine import Engine

        # Ranks step in lockstep on what they agree (chunks); drafts are not agreed yet.
        engine = Engine(
            backend, given.max_batch, settings.prompt_cache_bytes, chunks=Agreed(), speculate="none"
        )
        engine.calibrate(given)
        return engine

    def told(self, msg: ToWorker) -> None:
        """What a warm spare's rank 0 is told (`Load`, or `Shutdown`), relayed to every
        other rank as it came: they load when it loads, or end (`Fed.told`)."""
        relay(self.feeds, [encode(msg)])

    def relayed(self, inbox: Taking, given: Calibration) -> Relayed:
        """Rank 0's inbox, relayed to every other rank (rank 0's calibration first)."""
        return Relayed(inbox, self.feeds, given)

    def sending(self, send: Callable[[FromWorker], None]) -> Callable[[FromWorker], None]:
        """`send`, counting each step as the rank's progress; after a `Failed`, the rank
        exits (its peers wait in a collective it will never join)."""

        def counted(msg: FromWorker) -> None:
            send(msg)
            if isinstance(msg, Step):
                self.pulse.steps += 1
            elif isinstance(msg, Failed):
                os._exit(EX_FAULTED)

        return counted


def calibration(settings: WorkerSettings) -> Calibration:
    """Rank 0's: the one it was given, else the CPU's width (`--max-batch` wins) and no
    rate yet. Nothing is measured: a measurement is one rank's clock."""
    from steward.worker import width

    if settings.calibration is not None:
        return settings.calibration
    return Calibration(settings.max_batch or width.CPU, 0.0, sized(0.0))


class Relayed:
    """Rank 0's inbox: what it takes, sent first to every other rank."""

    def __init__(self, inbox: Taking, feeds: list[BlockingChannel], given: Calibration) -> None:
        self.inbox = inbox
        self.feeds = feeds
        relay(feeds, [encode(given)])

    def take(self, wait: bool) -> list[Any]:
        taken = self.inbox.take(wait=wait)
        relay(self.feeds, [encode(_raw(msg)) for msg in taken])
        return taken


def relay(feeds: list[BlockingChannel], frames: list[bytes]) -> None:
    """One record (its count of frames, then each) to every other rank."""
    try:
        for feed in feeds:
            feed.send(str(len(frames)).encode())
            for payload in frames:
                feed.send(payload)
    except OSError:
        os._exit(EX_FAULTED)  # a rank is gone: the group is faulted


class Fed:
    """Another rank's inbox: what rank 0 took, in the order it took it."""

    def __init__(self, feed: socket.socket) -> None:
        self.feed = feed
        self.channel = BlockingChannel(feed)

    def calibration(self) -> Calibration:
        (payload,) = self._record()
        return msgspec.msgpack.decode(payload, type=Calibration)

    def take(self, wait: bool) -> list[Any]:
        return [decode_to_worker(payload) for payload in self._record()]

    def told(self) -> ToWorker:
        """What rank 0 was told while the group was a warm spare (`Lockstep.told`)."""
        (msg,) = self.take(wait=True)
        return msg

    def held(self, seconds: float) -> None:
        """Wait for the feed to end (rank 0 gone), for at most `seconds`."""
        self.feed.settimeout(seconds)
        with contextlib.suppress(OSError):
            while self.feed.recv(4096):
                pass

    def _record(self) -> list[bytes]:
        try:
            count = int(self.channel.recv())
            return [self.channel.recv() for _ in range(count)]
        except EOFError:
            os._exit(EX_FAULTED)  # rank 0 is gone: the group is faulted


def _raw(msg: Any) -> ToWorker:
    """The message as rank 0 received it: a request before its encoding (each rank encodes
    its own), the end of the inbox as the `Shutdown` it stands for."""
    if msg is None:
        return Shutdown()
    return msg.req if isinstance(msg, Prepared) else msg

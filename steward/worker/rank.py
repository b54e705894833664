"""One rank of a group (ranks/group.py): join the group, then serve as rank 0 or follow it.

The pulse starts before anything else, on the rank's own line to the supervisor: a rank
that never joins, or stops once joined, is seen there (wire/ranks.py), whatever the others
are doing. MLX reads its place from the environment its place sets here before MLX is
imported (`MLX_RANK`, and what its backend reads: formation.py), with the hostfile's `envs`.
Rank 0 then runs the worker (main.py) with its lockstep (lockstep.py); every other rank
loads the same model, keeps its shard, and follows. In a warm spare group every rank starts
its runtime and device, then waits for the `Load` rank 0 relays when the group is promoted.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
import traceback

from steward.wire.channel import BlockingChannel
from steward.wire.protocol import FromWorker, Load, LoadFailed, encode
from steward.wire.ranks import BEAT, PULSE, RankPlace, Wiring
from steward.wire.settings import WorkerSettings
from steward.worker import lifeline, main, runtime
from steward.worker.injection import Injector
from steward.worker.lockstep import Fed, Lockstep, Pulse

HOLD = 30.0  # seconds a rank that cannot load the model leaves rank 0 to report it


def run(place: RankPlace, settings: WorkerSettings, wiring: Wiring) -> None:
    """Entry point of a rank's process: `sock` is rank 0's channel (None elsewhere),
    `feeds` its sockets to the others (rank 0), or the one from rank 0 (the others)."""
    line, sock, feeds = wiring
    lifeline.hold(settings.parent_pid)
    pulse = Pulse()
    threading.Thread(target=_beat, args=(line, pulse), daemon=True, name="pulse").start()
    runtime.environment(os.environ)
    runtime.without_torch(sys.modules)
    if settings.hostfile is not None:
        os.environ.update(env.split("=", 1) for env in settings.hostfile.envs)
    os.environ.update(place.environment())
    import mlx.core as mx

    if not mx.distributed.is_available(place.backend):
        _unavailable(place, sock, feeds, mx.__version__)
        return
    group = mx.distributed.init(strict=True, backend=place.backend)
    _, device, working_set = main.memory()  # once joined: the device is the backend's to set
    pulse.memory = working_set or device  # the standby's choice counts every host's
    pulse.joined = True
    mx.random.seed(settings.generation)  # unseeded sampling draws alike on every rank
    if place.rank == 0:
        assert sock is not None
        main.run(sock, settings, Lockstep(group, pulse, feeds))
    else:
        (feed,) = feeds
        _follow(Fed(feed), settings, Lockstep(group, pulse, []))


def _unavailable(
    place: RankPlace, sock: socket.socket | None, feeds: list[socket.socket], version: str
) -> None:
    """This build of MLX lacks the group's backend (nccl is CUDA's, jaccl macOS's): no
    restart can help, so rank 0 says so as a configuration error (exit 78), and every other
    rank leaves that to it, holding as for a model it cannot load."""
    why = f"--distributed-backend {place.backend}: MLX {version} here has no such backend"
    if sock is not None:
        BlockingChannel(sock).send(encode(LoadFailed(True, why, "")))
    else:
        Fed(feeds[0]).held(HOLD)


def _follow(fed: Fed, settings: WorkerSettings, lockstep: Lockstep) -> None:
    """Load the model, keep this rank's shard, and run rank 0's loop on what it took. A
    model this rank cannot load, rank 0 cannot either: it is rank 0's to report (a
    configuration error exits 78), so this rank waits for the end of its feed, for at most
    `HOLD` s, rather than fault the group first. A warm spare group's rank loads only once
    rank 0 relays its `Load` (and ends if it relays anything else: a `Shutdown`)."""
    head = runtime.Head()
    if settings.warm:
        head = main.warm_up(settings, runtime.Phases())
        if not isinstance(fed.told(), Load):
            return
    try:
        backend = main.load_backend(settings.source, Injector([], settings.generation), head)
        sharded = lockstep.shard(backend, settings.parallel)
    except main.CONFIG_ERRORS:
        traceback.print_exc()
        fed.held(HOLD)
        raise
    engine = lockstep.engine(sharded, settings, fed.calibration())

    def unread(msg: FromWorker) -> None:
        return None  # rank 0 answers

    lockstep.pulse.serving = True
    main.serve_batched(engine, fed, lockstep.sending(unread))


def _beat(line: socket.socket, pulse: Pulse) -> None:
    while True:
        try:
            said = (pulse.joined, pulse.serving, pulse.steps, os.getpid(), pulse.memory)
            line.sendall(PULSE.pack(*said))
        except OSError:
            os._exit(1)  # the supervisor is gone
        time.sleep(BEAT)

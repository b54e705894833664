"""Run the front: uvicorn serving the app, the pool of supervisors (one per model) beside
it, signals into a drain.

Signal handling follows uvicorn and trio: the handler only records the signal and
schedules the drain on the loop; a second SIGINT/SIGTERM forces the exit. uvicorn's own
habit of re-raising the signal after shutdown is not kept: a drained steward exits 0.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import resource
import signal
import socket
from dataclasses import replace
from types import FrameType

import uvicorn

from steward.config import ServeConfig
from steward.front.app import create_app
from steward.front.connections import BACKLOG, HEADROOM, BoundedProtocol, Limits
from steward.ops.metrics import Metrics
from steward.ops.notify import Notifier
from steward.pool.catalog import CatalogError, ModelEntry
from steward.pool.pool import Pool
from steward.supervisor.ahead import Ahead
from steward.supervisor.exits import EX_CONFIG
from steward.wire.faultspec import FaultSpec

log = logging.getLogger("steward")


class FrontServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.drain = asyncio.Event()  # first SIGTERM/SIGINT
        self.cut = asyncio.Event()  # second: stop waiting for in-flight requests
        self.loop = asyncio.get_running_loop()
        self.signals = 0

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        name = signal.Signals(sig).name
        self.signals += 1
        if self.signals > 1:
            log.warning("second %s: exiting without waiting for in-flight requests", name)
            self.loop.call_soon_threadsafe(self.cut.set)
        else:
            log.info("%s: draining", name)
            self.loop.call_soon_threadsafe(self.drain.set)


def bind(host: str, port: int) -> socket.socket:
    """Bind before anything else starts, so a taken port is a clear exit 78, not a traceback."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(BACKLOG)
    return sock


FD_RESERVE = 64  # the front's own files: worker sockets, logs, the model's files
MIN_CONNECTIONS = 8


def fit_connections(wanted: int) -> int | None:
    """Raise the soft file-descriptor limit as far as the hard one allows, and return the
    connection cap that fits under it; None (and a message naming the limit) if too few."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    spare = HEADROOM + BACKLOG + FD_RESERVE  # probes, accepted at once, the front's own
    need = wanted + spare
    if soft != resource.RLIM_INFINITY and soft < need:
        soft = need if hard == resource.RLIM_INFINITY else min(need, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    fits = wanted if soft == resource.RLIM_INFINITY else soft - spare
    if fits < MIN_CONNECTIONS:
        log.critical(
            "the file descriptor limit is too low: %d (hard limit %d); steward needs at "
            "least %d (%d connections and %d spare). Raise it: `ulimit -n`, LimitNOFILE= "
            "in systemd.",
            soft,
            hard,
            MIN_CONNECTIONS + spare,
            MIN_CONNECTIONS,
            spare,
        )
        return None
    if fits < wanted:
        log.warning(
            "max-connections lowered from %d to %d to fit the file descriptor limit %d",
            wanted,
            fits,
            soft,
        )
    return min(fits, wanted)


async def serve(config: ServeConfig, models: list[ModelEntry], faults: list[FaultSpec]) -> int:
    connections = fit_connections(config.max_connections)
    if connections is None:
        return EX_CONFIG
    config = replace(config, max_connections=connections)
    try:
        sock = bind(config.host, config.port)
    except OSError as exc:
        log.critical("cannot listen on %s:%d: %s", config.host, config.port, exc)
        return EX_CONFIG
    ahead = Ahead(config.process_ahead)
    pool = Pool(config, models, faults, spawn=ahead.spawn)
    try:
        pool.check()
    except CatalogError as exc:
        log.critical("%s", exc)
        return EX_CONFIG
    metrics, notifier = Metrics(pool, labelled=not pool.single), Notifier(pool)
    pool.observe = lambda name: [metrics.series(name) if not pool.single else metrics]
    pool.events.add(notifier)
    server = FrontServer(
        uvicorn.Config(
            create_app(config, pool, metrics),
            log_config=None,
            access_log=False,  # RequestContext logs each request, with its request id
            lifespan="off",
            timeout_graceful_shutdown=5,
            timeout_keep_alive=config.keep_alive_timeout,
            backlog=BACKLOG,
            http=functools.partial(  # type: ignore[arg-type]
                BoundedProtocol, limits=Limits(config.max_connections, config.header_timeout)
            ),
        )
    )
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    pool.start()
    notifier.send(f"STATUS=starting: loading {models[0].name}")
    pinging = asyncio.ensure_future(notifier.run(pool.alive))
    stopping = asyncio.ensure_future(server.drain.wait())
    exited = asyncio.ensure_future(pool.exited.wait())
    await asyncio.wait({stopping, exited}, return_when=asyncio.FIRST_COMPLETED)
    if pool.exit_code is not None:
        code = pool.exit_code
        await asyncio.sleep(0.2)  # let refused requests' answers go out
    else:
        await pool.stop(config.drain_timeout, server.cut)
        code = 0
    stopping.cancel()
    exited.cancel()
    await pool.close()
    await ahead.close()
    server.should_exit = True
    await serving
    pinging.cancel()
    notifier.close()
    log.info("exit %d", code)
    return code

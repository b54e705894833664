"""The worker process: load the model, then serve `Generate` messages until told to stop.

Threads: the main thread runs the backend (MLX wants one thread): between two batch steps
it takes every message that arrived (requests join, cancelled ones leave); a reader thread
takes messages off the socket so they land mid-generation and a dead front is noticed at
once (EOF), and hands requests to a few encoder threads (inbox.py), so that tokenizing a
long prompt does not hold the batch; a heartbeat thread shows the front that the process
and its GIL are alive.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import pickle
import resource
import socket
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from steward.model.resolve import ModelError, ModelSource, is_vision
from steward.wire.channel import BlockingChannel
from steward.wire.protocol import (
    Admitted,
    Calibrated,
    Calibration,
    Cancel,
    Done,
    Embed,
    Failed,
    FromWorker,
    Generate,
    Heartbeat,
    Load,
    LoadFailed,
    Ready,
    Shaping,
    Shutdown,
    Step,
    Warm,
    decode_to_worker,
    encode,
)
from steward.wire.settings import WorkerSettings
from steward.worker import lifeline, runtime
from steward.worker.inbox import Inbox
from steward.worker.injection import Injector
from steward.worker.lockstep import Taking
from steward.worker.lockstep import calibration as lockstep_calibration
from steward.worker.prepared import Prepared

if TYPE_CHECKING:
    from steward.worker.backend import Backend
    from steward.worker.calibrating import Calibrating
    from steward.worker.draft_model import DraftModel
    from steward.worker.embedding_engine import EmbeddingEngine
    from steward.worker.engine import Engine
    from steward.worker.lockstep import Lockstep
    from steward.worker.outputs import Pipeline
    from steward.worker.vision import VisionBackend

HEARTBEAT_INTERVAL = 1.0
# Raised while reading a model's files or config: restarting the process cannot help.
CONFIG_ERRORS = (ModelError, OSError, ValueError, KeyError, json.JSONDecodeError)


def run(sock: socket.socket, settings: WorkerSettings, lockstep: Lockstep | None = None) -> None:
    """Entry point of the spawned process; rank 0's of a group, with its `lockstep`
    (worker/rank.py)."""
    lifeline.hold(settings.parent_pid)
    _runtime_settings()
    phases = runtime.Phases()
    runtime.process_age(phases)
    _serve(BlockingChannel(sock), settings, phases, lockstep)


def ahead(sock: socket.socket) -> None:
    """Entry point of a process started ahead of need (wire/process.py): the runtime is
    imported now, while no one waits; the bring-up that takes this process starts when its
    settings come, and its phases count from then (its `imports` are what is left)."""
    lifeline.hold(os.getppid())
    _runtime_settings()
    with _file_limit_kept():
        runtime.imports(runtime.Phases())
    channel = BlockingChannel(sock)
    try:
        settings = pickle.loads(channel.recv())  # the front's own, on its socketpair
    except EOFError:
        return
    _serve(channel, settings, runtime.Phases(), None)


def _runtime_settings() -> None:
    runtime.environment(os.environ)  # before mlx is imported
    runtime.without_torch(sys.modules)  # before transformers is


def _serve(
    channel: BlockingChannel,
    settings: WorkerSettings,
    phases: runtime.Phases,
    lockstep: Lockstep | None,
) -> None:
    """Load, say `Ready`, serve: the worker's life once its settings are known."""
    if settings.memory_limit:
        resource.setrlimit(resource.RLIMIT_AS, (settings.memory_limit, settings.memory_limit))

    def sent(msg: FromWorker) -> None:
        channel.send(encode(msg))

    send = sent if lockstep is None else lockstep.sending(sent)

    threading.Thread(target=_beat, args=(send,), daemon=True, name="heartbeat").start()
    head = runtime.Head()
    if settings.warm and (head := _wait_warm(channel, send, settings, phases, lockstep)) is None:
        return
    started = time.perf_counter()
    calibration, measuring = None, None
    try:
        if not settings.warm:
            with _file_limit_kept():
                runtime.imports_and_device(phases)
        injector = Injector(settings.specs, settings.generation)
        if settings.kind == "embedding":
            with phases.timed("load"):
                engine = _embedding_engine(settings, injector)
            backend = engine.embedder
        else:
            with phases.timed("load"):
                backend = load_backend(settings.source, injector, head)
                sharded = None if lockstep is None else lockstep.shard(backend, settings.parallel)
            engine = None
            if lockstep is not None and sharded is not None:
                calibration = lockstep_calibration(settings)
                engine = lockstep.engine(sharded, settings, calibration)
            elif backend.batches:
                engine, calibration, measuring = _engine(backend, settings, phases)
    except CONFIG_ERRORS as exc:
        send(LoadFailed(True, f"{type(exc).__name__}: {exc}", traceback.format_exc()))
        return
    except Exception as exc:
        send(LoadFailed(False, f"{type(exc).__name__}: {exc}", traceback.format_exc()))
        return
    vision = not backend.batches
    send(
        Ready(
            os.getpid(),
            backend.context_length,
            backend.max_token_chars,
            1 if engine is None else engine.max_batch,
            time.perf_counter() - started,
            *memory(),
            thinking=backend.thinking,
            dimensions=backend.dimensions if settings.kind == "embedding" else 0,
            calibration=calibration,
            calibrating=measuring is not None,
            phases=phases.seconds,
            device=runtime.device(),
        )
    )
    inbox = Inbox(None if engine is None else engine.prepare)  # encoded off the loop
    taking: Taking = inbox
    if lockstep is not None and calibration is not None:
        taking = lockstep.relayed(inbox, calibration)  # what it takes, every rank takes
    cancelled = Cancels() if vision else None  # the batch takes cancels between its steps
    threading.Thread(
        target=_read, args=(channel, inbox, cancelled), daemon=True, name="reader"
    ).start()
    if engine is None:
        assert cancelled is not None
        _serve_alone(backend, inbox, cancelled, send)
    else:
        if lockstep is not None:
            lockstep.pulse.serving = True
        serve_batched(engine, taking, send, measuring)


def _engine(
    backend: Backend, settings: WorkerSettings, phases: runtime.Phases
) -> tuple[Engine, Calibration | None, Calibrating | None]:
    """The batch engine, its kernels warmed for a first burst (warmup.py), and what sized
    it: the calibration it was given, or the one kept for this model and device; else, on a
    CPU, the width memory allows (nothing there is worth measuring), and on a GPU a
    provisional width while the worker measures between requests (calibrating.py)."""
    from steward.worker import calibration, chunks, diskcache, warmup, width
    from steward.worker.calibrating import Calibrating
    from steward.worker.engine import Engine

    disk = diskcache.configured(settings)
    gpu = warmup.on_gpu()
    kept = calibration.name_here(settings) if gpu else ""
    given = settings.calibration or (calibration.stored(kept) if gpu else None)
    draft = _draft(settings)
    if draft is not None and gpu:
        with phases.timed("draft"):
            draft.warm()

    def new(width: int) -> Engine:
        cache_bytes, speculate = settings.prompt_cache_bytes, settings.speculate
        return Engine(backend, width, cache_bytes, disk, speculate=speculate, draft=draft)

    measuring = None
    if given is None:
        with phases.timed("measure"):
            fit = settings.max_batch or _fit(backend, settings)
        if gpu:
            engine = new(min(fit, settings.max_batch or width.CPU))
            keep = functools.partial(calibration.store, kept)
            measuring = Calibrating(engine, fit, settings.max_batch, keep)
        else:
            given = Calibration(min(fit, width.CPU), 0.0, chunks.sized(0.0))
    if given is not None:
        engine = new(given.max_batch)
        engine.calibrate(given)
        if gpu:
            with phases.timed("warmup"):
                warmup.shapes(engine)
    if disk is not None:
        with phases.timed("disk"):
            disk.probe()
    return engine, given, measuring


def _fit(backend: Backend, settings: WorkerSettings) -> int:
    """Members whose whole contexts fit in the memory the model leaves (width.py)."""
    import mlx.core as mx

    from steward.worker import width

    _, device, working_set = memory()
    free = width.free_bytes(
        working_set or device, mx.get_active_memory(), settings.prompt_cache_bytes
    )
    return width.fits(width.kv_bytes_per_token(backend.model), backend.context_length, free)


def _draft(settings: WorkerSettings) -> DraftModel | None:
    """`--draft-model`, loaded (its tokenizer is the model's: the front checked), or exit
    78 for one whose cache cannot be rolled back."""
    if settings.draft_model is None or settings.speculate == "none":
        return None
    from mlx_lm import load

    from steward.worker.draft_model import DraftModel
    from steward.worker.speculation import rolls_back

    model, _ = load(settings.draft_model)
    if not rolls_back(model):
        raise ModelError(  # its reads are padded, then trimmed: a cache that keeps all
            f"the draft model {settings.draft_model} has layers whose cache cannot be rolled "
            "back (a sliding window or a state-space layer): a draft model must be plain "
            "attention"
        )
    return DraftModel(model)


def _embedding_engine(settings: WorkerSettings, injector: Injector) -> EmbeddingEngine:
    """An embedding model (embedder.py), batched as embedding_engine.py does."""
    from steward.model.gguf import materialize
    from steward.worker import width
    from steward.worker.embedder import Embedder
    from steward.worker.embedding_engine import EmbeddingEngine

    with _file_limit_kept():
        embedder = Embedder(materialize(settings.source), injector, settings.max_embedding_tokens)
    return EmbeddingEngine(embedder, settings.max_batch or width.CPU)


def serve_batched(
    engine: Engine | EmbeddingEngine,
    inbox: Taking,
    send: Callable[[FromWorker], None],
    measuring: Calibrating | None = None,
) -> None:
    """Between steps, let every waiting request join and every cancelled one leave; a
    fault while joining or stepping fails the whole batch. The requests a pass takes in are
    announced in one `Step` before the step that starts their prefill, so the front knows
    how long the silence that follows may honestly last. A generating engine's steps are
    made into text on the output thread (outputs.py), and every message goes through it,
    in order. A worker `measuring` its calibration does so while it has no request
    (calibrating.py)."""
    from steward.worker.engine import Engine
    from steward.worker.outputs import Outputs, Pipeline

    generating = isinstance(engine, Engine)
    pipeline = Pipeline(engine.outputs if generating else Outputs(None), send)
    if generating:
        engine.shaping = lambda: pipeline.put(Shaping())
    try:
        _serve_steps(engine, generating, inbox, pipeline, measuring)
    finally:
        pipeline.close()


def _serve_steps(
    engine: Engine | EmbeddingEngine,
    generating: bool,
    inbox: Taking,
    pipeline: Pipeline,
    measuring: Calibrating | None,
) -> None:
    """The loop itself, until told to stop; every message it makes goes on `pipeline`."""
    while True:
        admitted: list[Admitted] = []
        measure = measuring is not None and not measuring.done
        for msg in inbox.take(wait=not engine.busy and not measure):
            if measuring is not None and measuring.active:  # the engine is the clients' now
                _measuring(engine, pipeline, measuring.stop)
            if msg is None or isinstance(msg, Shutdown):
                return
            if isinstance(msg, Cancel):
                try:
                    engine.cancel(msg.id)
                except Exception as exc:
                    pipeline.put(_failed(engine.drop_all(), exc))
                    admitted.clear()  # each of them is in the failure
                continue
            if not isinstance(msg, Prepared | Generate | Embed):  # raw: a test's inbox
                continue
            try:
                taken = engine.add(msg)
            except Exception as exc:
                pipeline.put(_failed([msg.id, *engine.drop_all()], exc))
                admitted.clear()
                continue
            if isinstance(taken, Admitted):
                admitted.append(taken)
            else:
                pipeline.put(taken)
        if admitted:
            pipeline.put(Step(admitted=admitted))
        if measuring is not None and measure:
            if measuring.expired():
                _measuring(engine, pipeline, measuring.finish)
            elif measuring.active or not engine.busy:
                _measuring(engine, pipeline, measuring.step)
                continue
        try:
            if engine.busy:
                step = engine.draw() if generating else engine.step()
                if not isinstance(step, Step) or step.tokens or step.done or step.prefilled:
                    pipeline.put(step)
            if generating and not engine.busy:  # before waiting: the last steps' text is
                engine.settle()  # out, and a failure to make it fails the batch now
        except Exception as exc:
            pipeline.put(_failed(engine.drop_all(), exc))


def _measuring(
    engine: Engine | EmbeddingEngine,
    pipeline: Pipeline,
    act: Callable[[], Calibration | None],
) -> None:
    """A measuring step, or its run's end: the calibration it completes goes to the front;
    a fault in it is the worker's, as any step's (no request is lost: none is in it)."""
    try:
        calibration = act()
    except Exception as exc:
        pipeline.put(_failed(engine.drop_all(), exc))
        return
    if calibration is not None:
        pipeline.put(Calibrated(calibration))


def _serve_alone(
    backend: VisionBackend,
    inbox: Inbox,
    cancelled: Cancels,
    send: Callable[[FromWorker], None],
) -> None:
    """One request at a time, for backends that cannot batch. The request running sees a
    cancel as soon as the reader has it (`Cancels`)."""
    while (req := inbox.get()) is not None:
        if isinstance(req, Cancel):
            cancelled.taken(req.id)
        if not isinstance(req, Generate):
            continue
        try:
            result = backend.generate(req, send, lambda req=req: req.id in cancelled)
            send(Step(done=[result]) if isinstance(result, Done) else result)
        except Exception as exc:
            send(_failed([req.id], exc))


class Cancels:
    """The cancels the reader has and the inbox still holds, by request id. A request is
    cancelled while one for it is held: each cancel follows its request in the inbox, so
    by the time the loop takes it, every request before it has ended. A replay reuses its
    id, and the cancel of its faulted attempt comes before it: counted, not a set, that
    cancel is spent before the replay starts, while one for the replay still counts."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # the reader adds, the loop takes
        self.held: Counter[int] = Counter()

    def received(self, req_id: int) -> None:
        with self.lock:
            self.held[req_id] += 1

    def taken(self, req_id: int) -> None:
        with self.lock:
            self.held[req_id] -= 1
            if self.held[req_id] <= 0:
                del self.held[req_id]

    def __contains__(self, req_id: int) -> bool:
        return self.held.get(req_id, 0) > 0


def _failed(ids: list[int], exc: Exception) -> Failed:
    return Failed(ids, f"{type(exc).__name__}: {exc}", traceback.format_exc())


def _wait_warm(
    channel: BlockingChannel,
    send: Callable[[FromWorker], None],
    settings: WorkerSettings,
    phases: runtime.Phases,
    lockstep: Lockstep | None,
) -> runtime.Head | None:
    """A warm spare: pay for the runtime, the device and what else the load can be spared
    (runtime.py) now, then wait to be promoted. What it prepared, or None if told to stop
    instead. Rank 0 of a group relays what it is told to every other rank first, as it
    relays requests: the group loads, or ends, together."""
    head = warm_up(settings, phases)
    send(Warm(os.getpid()))
    try:
        told = decode_to_worker(channel.recv())
    except EOFError:
        return None
    if lockstep is not None:
        lockstep.told(told)
    return head if isinstance(told, Load) else None


def warm_up(settings: WorkerSettings, phases: runtime.Phases) -> runtime.Head:
    """What a warm spare (or a rank of a warm group) does before it is told to load: the
    runtime, the device, and what the load can be spared (runtime.py)."""
    with _file_limit_kept():
        runtime.imports_and_device(phases)
        return runtime.head_start(settings, phases)


def memory() -> tuple[int, int, int]:
    """(bytes the loaded model takes, the device's bytes, its recommended working set, 0
    where it has none: Metal's): can a second copy fit?"""
    import mlx.core as mx

    info = mx.device_info()
    machine = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    working_set = int(info.get("max_recommended_working_set_size") or 0)
    device = info.get("memory_size") or info.get("total_memory") or machine  # Metal's, CUDA's
    return mx.get_active_memory(), int(device), working_set


def load_backend(
    source: ModelSource, injector: Injector, head: runtime.Head
) -> Backend | VisionBackend:
    """mlx-vlm for a vision-language model (its config has a `vision_config`), else mlx-lm;
    with what a warm spare prepared (`head`), if anything.

    Imported here, after the rlimit is set: importing mlx allocates."""
    from steward.model.gguf import materialize

    with _file_limit_kept():
        model_dir = head.model_dir or materialize(source)
        if is_vision(model_dir):
            from steward.worker.vision import VisionBackend

            return VisionBackend(model_dir, injector)
        from steward.worker.backend import Backend

        return Backend(model_dir, injector, head.tokenizer)


@contextlib.contextmanager
def _file_limit_kept() -> Iterator[None]:
    """mlx-lm sets RLIMIT_NOFILE to (2048, 4096) when imported, which raises ValueError
    where the hard limit is lower (a container, a strict systemd unit) and would pass
    for an unusable model. The front sized its own use to the limit it found; the worker
    keeps the limit it was given."""
    setrlimit = resource.setrlimit

    def tolerant(which: int, limits: tuple[int, int]) -> None:
        with contextlib.suppress(ValueError, OSError):
            setrlimit(which, limits)

    resource.setrlimit = tolerant
    try:
        yield
    finally:
        resource.setrlimit = setrlimit


def _read(channel: BlockingChannel, inbox: Inbox, cancelled: Cancels | None) -> None:
    while True:
        try:
            msg = decode_to_worker(channel.recv())
        except EOFError:
            os._exit(0)  # the front is gone: nobody is left to serve
        if isinstance(msg, Cancel) and cancelled is not None:
            cancelled.received(msg.id)  # what a backend busy with one request looks at
        if isinstance(msg, Shutdown):
            inbox.put(None)
        else:
            inbox.put(msg, request=isinstance(msg, Generate | Embed))


def _beat(send: Callable[[FromWorker], None]) -> None:
    while True:
        try:
            send(Heartbeat())
        except OSError:
            os._exit(0)
        time.sleep(HEARTBEAT_INTERVAL)

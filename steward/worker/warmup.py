"""Warm shapes: run, at bring-up, the shapes a batch's first burst will meet, so MLX builds
(or loads) their kernels then; and the measuring runs a model's first worker makes between
requests (calibrating.py).

On a GPU, MLX builds kernels the first time it meets an operation's shapes, and a batch
meets new ones as members join in prefill groups, decode together, prefill long prompts in
chunks and leave. A worker that has served only its canary (a hot spare, or any new worker)
would pay that in its first burst, which after a fault is every resumed stream at once:
seconds of silence that every client sees. So before it says `Ready`, a worker given its
model's calibration runs a bounded batch of its shapes (`shapes`, `SHAPES` s).

The measuring runs are step by step (each yields after an engine step, so the worker can
stop one when a request comes): `widths` has members join, a few at a time, until the batch
is at each width, decoding a few timed steps at each, until the knee is passed (width.py);
`prefill` has long prompts prefill together in chunks beside members decoding until the
prefill speed is timed on `TIMED_CHUNKS` chunks (not a shape's first, whose time is mostly
kernels being built), then leave, as does a decoding member of a batch that goes on. Every
run leaves the engine as it found it: empty. On a CPU there is nothing to compile and no
knee to find: none of this runs.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Generator, Iterator

from steward.wire.protocol import Generate
from steward.worker import chunks, runtime
from steward.worker.engine import Engine
from steward.worker.width import passed

PROMPT = "Warm the kernels for the shapes of a batch."  # about ten tokens
LENGTHS = 4  # distinct prompt lengths: prefill groups of unequal prompts pad differently
TIMED = 12  # steps timed at each width, after two untimed
LONG = 3  # long prompts prefilled together
DECODING = 2  # members decoding beside them
LONG_TOKENS = 8_000  # each long prompt's, at most: enough for the chunks to be timed
TIMED_CHUNKS = 3  # prefill steps the speed is taken from
SHAPES = 3.0  # seconds a calibrated worker's warm-up may take

_ids = itertools.count(-(2**40), -1)  # never a client's id, nor the canary's

Steps = Iterator[None]  # one engine step per item


def on_gpu() -> bool:
    return runtime.device() == "gpu"


def widths(engine: Engine, wanted: list[int], speeds: dict[int, float]) -> Steps:
    """Tokens/s at each width not in `speeds` yet, into `speeds`, up to the first past the
    knee."""
    with _emptied(engine):
        for width in wanted:
            if width in speeds:
                continue
            yield from _grow(engine, width)
            if engine.batch.decoding < width:
                return  # the members could not all join: the widths so far are what it has
            speeds[width] = yield from _speed(engine, width)
            if passed(speeds):
                return  # the widths measured so far are the ones auto picks from


def prefill(engine: Engine) -> Steps:
    """Long prompts prefilled together beside members decoding until the prefill speed is
    timed (engine.chunks keeps it), then the prompts and a decoding member leave: the
    kernels of chunks, of prompts joining a batch that decodes and of a member leaving one
    that goes on are built (a first leaving compiled for 3 s on an H200, every stream
    silent)."""
    with _emptied(engine):
        yield from _grow(engine, DECODING)
        longs = [_member(_text(engine, LONG_TOKENS, i), 2 + i) for i in range(LONG)]
        for member in longs:
            engine.add(member)
        timed = 0
        while timed < TIMED_CHUNKS and any(m.id in engine.uids for m in longs):
            clock = engine.step().clock
            yield
            if clock is not None and clock.prefill >= chunks.LOW // 2 and not clock.new_shape:
                timed += 1
        for member in longs:
            engine.cancel(member.id)
        yield from _leave(engine, 1)


def shapes(engine: Engine) -> None:
    """A calibrated worker's warm-up: its widths, a chunk, members joining and leaving."""
    deadline = time.perf_counter() + SHAPES
    for _ in _shapes(engine):
        if time.perf_counter() > deadline:
            break


def _shapes(engine: Engine) -> Steps:
    with _emptied(engine):
        yield from _grow(engine, engine.max_batch)
        for _ in range(2):
            engine.step()  # the whole width decodes
            yield
        yield from _leave(engine, len(engine.members) - DECODING)
        joining = _member(_text(engine, 2 * engine.chunks.size + 1, 0), 2)
        engine.add(joining)
        while joining.id in engine.uids:
            engine.step()
            yield


@contextlib.contextmanager
def _emptied(engine: Engine) -> Iterator[None]:
    """However a run ends (done, stopped between two steps, or raising), its members leave:
    cancelled, then one step takes them out. Nothing of it stays but its kernels (its
    prompts never enter the prompt cache: engine.py)."""
    try:
        yield
    finally:
        while engine.members or engine.solo or engine.waiting:
            for member in list(engine.members.values()):
                engine.cancel(member.req.id)  # those waiting for its prompt join alone
            if engine.solo is not None:
                engine.cancel(engine.solo[0].req.id)
        if engine.busy:
            engine.step()


def _member(prompt: str, tokens: int) -> Generate:
    return Generate(
        id=next(_ids),
        seq=0,
        attempt=1,
        max_tokens=tokens,
        prompt=prompt,
        ignore_eos=True,
        internal=True,
    )


def _text(engine: Engine, tokens: int, salt: int) -> str:
    """About `tokens` tokens (within half the context), unlike any other salt's."""
    limit = min(tokens, engine.backend.context_length // 2)
    each = max(1, len(engine.backend.tokenizer.encode(PROMPT)))
    return f"{salt} " + PROMPT * max(1, limit // each - salt)


def _grow(engine: Engine, width: int) -> Steps:
    """Members join until `width` of them decode together (each outlives the warm-up; one
    alone would decode alone, solo.py, which the canary warms)."""
    if width < 2:
        return
    lives = engine.backend.context_length // 2
    for i in range(len(engine.members), width):
        engine.add(_member(PROMPT * (1 + i % LENGTHS), lives))
    while engine.batch.decoding < width and engine.busy:
        engine.step()
        yield


def _speed(engine: Engine, width: int) -> Generator[None, None, float]:
    """Tokens/s at `width` (the generator's return value), over `TIMED` steps after two."""
    for _ in range(2):
        engine.step()
        yield
    started = time.perf_counter()
    for _ in range(TIMED):
        engine.step()
    return width * TIMED / (time.perf_counter() - started)


def _leave(engine: Engine, count: int) -> Steps:
    """`count` decoding members leave while the others go on for a step."""
    for member in list(engine.members.values())[: max(0, count)]:
        engine.cancel(member.req.id)
    engine.step()
    yield

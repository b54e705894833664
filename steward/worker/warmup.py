"""Warm shapes: run, at bring-up, the shapes a batch's first burst will meet, so MLX builds
(or loads) their kernels then; and, on a model's first worker, measure what `--max-batch
auto` and the prefill chunks are sized by.

On a GPU, MLX builds kernels the first time it meets an operation's shapes, and a batch
meets new ones as members join in prefill groups, decode together, prefill long prompts in
chunks and leave. A worker that has served only its canary (a hot spare, or any new worker)
would pay that in its first burst, which after a fault is every resumed stream at once:
seconds of silence that every client sees. So before it says `Ready`, a worker on a GPU
runs a bounded batch.

A model's first worker measures (`measure`, `prefill`): members join, a few at a time, until
the batch is at each power-of-two width, decoding a few timed steps at each, until the knee
is passed (width.py); then long prompts prefill together in chunks beside members decoding
until the prefill speed is timed on `TIMED_CHUNKS` chunks (not a shape's first, whose time
is mostly kernels being built), and leave, as does a decoding member of a batch that goes
on. Bounded by `BUDGET` s (half of it for the widths: a big model on a small GPU measures
fewer). Every later worker of the model is given what the first measured (Calibration) and
only runs the shapes (`shapes`): members join up to its width, some leave, one prompt of
two chunks joins those decoding, then leaves; bounded by `SHAPES` s. Both count in the load
time (`bring_up_s`). On a CPU there is nothing to compile and no knee to find: skipped.
"""

from __future__ import annotations

import itertools
import time

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
BUDGET = 30.0  # seconds a first worker's measuring may take: a big model on a small GPU stops early
SHAPES = 3.0  # seconds a later worker's warm-up may take

_ids = itertools.count(-(2**40), -1)  # never a client's id, nor the canary's


def on_gpu() -> bool:
    return runtime.device() == "gpu"


def measure(engine: Engine, widths: list[int], deadline: float) -> dict[int, float]:
    """Tokens/s at each width, widest last, up to the first past the knee."""
    speeds: dict[int, float] = {}
    try:
        for width in widths:
            _grow(engine, width, deadline)
            if engine.batch.decoding < width:
                break  # out of time before the batch was that wide
            speeds[width] = _speed(engine, width)
            if passed(speeds) or time.perf_counter() > deadline:
                break  # the widths measured so far are the ones auto picks from
    finally:
        engine.drop_all()  # nothing of the warm-up stays (its prompts in the prompt cache)
    return speeds


def prefill(engine: Engine, deadline: float) -> None:
    """Long prompts prefilled together beside members decoding until the prefill speed is
    timed (engine.chunks keeps it), then the prompts and a decoding member leave: the
    kernels of chunks, of prompts joining a batch that decodes and of a member leaving one
    that goes on are built (a first leaving compiled for 3 s on an H200, every stream
    silent)."""
    try:
        _grow(engine, DECODING, deadline)
        longs = [_member(_text(engine, LONG_TOKENS, i), 2 + i) for i in range(LONG)]
        for member in longs:
            engine.add(member)
        timed = 0
        while timed < TIMED_CHUNKS and time.perf_counter() < deadline:
            clock = engine.step().clock
            if clock is not None and clock.prefill >= chunks.LOW // 2 and not clock.new_shape:
                timed += 1
            if not any(m.id in engine.uids for m in longs):
                break
        for member in longs:
            engine.cancel(member.id)
        _leave(engine, 1)
    finally:
        engine.drop_all()


def shapes(engine: Engine) -> None:
    """A calibrated worker's warm-up: its widths, a chunk, members joining and leaving."""
    deadline = time.perf_counter() + SHAPES
    try:
        _grow(engine, engine.max_batch, deadline)
        for _ in range(2):
            engine.step()  # the whole width decodes
        _leave(engine, len(engine.members) - DECODING)
        joining = _member(_text(engine, 2 * engine.chunks.size + 1, 0), 2)
        engine.add(joining)
        while joining.id in engine.uids and time.perf_counter() < deadline:
            engine.step()
    finally:
        engine.drop_all()


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


def _grow(engine: Engine, width: int, deadline: float) -> None:
    """Members join until `width` of them decode together (each outlives the warm-up; one
    alone would decode alone, solo.py, which the canary warms)."""
    if width < 2:
        return
    lives = engine.backend.context_length // 2
    for i in range(len(engine.members), width):
        engine.add(_member(PROMPT * (1 + i % LENGTHS), lives))
    while engine.batch.decoding < width and engine.busy and time.perf_counter() < deadline:
        engine.step()


def _speed(engine: Engine, width: int) -> float:
    for _ in range(2):
        engine.step()
    started = time.perf_counter()
    for _ in range(TIMED):
        engine.step()
    return width * TIMED / (time.perf_counter() - started)


def _leave(engine: Engine, count: int) -> None:
    """`count` decoding members leave while the others go on for a step."""
    for member in list(engine.members.values())[: max(0, count)]:
        engine.cancel(member.req.id)
    engine.step()

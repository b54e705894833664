"""Stall bounds from the worker's own step clock: how long a busy worker's silence may last.

Every engine step the worker sends carries its `StepClock`: what the step was (members that
decoded, prompt tokens it prefilled, the first step of a new shape, when MLX builds kernels)
and how long it took on the worker's own clock. A supervisor never infers the device's speed
from a client's TTFT, which includes queueing. The recent steps are kept per kind, for the
model (its workers share the device): decode steps by width, prefill as seconds per prompt
token, first steps of a new shape apart. The bound on the current silence is what the next
step should take given the work in hand (members decoding, prompts still to prefill at the
chunk the worker announced, a width no step of the model has had yet), the slowest of the
last `KEPT` steps of its kind times `HEADROOM`, never below the floor, never above the
ceiling.

The floor covers what no step's clock holds: admitting requests between steps (tokenizing,
the prompt cache), the host's scheduling, the line. On a GPU the device is the worker's own
and its steps vary little: `FLOOR_GPU` keeps a hang's detection within a GPU's 1-2 s
budget. On a CPU the steps share cores with everything on the machine, and a healthy step
varies with the machine's load by more than any headroom over what was measured (a tiny
model's step was silent for over 2 s beside two busy processes on a 2-core machine):
`FLOOR_CPU`, for each rank of a group: its step waits at every collective for the rank the
scheduler ran last, while the ranks already there spin (a group re-formed on two loaded
cores, two mpi ranks beside the next group's bring-up, was silent for over 3 s before its
first step). Until a worker says where it runs, the CPU's.

`--stall-timeout` is the ceiling: the most silence ever tolerated, whatever was measured.
Before anything of the kind in hand is measured (the first worker's first canary, while
kernels compile) the bound is the ceiling.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from steward.wire.protocol import StepClock

HEADROOM = 4.0  # over the slowest recent step of the kind: a loaded machine runs slower
KEPT = 32  # recent steps kept per kind
FLOOR_GPU = 1.0
FLOOR_CPU = 3.0
TIMED = 64  # prompt tokens a prefill step is timed over at least: a prompt's tail is short


@dataclass(frozen=True)
class Work:
    """What the worker has in hand, as the supervisor knows it."""

    width: int  # members in the batch: decoding, or about to
    prompts: tuple[int, ...] = ()  # prompt tokens each admitted prompt still computes
    unadmitted: int = 0  # characters of prompts sent, not yet admitted (tokens <= characters)


def bucket(width: int) -> int:
    """Widths are timed in powers of two: a step's time grows with its width, slowly."""
    size = 1
    while size < width:
        size *= 2
    return size


class StepBounds:
    def __init__(self, ceiling: float) -> None:
        self.ceiling = ceiling
        self.floor = min(FLOOR_CPU, ceiling)
        self.chunk = 0  # the prefill chunk per prompt the worker announced for its next step
        self.widths: set[int] = set()  # widths the model's steps have had
        self._decode: dict[int, deque[float]] = {}  # seconds, by width bucket
        self._prefill: deque[float] = deque(maxlen=KEPT)  # seconds per prompt token
        self._shape: deque[float] = deque(maxlen=KEPT)  # seconds of a new shape's first step

    def device(self, gpu: bool, ranks: int = 1) -> None:
        """Where the model runs, as its worker said, over how many ranks."""
        self.floor = min(FLOOR_GPU if gpu else FLOOR_CPU * ranks, self.ceiling)

    def measured(self, clock: StepClock) -> None:
        """One step of any worker of the model."""
        self.chunk = clock.chunk or self.chunk
        if clock.members:
            self.widths.add(clock.members)
        if clock.new_shape:
            self._shape.append(clock.seconds)
        elif clock.prefill:
            self._prefill.append(clock.seconds / max(clock.prefill, TIMED))
        elif clock.members:
            kept = self._decode.setdefault(bucket(clock.members), deque(maxlen=KEPT))
            kept.append(clock.seconds)

    def allowed(self, work: Work) -> float:
        """Seconds of silence allowed while the worker has `work` in hand."""
        step = self.next_step(work)
        if step is None:
            return self.ceiling
        return min(self.ceiling, max(self.floor, HEADROOM * step))

    def next_step(self, work: Work) -> float | None:
        """What the next step should take at the slowest recent steps of its kinds; None
        when a kind it needs is not measured yet."""
        parts: list[float | None] = []
        if work.width:
            parts.append(self._decode_at(work.width))
        chunked = (min(p, self.chunk or p) for p in work.prompts)
        tokens = sum(chunked) + work.unadmitted
        if tokens:
            parts.append(max(self._prefill) * max(tokens, TIMED) if self._prefill else None)
        if tokens or (work.width and work.width not in self.widths):  # may be a new shape
            parts.append(max(self._shape) if self._shape else None)
        if None in parts:
            return None
        return sum(p for p in parts if p is not None)

    def _decode_at(self, width: int) -> float | None:
        """A decode step at `width`: its bucket's, else a wider one's, else the widest
        narrower one's grown in proportion (a step's time never grows faster than that)."""
        wanted = bucket(width)
        wider = sorted(b for b in self._decode if b >= wanted)
        if wider:
            return max(self._decode[wider[0]])
        if not self._decode:
            return None
        widest = max(self._decode)
        return max(self._decode[widest]) * wanted / widest

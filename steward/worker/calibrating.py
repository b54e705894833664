"""A model's first worker on a GPU serves first and measures between requests.

What sizes a batch on a GPU (the width where tokens/s stops growing, the prefill speed the
chunks are sized by: width.py, chunks.py) is measured once per model and device and kept
(calibration.py). Measuring it means running wide batches and long prompts, and on a machine
whose kernel cache is empty most of that time is MLX building kernels: 37 s of a 45 s first
start on an H200, while `mlx_lm.server` answers its first request in 33 s. So a worker that
has no calibration says `Ready` after its canary, as the peer would, decoding at most
`width.CPU` members (or `--max-batch`) at the default chunk, and measures when it has no
request: one engine step of a warm-up run at a time (warmup.py), until a request comes,
which stops the run in progress (its members leave; the widths already timed are kept, and
the run starts again the next time the worker is idle). Once measured, the engine takes the
calibration, the worker tells the front (`Calibrated`: later workers of the model are given
it) and keeps it on disk for the next start.

Bounded: `BUDGET` s of measuring steps (what was measured then is the calibration, kept, as a
big model on a small GPU measures fewer widths), and `PATIENCE` s from the start for a worker
rarely idle: past it, what was measured serves this worker (the knee among the widths timed,
else the provisional width) and is not kept, so the next start measures again.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from steward.wire.protocol import Calibration
from steward.worker import chunks, warmup, width
from steward.worker.engine import Engine

BUDGET = 30.0  # seconds of measuring steps in all: a big model on a small GPU stops early
PATIENCE = 120.0  # seconds since the worker came up


class Calibrating:
    def __init__(
        self,
        engine: Engine,
        fit: int,
        chosen: int,
        keep: Callable[[Calibration], None],
    ) -> None:
        """`fit`: the members whose contexts fit in memory; `chosen`: `--max-batch` (0:
        auto, the knee decides); `keep`: where a finished calibration is stored."""
        self.engine = engine
        self.provisional = engine.max_batch  # the width served until it is known
        self.fit = fit
        self.chosen = chosen
        self.keep = keep
        self.speeds: dict[int, float] = {}
        self.timed = False  # the prefill speed is
        self.result: Calibration | None = None
        self._run: warmup.Steps | None = None  # the measuring run in progress
        self._spent = 0.0
        self._until = time.monotonic() + PATIENCE

    @property
    def active(self) -> bool:
        """A measuring run is in progress: its members are the engine's only ones."""
        return self._run is not None

    @property
    def done(self) -> bool:
        return self.result is not None

    def step(self) -> Calibration | None:
        """One measuring step, while the worker has no request; the calibration, once it is
        complete (or out of budget: what a big model on a small GPU measures in it)."""
        if self._run is None:
            self._run = self._runs()
        started = time.perf_counter()
        try:
            next(self._run)
        except StopIteration:
            self._run = None
            return self._finish(keep=True)
        self._spent += time.perf_counter() - started
        if self._spent > BUDGET:
            self.stop()
            return self._finish(keep=True)
        return None

    def stop(self) -> None:
        """A request came: the run in progress ends between two steps, its members leave,
        and the batch is as wide as it serves again."""
        if self._run is not None:
            self._run.close()
            self._run = None
            self.engine.widen(self.provisional)

    def expired(self) -> bool:
        return time.monotonic() > self._until

    def finish(self) -> Calibration:
        """Out of patience (a worker rarely idle): what was measured by now serves it, and
        is not kept (the next start measures again)."""
        self.stop()
        return self._finish(keep=False)

    def _runs(self) -> warmup.Steps:
        wanted = [self.chosen] if self.chosen else width.widths(self.fit)
        self.engine.widen(max(wanted))  # the run's members, as wide as it measures
        yield from warmup.widths(self.engine, wanted, self.speeds)  # `chosen`: its shapes
        self.engine.widen(self._width())
        yield from warmup.prefill(self.engine)
        self.timed = True

    def _width(self) -> int:
        if self.chosen:
            return self.chosen
        return min(self.fit, width.knee(self.speeds)) if self.speeds else self.provisional

    def _finish(self, keep: bool) -> Calibration:
        rate = self.engine.chunks.rate if self.timed else 0.0
        self.result = Calibration(self._width(), rate, chunks.sized(rate))
        self.engine.calibrate(self.result)
        if keep:
            self.keep(self.result)
        return self.result

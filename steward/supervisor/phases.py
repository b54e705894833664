"""A bring-up's phases, as the log and `/health` report them.

The supervisor times what the worker cannot, the spawn and the canary; the worker reports
the rest in `Ready.phases` (its process's start, imports, device, load, warm-up, ...).
"""

from __future__ import annotations

import time


class Phases:
    def __init__(self, as_spare: dict[str, float] | None = None) -> None:
        """`as_spare`: a hot spare promoted, whose bring-up was a spare's."""
        self.began = self._lap = time.monotonic()
        self.seconds: dict[str, float] = dict(as_spare or {})
        self.as_spare = as_spare is not None

    def lap(self, name: str) -> None:
        """`name` took the time since the last lap."""
        now = time.monotonic()
        self.seconds[name] = round(now - self._lap, 3)
        self._lap = now

    def ready(self, reported: dict[str, float]) -> None:
        """The worker said it is ready, with its own phases."""
        self._lap = time.monotonic()
        self.seconds |= {name: round(seconds, 3) for name, seconds in reported.items()}

    def text(self) -> str:
        laps = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in self.seconds.items())
        return f"promoted; as a spare: {laps}" if self.as_spare else laps

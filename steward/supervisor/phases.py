"""A bring-up's phases, as the log and `/health` report them.

The supervisor times what the worker cannot: the spawn, the process's start before the
worker's own clock runs (what the worker's phases leave of the wait for its `Ready`), and the
canary. The worker reports the rest in `Ready.phases` (imports, device, load, warm-up, ...).
"""

from __future__ import annotations

import time


class Phases:
    def __init__(self) -> None:
        self.began = self._lap = time.monotonic()
        self.seconds: dict[str, float] = {}

    def lap(self, name: str) -> None:
        """`name` took the time since the last lap."""
        now = time.monotonic()
        self.seconds[name] = round(now - self._lap, 3)
        self._lap = now

    def ready(self, reported: dict[str, float]) -> None:
        """The worker said it is ready: its own phases, and the process's start before them."""
        now = time.monotonic()
        waited, self._lap = now - self._lap, now
        self.seconds["start"] = round(max(0.0, waited - sum(reported.values())), 3)
        self.seconds |= {name: round(seconds, 3) for name, seconds in reported.items()}

    def text(self) -> str:
        return ", ".join(f"{name} {seconds:.2f} s" for name, seconds in self.seconds.items())

"""Restart intensity, after Erlang/OTP's supervisor: at most `max_restarts` in `window` s.

When a restart would exceed it, the supervisor stops trying and escalates (exit 75), so a
crash loop ends honestly instead of spinning forever.
"""

from __future__ import annotations

import time
from collections import deque


class RestartIntensity:
    def __init__(self, max_restarts: int, window: float) -> None:
        self.max_restarts = max_restarts
        self.window = window
        self._restarts: deque[float] = deque()

    def in_window(self) -> int:
        cutoff = time.monotonic() - self.window
        while self._restarts and self._restarts[0] < cutoff:
            self._restarts.popleft()
        return len(self._restarts)

    def allow(self) -> bool:
        """Record one restart; False when it would exceed the intensity."""
        return self.charge() is not None

    def charge(self) -> float | None:
        """Record one restart and return its record (for `withdraw`), or None when it would
        exceed the intensity."""
        if self.in_window() >= self.max_restarts:
            return None
        self._restarts.append(time.monotonic())
        return self._restarts[-1]

    def affordable(self) -> bool:
        """Another restart is within the intensity now."""
        return self.in_window() < self.max_restarts

    def withdraw(self, charged: float) -> None:
        """A restart that proved needless (a suspect that was slow, not hung) is no restart."""
        if charged in self._restarts:
            self._restarts.remove(charged)

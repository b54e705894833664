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
        if self.in_window() >= self.max_restarts:
            return False
        self._restarts.append(time.monotonic())
        return True

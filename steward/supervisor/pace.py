"""The batch's pace: seconds between completions, smoothed, what one queued job costs.
The job path feeds it (dispatch.py); admission reads it for an honest Retry-After."""

from __future__ import annotations

import time

from steward.supervisor.state import State


class Pace:
    def __init__(self) -> None:
        self.job_seconds = 1.0
        self._last = time.monotonic()

    def finished(self) -> None:
        now = time.monotonic()
        self.job_seconds = 0.8 * self.job_seconds + 0.2 * min(now - self._last, 60.0)
        self._last = now

    def retry_after(self, state: State, bring_up_s: float, since: float, queued: int) -> int:
        if state in (State.STARTING, State.RECOVERING):
            return max(1, round(bring_up_s - (time.monotonic() - since)))
        return max(1, round(queued * self.job_seconds))

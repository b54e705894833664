"""Exit codes (SPEC §7), and the exception that carries one out of the supervision loop."""

from __future__ import annotations

EX_SOFTWARE = 70  # a bug in steward ended its supervision loop: restart, report the bug
EX_TEMPFAIL = 75  # the backend cannot recover in this process: restart, with backoff
EX_CONFIG = 78  # configuration or model unusable: restarting will not help


class Exit(Exception):
    """Recovery is impossible in this process: exit with `code`."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason

"""Logging setup: readable lines by default, one JSON object per line with --log-json."""

from __future__ import annotations

import json
import logging
import sys
import time

EXTRAS = ("request_id", "access", "fault", "traceback")
# Loggers a hostile client can make repeat themselves (malformed requests, accept errors
# when file descriptors run out, connections refused over the cap): rate-limited.
NOISY = ("uvicorn.error", "asyncio", "steward.connections")


class RateLimit(logging.Filter):
    """One record per message template per `interval` s; the next one that passes says
    how many were dropped. Templates are few, so the table stays small."""

    def __init__(self, interval: float = 10.0) -> None:
        super().__init__()
        self.interval = interval
        self._seen: dict[tuple[str, str], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg))
        now = time.monotonic()
        last, dropped = self._seen.get(key, (-self.interval, 0))
        if now - last < self.interval:
            self._seen[key] = (last, dropped + 1)
            return False
        self._seen[key] = (now, 0)
        if dropped:
            record.msg = f"{record.msg} [{dropped} alike in {self.interval:g} s not logged]"
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in EXTRAS:
            value = getattr(record, key, None)
            if value:
                entry[key] = value
        if record.exc_info:
            entry["traceback"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def setup(json_lines: bool, level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if json_lines:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    for name in NOISY:
        logging.getLogger(name).addFilter(RateLimit())

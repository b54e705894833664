"""The worker's inbox: messages in the order the front sent them, requests encoded on the way
by a few threads at once.

Encoding a 13k-token prompt is 30-50 ms of tokenizer on an H200 host, which releases the
GIL (prepared.py). Done one after another on the reader's thread, three long prompts held a
short request that came after them for 90 ms; encoded side by side, the short one waits
for the slowest of them only. Order still holds: a request whose encoding is not done
holds every message behind it, so a cancel never overtakes its request and requests join
the batch in the order they came.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

ENCODERS = 4  # requests encoded at once


class Inbox:
    def __init__(self, prepare: Callable[[Any], Any] | None = None) -> None:
        """`prepare`: what a request becomes before the loop takes it (none: as it came)."""
        self.prepare = prepare
        self._pool = ThreadPoolExecutor(ENCODERS, "encoder") if prepare is not None else None
        self._items: deque[Any] = deque()
        self._changed = threading.Condition()

    def put(self, msg: Any, request: bool = False) -> None:
        """A message from the front (`request`: one to prepare first)."""
        if request and self._pool is not None:
            future = self._pool.submit(self.prepare, msg)
            future.add_done_callback(self._ready)
            msg = future
        with self._changed:
            self._items.append(msg)
            self._changed.notify()

    def take(self, wait: bool) -> list[Any]:
        """Every message that is ready, in order, up to the first still being encoded; with
        `wait`, block until there is one."""
        with self._changed:
            if wait:
                self._changed.wait_for(self._head_ready)
            taken = []
            while self._head_ready():
                taken.append(_opened(self._items.popleft()))
            return taken

    def get(self) -> Any:
        """The next message, waiting for it."""
        with self._changed:
            self._changed.wait_for(self._head_ready)
            return _opened(self._items.popleft())

    def _head_ready(self) -> bool:
        if not self._items:
            return False
        head = self._items[0]
        return not isinstance(head, Future) or head.done()

    def _ready(self, _: Future) -> None:
        with self._changed:
            self._changed.notify_all()


def _opened(item: Any) -> Any:
    """A message as the loop takes it: a request's encoding, or the message itself."""
    return item.result() if isinstance(item, Future) else item

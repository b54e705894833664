"""Stored responses (`store: true`, the Responses API's default), bounded in bytes and age.

The store lives in the front process's memory: a worker fault, a replay or a worker
replacement leaves it as it was; a restart of steward itself empties it (a
`previous_response_id` from before is then a 400 that says so). Each record holds its
response's whole conversation (the history it continued, its own input, its output), so
continuing a chain needs only its newest response: evicting older ones never breaks a
newer one. Records leave oldest first, when they are older than `--responses-store-age`
seconds or when the records' bytes (their JSON) would pass `--responses-store-bytes`; a
record larger than the whole budget is not kept at all. Counting each record's whole
history is conservative: a long chain's records share their items in memory.

A client that sends `store: false` and its whole history each turn (Codex) never touches
the store.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Stored:
    response: dict[str, Any]  # the response object, as it was answered
    input_items: list[dict[str, Any]]  # this request's own input, each item with an id
    history: list[dict[str, Any]]  # the items before those: a continued chain's
    size: int = 0
    at: float = 0.0

    def conversation(self) -> list[dict[str, Any]]:
        """What a response continuing this one follows: everything this one saw, and its
        output."""
        return [*self.history, *self.input_items, *self.response["output"]]


@dataclass
class ResponseStore:
    max_bytes: int
    max_age: float
    clock: Callable[[], float] = time.monotonic
    records: OrderedDict[str, Stored] = field(default_factory=OrderedDict)
    bytes: int = 0
    evicted: int = 0

    def put(self, record: Stored) -> bool:
        """Keep `record` (under its response's id), evicting the oldest to make room;
        False if it is larger than the whole budget, and so not kept."""
        record.size = len(
            json.dumps([record.response, record.input_items, record.history], ensure_ascii=False)
        )
        record.at = self.clock()
        self.delete(record.response["id"])
        self._expire()
        if record.size > self.max_bytes:
            return False
        while self.records and self.bytes + record.size > self.max_bytes:
            self._evict_oldest()
        self.records[record.response["id"]] = record
        self.bytes += record.size
        return True

    def get(self, response_id: str) -> Stored | None:
        self._expire()
        return self.records.get(response_id)

    def delete(self, response_id: str) -> bool:
        record = self.records.pop(response_id, None)
        if record is None:
            return False
        self.bytes -= record.size
        return True

    def _expire(self) -> None:
        oldest = self.clock() - self.max_age
        while self.records and next(iter(self.records.values())).at < oldest:
            self._evict_oldest()

    def _evict_oldest(self) -> None:
        _, record = self.records.popitem(last=False)
        self.bytes -= record.size
        self.evicted += 1

"""Strikes that follow the evidence: which payloads the faults name, and which are refused.

A payload is a request's model and body hash (its digest): a client retrying a poison
request sends new requests with the same payload, and clients asking the same question send
one payload between them, so strikes and acquittals are kept per payload, never per
request. A fault names a payload when it was in flight alone, or once every other payload in
flight at that fault has finished since (acquitted); a fault with two unresolved payloads
names neither. A payload named by `NAMED` faults within the window is quarantined; one copy
that finishes clears every strike it had. Only the order of faults and acquittals decides
(they are numbered as they happen), never how far apart they fell; the window only expires
old records. A suspected hang strikes at once (its suspects run again on the spare, and a
poison that hangs every worker must still be named); if the suspect proves slow, not hung,
its strike is withdrawn, and a quarantine that rested on it is lifted.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

NAMED = 2  # faults naming a payload before it is refused: a first one may be transient
MAX_TRACKED = 1024  # faults remembered (the window expires them sooner, as a rule)


@dataclass(frozen=True)
class _Fault:
    order: int
    at: float
    digests: frozenset[str]


class Quarantine:
    def __init__(self, window: float) -> None:
        self.window = window
        self._order = itertools.count(1)
        self._faults: deque[_Fault] = deque(maxlen=MAX_TRACKED)
        self._acquitted: dict[str, int] = {}  # digest -> order of its last finished copy
        self._until: dict[str, float] = {}  # quarantined digest -> monotonic end

    def fault(self, digests: Iterable[str]) -> int:
        """A fault struck with these payloads in flight: its strike (for `withdraw`). The
        payloads it quarantines are `blocked` from now on."""
        strike = next(self._order)
        self._faults.append(_Fault(strike, time.monotonic(), frozenset(digests)))
        self._convict()
        return strike

    def withdraw(self, strike: int) -> None:
        """That fault was none (a slow worker, not a hung one): it names no payload, and a
        payload it helped quarantine is free again unless the other faults still name it."""
        withdrawn = [f for f in self._faults if f.order == strike]
        self._faults = deque((f for f in self._faults if f.order != strike), MAX_TRACKED)
        for fault in withdrawn:
            for digest in fault.digests & self._until.keys():
                if self.named(digest) < NAMED:
                    del self._until[digest]

    def acquit(self, digest: str) -> list[str]:
        """A copy of `digest` finished: its strikes are cleared, and the earlier faults it
        was in may now name the one payload left of them (those are returned, quarantined)."""
        if not any(digest in fault.digests for fault in self._recent()):
            return []  # in flight at no fault: nothing it could clear or complete
        self._acquitted[digest] = next(self._order)
        return self._convict()

    def named(self, digest: str) -> int:
        """How many faults within the window name this payload."""
        return sum(self._names(fault, digest) for fault in self._recent())

    def struck(self, digest: str) -> bool:
        """In flight at a fault since it last finished: not cleared yet."""
        cleared = self._acquitted.get(digest, 0)
        return any(f.order > cleared and digest in f.digests for f in self._recent())

    def blocked(self, digest: str) -> bool:
        until = self._until.get(digest)
        if until is not None and until < time.monotonic():
            del self._until[digest]
            return False
        return until is not None

    def __len__(self) -> int:
        now = time.monotonic()
        return sum(until >= now for until in self._until.values())

    def _names(self, fault: _Fault, digest: str) -> bool:
        if digest not in fault.digests or self._acquitted.get(digest, 0) > fault.order:
            return False
        others = fault.digests - {digest}
        return all(self._acquitted.get(other, 0) > fault.order for other in others)

    def _recent(self) -> deque[_Fault]:
        """The faults within the window (older ones dropped first)."""
        cutoff = time.monotonic() - self.window
        while self._faults and self._faults[0].at < cutoff:
            self._faults.popleft()
        return self._faults

    def _convict(self) -> list[str]:
        candidates = {d for fault in self._recent() for d in fault.digests}
        convicted = sorted(d for d in candidates if not self.blocked(d) and self.named(d) >= NAMED)
        for digest in convicted:
            self._until[digest] = time.monotonic() + self.window
        if len(self._acquitted) > MAX_TRACKED:
            self._acquitted = {d: o for d, o in self._acquitted.items() if d in candidates}
        return convicted

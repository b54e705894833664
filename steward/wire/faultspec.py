"""Fault-injection specs (SPEC §6): `POINT:ACTION[:TRIGGER][,model=NAME]`, for tests and
drills only. `model=NAME` aims a spec at one model's workers (SPEC §9); without it, a spec
is every model's, each counting its own requests.

Parsed in the front (a bad spec is a configuration error), scheduled there (`Periods`: the
front sees every request across workers), and acted on in the worker (worker/injection.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass

POINTS = ("load", "prefill", "decode", "verify", "supervisor")
ACTIONS = ("raise", "poison", "hang", "crash", "oom", "slow")
# `supervisor` stands for a bug in steward's own loop, not a backend fault: `raise` fails
# the request being dispatched, `crash` ends the supervision loop (exit 70). `verify` stands
# for a device whose verify steps cost more than the tokens they give (`slow=S:every` only).
SUPERVISOR_ACTIONS = ("raise", "crash")


@dataclass(frozen=True)
class FaultSpec:
    point: str
    action: str
    seconds: float = 0.0
    nth: int | None = 1
    marker: str | None = None
    period: float | None = None  # seconds: a chaos schedule (bench/soak.py)
    offset: float = 0.0  # seconds before the first period's request
    token: int | None = None  # `nth=N@K`: at the request's K-th token (decode), not its first
    model: str | None = None  # `model=NAME`: that model's workers alone

    @property
    def every(self) -> bool:
        return self.nth is None and self.marker is None and self.period is None

    def matches(self, seq: int, attempt: int, prompt: str, generation: int, token: int = 0) -> bool:
        """`nth` counts requests the server received (the front numbers them, across
        workers) and fires on a request's first attempt only, so a replay is not faulted
        again (with `@K`, at its K-th token: a fault mid-answer, past the request's first
        steps); `marker` fires on every attempt (a poison request); for `load`, `nth`
        counts workers."""
        if self.token is not None and token != self.token:
            return False
        if self.every:
            return True
        if self.marker is not None:
            return self.marker in prompt
        if self.point == "load":
            return self.nth == generation
        return self.nth == seq and attempt == 1


def parse(text: str) -> FaultSpec:
    """`decode:poison:nth=3` -> FaultSpec; ValueError says what is wrong."""
    parts = text.strip().split(":", 2)
    if len(parts) < 2:
        raise ValueError(f"fault spec {text!r}: expected POINT:ACTION[:TRIGGER]")
    point, action = parts[0], parts[1]
    trigger, model = _aimed(parts[2] if len(parts) == 3 else "nth=1")
    return dataclasses.replace(_parse(text, point, action, trigger), model=model)


def _aimed(trigger: str) -> tuple[str, str | None]:
    """`TRIGGER,model=NAME` or `model=NAME` (its first request): the trigger and the model."""
    head, _, aim = trigger.rpartition(",") if "," in trigger else ("", "", trigger)
    key, _, name = aim.partition("=")
    if key != "model":
        return trigger, None
    if not name:
        raise ValueError(f"fault trigger {trigger!r}: model=NAME names a configured model")
    return head or "nth=1", name


def _parse(text: str, point: str, action: str, trigger: str) -> FaultSpec:
    if point not in POINTS:
        raise ValueError(f"fault spec {text!r}: point must be one of {', '.join(POINTS)}")
    name, _, arg = action.partition("=")
    if name not in ACTIONS or (name == "slow") != bool(arg):
        raise ValueError(f"fault spec {text!r}: action must be one of {', '.join(ACTIONS)}=S")
    if point == "supervisor" and name not in SUPERVISOR_ACTIONS:
        raise ValueError(f"fault spec {text!r}: supervisor takes {' or '.join(SUPERVISOR_ACTIONS)}")
    seconds = float(arg) if arg else 0.0
    if point == "verify" and (name != "slow" or trigger != "every"):
        raise ValueError(f"fault spec {text!r}: verify takes slow=S:every")
    if trigger == "every":
        return FaultSpec(point, name, seconds, nth=None)
    key, _, value = trigger.partition("=")
    nth, _, at = value.partition("@")
    if key == "nth" and nth.isdigit() and int(nth) >= 1 and (not at or point == "decode"):
        if not at:
            return FaultSpec(point, name, seconds, nth=int(nth))
        if at.isdigit() and int(at) >= 2:
            return FaultSpec(point, name, seconds, nth=int(nth), token=int(at))
    if key == "marker" and value and point != "load":
        return FaultSpec(point, name, seconds, nth=None, marker=value)
    if key == "period" and point not in ("load", "supervisor"):
        period, _, offset = value.partition("+")
        with contextlib.suppress(ValueError):
            if float(period) > 0 and float(offset or 0) >= 0:
                return FaultSpec(
                    point, name, seconds, None, None, float(period), float(offset or 0)
                )
    raise ValueError(
        f"fault spec {text!r}: trigger must be nth=N (decode: nth=N@K, K >= 2), every, "
        "marker=TEXT or period=S[+OFFSET], then ,model=NAME to aim it at one model"
    )


def parse_all(texts: list[str]) -> list[FaultSpec]:
    """Each text may hold several specs separated by ';' (as STEWARD_INJECT_FAULT does)."""
    return [parse(t) for text in texts for t in text.split(";") if t.strip()]


class Periods:
    """`period=S[+OFFSET]` triggers, decided in the front, which sees every request across
    workers: a spec arms the first request started once its time has come (OFFSET s after
    the first request, then every S s), and fires on that request's first attempt. One spec
    a request, so faults that fall due together still each get a request of their own."""

    def __init__(self, specs: list[FaultSpec]) -> None:
        self.specs = specs
        self.due: dict[int, float] = {}  # from the first request on

    def arm(self) -> list[int]:
        """The spec (its index) that fires on the request being started now, if any."""
        now = time.monotonic()
        if not self.due:
            self.due = {i: now + s.offset for i, s in enumerate(self.specs) if s.period}
        ready = [i for i, due in self.due.items() if now >= due]
        if not ready:
            return []
        first = min(ready, key=self.due.__getitem__)
        self.due[first] = now + (self.specs[first].period or 0.0)
        return [first]

"""A request as the supervisor sees it (`Job`), and the bounded FIFO it waits in.

The HTTP handler owns the client side of a job (it reads `events`); the scheduler owns its
lifecycle, one `JobStatus` it alone sets (scheduler.py), and a job ends in one place that
sets its status and pushes its last event (`Dispatcher.end`); everything else asks. Everything
happens on one event loop, so no locks.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum

import msgspec

from steward.errors import ApiError, Overflow
from steward.supervisor.facts import PromptBound
from steward.wire.protocol import CallDelta, Done, Embed, Generate, Logprob, Token

Event = Token | Done | ApiError

_ids = itertools.count(1)


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUSPECT = "suspect"  # in flight at a fault: waits for its probation group
    FINISHED = "finished"  # answered
    FAILED = "failed"  # ended with an error (its last event)
    CANCELLED = "cancelled"
    QUARANTINED = "quarantined"

    @property
    def ended(self) -> bool:
        return self in (S.FINISHED, S.FAILED, S.CANCELLED, S.QUARANTINED)


S = JobStatus


@dataclass(eq=False)
class Job:
    request: Generate | Embed  # the validated body, as the worker will get it
    seq: int
    request_id: str
    digest: str  # hash of model + encoded payload, for quarantine
    prompt_chars: int = 0  # characters of the prompt's text (an Embed's longest input's)
    stream: bool = False
    id: int = field(default_factory=lambda: next(_ids))
    status: JobStatus = JobStatus.QUEUED  # set by the scheduler alone
    attempts: int = 0
    sent: bool = False  # something of the answer reached the client: no replay
    answered: bool = False  # its last event is in `events`: any later one is dropped
    queued_at: float = field(default_factory=time.monotonic)
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    prefill: int = 0  # prompt tokens this attempt computes (the worker's `Admitted`)
    fresh: int = 0  # tokens this attempt generated
    text: list[str] = field(default_factory=list)  # the answer so far
    reasoning: list[str] = field(default_factory=list)  # a thinking model's thinking so far
    generated: list[int] = field(default_factory=list)  # its token ids
    logprobs: list[Logprob] = field(default_factory=list)  # when asked for
    calls: list[CallDelta] = field(default_factory=list)  # tool calls, in parts
    armed: list[int] = field(default_factory=list)  # periodic fault injection (SPEC §6)
    # when the recovery under way should end, or the last one ended (monotonic; 0: none)
    recovery: Callable[[], float] = lambda: 0.0

    def message(self) -> Generate | Embed:
        """What the worker gets; a stream the client already reads resumes after the
        tokens it was sent (the worker continues from prompt + those tokens). Nothing of
        an embedding is sent before its end: it always runs again whole."""
        resumed = {"resume": list(self.generated)} if self.sent else {}
        return msgspec.structs.replace(
            self.request,
            id=self.id,
            seq=self.seq,
            attempt=self.attempts,
            armed=self.armed,
            **resumed,
        )

    def too_long(self, bound: PromptBound | None) -> ApiError | None:
        """A prompt that cannot fit the context, decided without tokenising it (None: it
        may fit, or no worker has said the bound yet): a prompt has at least
        `bound.least_tokens` of its characters. An embedding's every input must fit the
        context, and it wants no completion."""
        if bound is None:
            return None
        context_length = bound.context_length
        wanted = (self.request.max_tokens or 1) if isinstance(self.request, Generate) else 0
        if wanted >= context_length:
            return ApiError(
                "context_length_exceeded",
                f"This model's maximum context length is {context_length} tokens; "
                f"{wanted} were requested for the completion alone.",
            )
        least = bound.least_tokens(self.prompt_chars)
        if least <= context_length - wanted:
            return None
        return ApiError.too_long(Overflow(least, context_length, wanted, at_least=True))

    def waits_until(self, queue_timeout: float, deadline: float) -> float:
        """When waiting for it ends (the request's `deadline` at the latest).
        `--queue-timeout` bounds the wait for a first turn, from when it was queued, or from
        the end of a recovery that it met (expected, while one is under way) when that end
        is within its deadline: no request is refused because a recovery it can wait for is
        slow. A job the server has started is owed its answer, so a fault that sends it back
        to wait (for a replacement worker, which on a GPU takes a load and a warm-up, or for
        its probation group) leaves it bounded by its deadline alone."""
        if self.running or self.finished or self.attempts:
            return deadline
        start = self.queued_at
        if start < (end := self.recovery()) < deadline:
            start = end
        return min(start + queue_timeout, deadline)

    @property
    def running(self) -> bool:
        return self.status is JobStatus.RUNNING

    @property
    def finished(self) -> bool:
        """Nothing more will happen to it (the handler stops waiting): its status says so."""
        return self.status.ended

    @property
    def started(self) -> bool:
        """This attempt has shown progress: a token, so its prompt went through."""
        return self.fresh > 0

    def restart(self) -> None:
        """A new attempt: from scratch, unless the client has part of the answer already."""
        self.attempts += 1
        self.prefill = self.fresh = 0
        if not self.sent:
            self.text.clear()
            self.reasoning.clear()
            self.generated.clear()
            self.logprobs.clear()
            self.calls.clear()

    def admitted(self, prefill: int) -> None:
        """The worker took this attempt in, with `prefill` prompt tokens to compute."""
        self.prefill = prefill

    def add(self, token: Token) -> None:
        """A token of the current attempt; only a streaming client sees it before the end."""
        self.fresh += 1
        self.text.append(token.text)
        if token.reasoning:
            self.reasoning.append(token.reasoning)
        if token.token >= 0:
            self.generated.append(token.token)
        if token.logprob is not None:
            self.logprobs.append(token.logprob)
        self.calls += token.calls
        if self.stream and (token.text or token.reasoning or token.logprob or token.calls):
            self.sent = True
            self.push(token)

    def push(self, event: Event) -> None:
        if not self.answered:
            self.answered = isinstance(event, Done | ApiError)
            self.events.put_nowait(event)


class JobQueue:
    """Bounded FIFO; replayed jobs go back to the head, they were first in line."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self._items: deque[Job] = deque()

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Job]:
        return iter(self._items)

    def full(self) -> bool:
        return len(self._items) >= self.maxsize

    def put(self, job: Job, *, front: bool = False) -> None:
        job.queued_at = time.monotonic()
        (self._items.appendleft if front else self._items.append)(job)

    def remove(self, job: Job) -> None:
        if job in self._items:
            self._items.remove(job)

    def drain(self) -> list[Job]:
        items, self._items = list(self._items), deque()
        return items

    def pop(self) -> Job | None:
        return self._items.popleft() if self._items else None

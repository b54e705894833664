"""Output processing: a step's tokens made into what the client gets, apart from the step.

As vLLM V1 keeps its `OutputProcessor` (detokenizing, stop strings) apart from the
`EngineCore` that steps the model, the engine's step (engine.py) ends when its tokens are on
the host, and hands them over as one `Drawn`; `Outputs.process` turns that into the `Step`
the front gets: each token's text through its member's `Answer` (detokenizer, thinking
split, stop strings, tool calls) and each finished member's `Done`. In the worker,
`Pipeline` runs it on a thread of its own, in the order the steps were drawn, while the step
thread computes the next step; the step's clock (`StepClock`) times only the step.

Exactness. A stop string (or the end of a forced tool call) is found here, after the step
that drew its token. The member is `ended` at that token: no later token of its row is fed
to its answer or sent, and its `Done` counts the tokens up to it. Before the engine counts
the next step's tokens it waits until this step is processed (`settled`) and takes the
ended members out of the batch then: such a row leaves one step later than the text ended
(it computed one token more, never seen), and usage, `max_tokens` and the fault-injection
points, all counted on the step thread, see exactly the tokens they saw before.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from steward.wire.protocol import Done, FromWorker, Logprob, Step, StepClock, Token

if TYPE_CHECKING:
    from steward.worker.diskcache import DiskCache
    from steward.worker.engine import Member


class Row(NamedTuple):
    """A member's token from a step: -1 for the end token that ends its sequence (no token
    of its own); `finish`, the model's own end ("stop" at the end token, or "length");
    `count`, the member's tokens up to this one (a verify step gives a member several)."""

    member: Member
    token: int
    finish: str | None
    logprob: Logprob | None
    count: int


@dataclass(eq=False, kw_only=True)
class Drawn:
    """What one engine step drew, in the order the members' text must see it: the members
    that ended between steps (cancelled, or with nothing left to generate), then each row."""

    ends: list[tuple[Member, str]] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    prefilled: list[int] = field(default_factory=list)  # request ids a prefill chunk advanced
    size: int = 0  # members in the batch at the step
    clock: StepClock | None = None


class Outputs:
    """Each member's text and end; what ended by its text goes back to the step thread."""

    def __init__(self, disk: DiskCache | None) -> None:
        self.disk = disk
        self.lock = threading.Condition()
        self.pending = 0  # handed to the output thread, not processed yet
        self.stopped: list[Member] = []  # ended by their text, still rows of the batch
        self.error: Exception | None = None  # raised while processing: the batch fails
        self.lost: list[Member] = []  # the members of the step whose processing raised

    def process(self, drawn: Drawn) -> Step:
        """The step's message. If it raises, the batch fails: the members it was about
        are `lost` (their rows may have left the batch already), for the engine to name."""
        about = [member for member, _ in drawn.ends] + [row.member for row in drawn.rows]
        live = [member for member in about if not member.ended]
        try:
            return self._process(drawn)
        except Exception:
            self.lost = live
            raise

    def _process(self, drawn: Drawn) -> Step:
        tokens: list[Token] = []
        done = [self._end(member, finish) for member, finish in drawn.ends if not member.ended]
        stopped = []
        for row in drawn.rows:
            member = row.member
            if member.ended:
                continue  # drawn after its text ended: nobody sees it
            member.batch = max(member.batch, drawn.size)
            real = row.token >= 0
            piece = member.answer.feed(row.token if real else None, row.finish)
            if real or not piece.empty:
                tokens.append(piece.token(member.req.id, row.token, row.logprob))
            if piece.finish is not None:
                done.append(self._end(member, piece.finish, row.count))
                if row.finish is None:  # still a row of the batch: the engine takes it out
                    stopped.append(member)
        with self.lock:
            self.stopped += stopped
        return Step(tokens=tokens, done=done, prefilled=drawn.prefilled, clock=drawn.clock)

    def settled(self) -> tuple[list[Member], float]:
        """Once every step handed over is processed: the members that ended by their text
        since the last call, and the seconds waited. Raises what processing raised."""
        started = time.perf_counter()
        with self.lock:
            self.lock.wait_for(lambda: self.pending == 0)
            stopped, self.stopped = self.stopped, []
            error, self.error = self.error, None
        if error is not None:
            raise error
        return stopped, time.perf_counter() - started

    def _end(self, member: Member, finish: str, count: int | None = None) -> Done:
        """Usage counts the whole answer once, up to the token that ended it (`count`; else
        all the member's); speeds, this attempt's own tokens."""
        member.ended = True
        now = time.perf_counter()
        count = member.count if count is None else count
        new = count - member.resumed
        drafter = member.drafter
        return Done(
            member.req.id,
            finish,
            prompt_tokens=member.prompt_tokens,
            completion_tokens=count,
            ttft=(member.first or now) - member.admitted,
            decode_tps=(new - 1) / (now - member.first) if new > 1 else 0.0,
            cached_tokens=member.cached_tokens,
            batch=member.batch,
            reasoning_tokens=member.answer.reasoning_tokens,
            stop_sequence=member.answer.stop_sequence,
            accepted_prediction_tokens=drafter.accepted if drafter else 0,
            rejected_prediction_tokens=drafter.rejected if drafter else 0,
            disk=self.disk.use(member.disk) if self.disk and not member.req.internal else None,
        )


class Pipeline:
    """The output thread: each step's `Drawn` processed and sent, in order. Every other
    message of the step thread goes through it too, so the front sees them in the order
    they were made (an admission before its tokens, a step's tokens before a `Failed`)."""

    def __init__(self, outputs: Outputs, send: Callable[[FromWorker], None]) -> None:
        self.outputs = outputs
        self.send = send
        self.queue: queue.SimpleQueue[Drawn | FromWorker | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, daemon=True, name="outputs")
        self.thread.start()

    def put(self, item: Drawn | FromWorker) -> None:
        if isinstance(item, Drawn):
            with self.outputs.lock:
                self.outputs.pending += 1
        self.queue.put(item)

    def close(self) -> None:
        """Once what was put is sent, the thread ends."""
        self.queue.put(None)
        self.thread.join()

    def _run(self) -> None:
        while (item := self.queue.get()) is not None:
            if isinstance(item, Drawn):
                item = self._processed(item)
                if not (item.tokens or item.done or item.prefilled):
                    continue
            try:
                self.send(item)
            except OSError:
                os._exit(0)  # the front is gone: nobody is left to serve

    def _processed(self, drawn: Drawn) -> Step:
        """The step's message; a failure to process it fails the batch on the step thread
        (`settled` raises it), and the message carries nothing."""
        outputs = self.outputs
        try:
            return outputs.process(drawn)
        except Exception as exc:
            with outputs.lock:
                outputs.error = exc
            return Step()
        finally:
            with outputs.lock:
                outputs.pending -= 1
                outputs.lock.notify_all()

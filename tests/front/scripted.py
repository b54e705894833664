"""The front over a scripted supervisor: every dialect's translation tested in milliseconds,
in process, with no worker.

`ScriptedSupervisor` has the supervisor's public surface (`submit`, `cancel`,
`queue_error`, `retry_after`, `status`, `source.model_id`, `context_length`, `started_at`).
Each submitted job is answered by `script(job)`: the events to deliver (`Token`s, then a
`Done`, or an `ApiError`), or an `ApiError` raised at submit. `client()` is a Starlette
`TestClient` over `create_app` with it. `forced()` scripts a forced tool call's answer
through the worker's own rules (worker/toolcalls.py), as the request asked for it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

from starlette.testclient import TestClient

from steward.config import ServeConfig
from steward.errors import ApiError
from steward.front.app import create_app
from steward.ops.metrics import Metrics
from steward.supervisor.state import State
from steward.wire.protocol import CallDelta, Done, Generate, Logprob, Token
from steward.worker.answer import Answer
from steward.worker.toolcalls import FORCED, ToolCalls

MODEL = "scripted-model"


@dataclass(eq=False)
class ScriptedJob:
    request: Generate
    stream: bool
    running: bool = True
    finished: bool = False
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    text: list[str] = field(default_factory=list)
    logprobs: list[Logprob] = field(default_factory=list)
    calls: list[CallDelta] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)

    def deliver(self, events: list[Token | Done | ApiError]) -> None:
        for event in events:
            if isinstance(event, Token):
                self.text.append(event.text)
                self.calls += event.calls
                self.reasoning.append(event.reasoning)
                if event.logprob is not None:
                    self.logprobs.append(event.logprob)
                if not self.stream:
                    continue
            self.finished = not isinstance(event, Token)
            self.events.put_nowait(event)

    def waits_until(self, queue_timeout: float, deadline: float) -> float:
        """A scripted job is running from its submit: bounded by its deadline alone."""
        return deadline


def done(completion: int = 1, finish: str = "stop", prompt: int = 5) -> Done:
    return Done(0, finish, prompt, completion, ttft=0.01, decode_tps=100.0)


def says(*pieces: str, finish: str = "stop") -> list[Token | Done | ApiError]:
    """An answer of these tokens' text."""
    return [*(Token(0, i, text) for i, text in enumerate(pieces)), done(len(pieces), finish)]


def forced(
    job: ScriptedJob, *pieces: str, finish: str = "stop", completion: int = 0
) -> list[Token | Done]:
    """A forced tool call's answer of the model's text in these pieces, as the worker
    sends it for the job's request: the calls found and the rules about the answer applied
    by the worker's own `Answer`, in the mode, name and parallel calls the front asked.
    `completion`: the tokens it took (0: a token a piece)."""
    request = job.request
    assert request.calls in FORCED, "not a forced call: the front asked for none"
    calls = ToolCalls(request.calls, request.call_name, parallel=request.parallel_calls)
    answer = Answer(None, request.stop, calls)  # fed text, it needs no detokenizer
    events: list[Token | Done] = []
    for i, text in enumerate(pieces):
        piece = answer.feed_text(text, finish if i == len(pieces) - 1 else None)
        events.append(piece.token(0, i, None))
    assert piece.finish is not None
    return [*events, done(completion or len(pieces), piece.finish)]


Script = Callable[[ScriptedJob], list[Token | Done | ApiError]]


class ScriptedSupervisor:
    def __init__(self, script: Script, context_length: int = 2048) -> None:
        self.script = script
        self.source = SimpleNamespace(model_id=MODEL)
        self.context_length = context_length
        self.started_at = time.time()
        self.jobs: list[ScriptedJob] = []
        self.cancelled: list[ScriptedJob] = []

    def submit(
        self, request: Generate, prompt_chars: int, request_id: str, digest: str, stream: bool
    ) -> ScriptedJob:
        if (request.max_tokens or 1) >= self.context_length:
            raise ApiError("context_length_exceeded", "too long for the context")
        job = ScriptedJob(request, stream)
        self.jobs.append(job)
        job.deliver(self.script(job))
        return job

    def cancel(self, job: ScriptedJob) -> None:
        self.cancelled.append(job)

    def queue_error(self) -> ApiError:
        return ApiError("overloaded", "scripted queue", 1)

    def retry_after(self) -> int:
        return 1

    def status(self) -> State:
        return State.READY

    def snapshot(self) -> Any:
        raise NotImplementedError("no metrics scrape over a scripted supervisor")


def client(script: Script, **config: Any) -> tuple[TestClient, ScriptedSupervisor]:
    supervisor = ScriptedSupervisor(script)
    settings = replace(ServeConfig(), **config)
    app = create_app(settings, supervisor, Metrics(supervisor))  # type: ignore[arg-type]
    return TestClient(app, raise_server_exceptions=False), supervisor

"""Driving a real `Supervisor` over fake worker lines (fakelink.py), in milliseconds."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from steward.config import ServeConfig
from steward.errors import ApiError
from steward.model.resolve import ModelSource
from steward.supervisor.jobs import Job
from steward.supervisor.supervisor import Supervisor
from steward.wire.protocol import Done, Generate, Token
from tests.supervisor.fakelink import TOKENS, Script

SOURCE = ModelSource("gguf", Path("fake.gguf"), "fake")


async def until(check: Callable[[], bool], within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


async def start(script: Script, **config: Any) -> Supervisor:
    settings = {"stall_timeout": 0.3, "queue_timeout": 5.0, "standby": "none", **config}
    supervisor = Supervisor(ServeConfig(**settings), SOURCE, [], spawn=script.spawn)
    supervisor.start()
    await until(lambda: supervisor.state.serving)
    return supervisor


def submit(supervisor: Supervisor, i: int, stream: bool = False, digest: str = "") -> Job:
    request = Generate(id=0, seq=0, attempt=0, max_tokens=TOKENS, prompt=f"prompt {i}")
    return supervisor.submit(request, 8, f"req-{i}", digest or f"payload-{i}", stream)


async def outcome(job: Job) -> tuple[list[int], Done | ApiError]:
    """What the client got: streamed token ids, then the end."""
    tokens = []
    while True:
        event = await asyncio.wait_for(job.events.get(), 5.0)
        if isinstance(event, Token):
            tokens.append(event.token)
        else:
            return tokens, event


async def answered(job: Job) -> None:
    """The job got its whole answer."""
    _, end = await outcome(job)
    assert isinstance(end, Done) and end.completion_tokens == TOKENS


def run(scenario: Callable[[], Any]) -> Any:
    return asyncio.run(scenario())

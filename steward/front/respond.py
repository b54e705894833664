"""The client's side of a job: wait for it within its deadlines, answer as JSON or SSE.

A streaming response starts only once the first token exists, so a fault before it can
still be replayed, or answered as an ordinary error response rather than a broken stream.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from steward.config import ServeConfig
from steward.errors import ApiError
from steward.ops.metrics import Metrics
from steward.supervisor.jobs import Event, Job
from steward.supervisor.supervisor import Supervisor
from steward.worker.protocol import Done, Token


class Waiter:
    """Turns a job's events into values or `ApiError`s, enforcing queue and request deadlines."""

    def __init__(
        self, job: Job, supervisor: Supervisor, config: ServeConfig, metrics: Metrics
    ) -> None:
        self.job = job
        self.supervisor = supervisor
        self.config = config
        self.metrics = metrics
        self.deadline = time.monotonic() + config.request_timeout

    async def next(self) -> Token | Done:
        job = self.job
        while True:
            now = time.monotonic()
            if job.running or job.finished:
                timeout = self.deadline - now
            else:
                timeout = min(job.queued_at + self.config.queue_timeout, self.deadline) - now
            try:
                async with asyncio.timeout(max(timeout, 0)):
                    event: Event = await job.events.get()
            except TimeoutError:
                if not job.events.empty():
                    continue
                if time.monotonic() >= self.deadline:
                    raise ApiError(
                        "generation_timeout",
                        f"No answer within {self.config.request_timeout:.0f} s (request-timeout).",
                    ) from None
                if not job.running:
                    raise self.supervisor.queue_error() from None
                continue
            if isinstance(event, ApiError):
                raise event
            return event

    def close(self) -> None:
        if not self.job.finished:
            self.supervisor.cancel(self.job)


class Answer:
    """Shapes one OpenAI response (chat or text completion) around a job."""

    def __init__(self, kind: str, model: str, request_id: str, include_usage: bool) -> None:
        self.chat = kind == "chat"
        self.model = model
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + request_id[:48]
        self.object = "chat.completion" if self.chat else "text_completion"
        self.created = int(time.time())
        self.include_usage = include_usage

    def _base(self, suffix: str = "") -> dict[str, Any]:
        return {
            "id": self.id,
            "object": self.object + suffix,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "steward",
        }

    @staticmethod
    def usage(done: Done) -> dict[str, Any]:
        return {
            "prompt_tokens": done.prompt_tokens,
            "completion_tokens": done.completion_tokens,
            "total_tokens": done.prompt_tokens + done.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": done.cached_tokens},
        }

    @staticmethod
    def timings(done: Done) -> dict[str, float]:
        """The worker's own clock, as llama.cpp's server reports it: what HTTP and IPC add
        is the difference between these and what a client measures."""
        return {
            "cache_n": done.cached_tokens,
            "prompt_n": done.prompt_tokens - done.cached_tokens,
            "prompt_ms": round(done.ttft * 1e3, 3),
            "predicted_n": done.completion_tokens,
            "predicted_per_second": round(done.decode_tps, 2),
        }

    def full(self, text: str, done: Done) -> dict[str, Any]:
        if self.chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": done.finish_reason,
            }
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": done.finish_reason,
            }
        usage, timings = self.usage(done), self.timings(done)
        return {**self._base(), "choices": [choice], "usage": usage, "timings": timings}

    def chunk(self, text: str | None, done: Done | None = None, first: bool = False) -> str:
        finish = done.finish_reason if done else None
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if first else {}
            if text is not None:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            body = {**self._base(".chunk"), "choices": [choice]}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
            body = {**self._base(), "choices": [choice]}
        if self.include_usage:
            body["usage"] = None
        if done is not None:
            body["timings"] = self.timings(done)
        return sse(body)

    def usage_chunk(self, done: Done) -> str:
        suffix = ".chunk" if self.chat else ""
        return sse({**self._base(suffix), "choices": [], "usage": self.usage(done)})


def sse(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


async def respond(
    request: Request, waiter: Waiter, answer: Answer, stream: bool, request_id: str
) -> Response:
    """Wait for the first event, then answer whole (JSON) or as a stream (SSE).

    Until the answer starts, a client that hangs up cancels its job: no work for clients
    that left (once streaming, Starlette's own disconnect listener does the same)."""
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        first = await _unless(gone, waiter.next())
        if not stream:
            while not isinstance(first, Done):
                first = await _unless(gone, waiter.next())
            return JSONResponse(answer.full("".join(waiter.job.text), first))
    except ClientGone:
        waiter.close()
        return Response(status_code=499)  # nginx's "client closed request", for the logs
    except BaseException:
        waiter.close()
        raise
    finally:
        gone.cancel()
    return StreamingResponse(
        _stream(waiter, answer, first, request_id),
        media_type="text/event-stream",
        headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
    )


class ClientGone(Exception):
    pass


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless(gone: asyncio.Future[None], next_event: Awaitable[Token | Done]) -> Token | Done:
    waiting = asyncio.ensure_future(next_event)
    await asyncio.wait({waiting, gone}, return_when=asyncio.FIRST_COMPLETED)
    if waiting.done():
        return waiting.result()
    waiting.cancel()
    raise ClientGone


async def _stream(
    waiter: Waiter, answer: Answer, first: Token | Done, request_id: str
) -> AsyncIterator[str]:
    event: Token | Done = first
    opened = False
    try:
        while True:
            if isinstance(event, Done):
                if not opened:
                    yield answer.chunk("", first=True)
                yield answer.chunk(None, event)
                if answer.include_usage:
                    yield answer.usage_chunk(event)
                yield "data: [DONE]\n\n"
                return
            yield answer.chunk(event.text, first=not opened)
            opened = True
            try:
                event = await waiter.next()
            except ApiError as error:
                waiter.metrics.error(error.type)
                yield sse({"error": error.body(request_id)["error"]})
                return
    finally:
        waiter.close()

"""A job's client side, whatever the dialect: wait for its events within the queue and
request deadlines, then answer whole (JSON) or as a stream (SSE) through the dialect's
`Answer`.

A streaming response starts only once every choice's first event exists, so a fault
before it can still be replayed, or answered as an ordinary error response rather than a
broken stream; after it, the supervisor resumes the stream and the answer just goes on.
A client that hangs up cancels its jobs: no work for clients that left.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from steward.errors import ApiError, ErrorType
from steward.front import backend
from steward.front.dialects.seam import Answer
from steward.supervisor.jobs import Event, Job
from steward.wire.protocol import Done, Token

T = TypeVar("T")


class Waiter:
    """Turns a job's events into values or `ApiError`s, enforcing queue and request
    deadlines. `fallback`: the job without the default cap, for a prompt the cap does not
    leave room for (the worker says so before any token)."""

    def __init__(
        self, request: Request, job: Job, fallback: Callable[[], Job] | None = None
    ) -> None:
        self.job = job
        self.fallback = fallback
        self.request = request
        self.supervisor = backend.supervisor(request)
        self.config = request.app.state.config
        self.deadline = time.monotonic() + self.config.request_timeout

    async def next(self) -> Token | Done:
        job = self.job
        while True:
            try:
                async with asyncio.timeout(max(self._until() - time.monotonic(), 0)):
                    event: Event = await job.events.get()
            except TimeoutError:
                # the job may have started while this waited: only its deadline now
                if not job.events.empty() or time.monotonic() < self._until():
                    continue
                if time.monotonic() >= self.deadline:
                    raise ApiError(
                        "generation_timeout",
                        f"No answer within {self.config.request_timeout:.0f} s (request-timeout).",
                    ) from None
                raise self.supervisor.queue_error() from None
            if isinstance(event, ApiError):
                if self.fallback and event.type is ErrorType.CONTEXT_LENGTH_EXCEEDED:
                    self.job, self.fallback = self.fallback(), None
                    job = self.job
                    # the model may have been unloaded and loaded again meanwhile
                    self.supervisor = backend.supervisor(self.request)
                    continue
                raise event
            self.fallback = None
            return event

    def _until(self) -> float:
        return self.job.waits_until(self.config.queue_timeout, self.deadline)

    def close(self) -> None:
        if not self.job.finished:
            self.supervisor.cancel(self.job)


async def respond(
    request: Request, waiters: list[Waiter], answer: Answer, stream: bool
) -> Response:
    """Wait for each choice's first event, then answer whole (JSON) or as a stream (SSE).

    Until the answer starts, a client that hangs up cancels its jobs: no work for clients
    that left (once streaming, Starlette's own disconnect listener does the same)."""
    if not stream:
        return await whole(request, waiters, answer.full)
    firsts = await _watched(request, waiters, lambda waiter: waiter.next())
    if isinstance(firsts, Response):
        return firsts
    return StreamingResponse(
        _stream(request, waiters, answer, firsts),
        media_type="text/event-stream",
        headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
    )


async def whole(
    request: Request, waiters: list[Waiter], body: Callable[[list[Job], list[Done]], dict]
) -> Response:
    """Wait for every job's end, then answer one JSON `body` of the jobs and their ends."""
    dones = await _watched(request, waiters, _done)
    if isinstance(dones, Response):
        return dones
    note_usage(request, dones)
    return JSONResponse(body([w.job for w in waiters], dones))


async def _watched(
    request: Request, waiters: list[Waiter], wait: Callable[[Waiter], Awaitable[T]]
) -> list[T] | Response:
    """`wait` for each waiter in turn; a client that hangs up meanwhile cancels its jobs
    (and gets 499, nginx's "client closed request", for the logs)."""
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        return [await _unless(gone, wait(waiter)) for waiter in waiters]
    except ClientGone:
        _close(waiters)
        return Response(status_code=499)
    except BaseException:
        _close(waiters)
        raise
    finally:
        gone.cancel()


async def _done(waiter: Waiter) -> Done:
    while not isinstance(event := await waiter.next(), Done):
        pass
    return event


def note_usage(request: Request, dones: list[Done]) -> None:
    """Token counts for the access log: the prompt once, every choice's completion."""
    if dones:
        request.state.tokens = (dones[0].prompt_tokens, sum(d.completion_tokens for d in dones))


def _close(waiters: list[Waiter]) -> None:
    for waiter in waiters:
        waiter.close()


class ClientGone(Exception):
    pass


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless(gone: asyncio.Future[None], next_event: Awaitable[T]) -> T:
    waiting = asyncio.ensure_future(next_event)
    await asyncio.wait({waiting, gone}, return_when=asyncio.FIRST_COMPLETED)
    if waiting.done():
        return waiting.result()
    waiting.cancel()
    raise ClientGone


async def _events(
    waiters: list[Waiter], firsts: list[Token | Done], idle: float | None = None
) -> AsyncIterator[tuple[int, Token | Done | None]]:
    """Every choice's events, as they come: (choice, event), and (-1, None) after each
    `idle` seconds without one. An error ends them all."""
    merged: asyncio.Queue[tuple[int, Token | Done | ApiError]] = asyncio.Queue()

    async def pump(index: int, waiter: Waiter, event: Token | Done) -> None:
        try:
            while True:
                merged.put_nowait((index, event))
                if isinstance(event, Done):
                    return
                event = await waiter.next()
        except ApiError as error:
            merged.put_nowait((index, error))

    pumps = [
        asyncio.ensure_future(pump(i, w, first))
        for i, (w, first) in enumerate(zip(waiters, firsts, strict=True))
    ]
    try:
        open_choices = len(waiters)
        while open_choices:
            try:
                async with asyncio.timeout(idle):
                    index, event = await merged.get()
            except TimeoutError:
                yield -1, None
                continue
            if isinstance(event, ApiError):
                raise event
            open_choices -= isinstance(event, Done)
            yield index, event
    finally:
        for task in pumps:
            task.cancel()


async def _stream(
    request: Request, waiters: list[Waiter], answer: Answer, firsts: list[Token | Done]
) -> AsyncIterator[str]:
    opened: set[int] = set()
    dones: list[Done] = []
    try:
        for frame in answer.opening():
            yield frame
        async with contextlib.aclosing(_events(waiters, firsts, answer.idle_seconds)) as events:
            async for index, event in events:
                if event is None:
                    for frame in answer.idle():
                        yield frame
                    continue
                first = index not in opened
                opened.add(index)
                if isinstance(event, Done):
                    dones.append(event)
                    frames = answer.finished(index, event, first)
                else:
                    frames = answer.delta(index, event, first)
                for frame in frames:
                    yield frame
        note_usage(request, dones)
        for frame in answer.closing(dones):
            yield frame
    except ApiError as error:
        request.app.state.metrics.error(error.type)
        request.state.error_type = str(error.type)
        for frame in answer.failed(error, request.state.request_id):
            yield frame
    finally:
        _close(waiters)

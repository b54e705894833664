"""The client's side of a job: wait for it within its deadlines, answer as JSON or SSE.

A streaming response starts only once the first token exists, so a fault before it can
still be replayed, or answered as an ordinary error response rather than a broken stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import secrets
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
from steward.wire.protocol import CallDelta, Done, Logprob, Token, TopLogprob


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
    """Shapes one OpenAI response (chat or text completion) around its jobs, one per choice."""

    def __init__(
        self,
        kind: str,
        model: str,
        request_id: str,
        include_usage: bool,
        logprobs: bool = False,
        parallel_calls: bool = True,
    ) -> None:
        self.chat = kind == "chat"
        self.model = model
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + request_id[:48]
        self.object = "chat.completion" if self.chat else "text_completion"
        self.created = int(time.time())
        self.include_usage = include_usage
        self.logprobs = logprobs
        self.parallel_calls = parallel_calls
        self.call_ids: dict[tuple[int, int], str] = {}  # (choice, call) -> id
        self.offsets: dict[int, int] = {}  # choice -> characters of text sent (completions)

    def _base(self, suffix: str = "") -> dict[str, Any]:
        return {
            "id": self.id,
            "object": self.object + suffix,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "steward",
        }

    @staticmethod
    def usage(dones: list[Done]) -> dict[str, Any]:
        """The prompt once, every choice's completion (as OpenAI counts `n` choices)."""
        prompt, cached = dones[0].prompt_tokens, dones[0].cached_tokens
        completion = sum(done.completion_tokens for done in dones)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
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

    def full(self, jobs: list[Job], dones: list[Done]) -> dict[str, Any]:
        choices = [
            self._choice(i, job, done)
            for i, (job, done) in enumerate(zip(jobs, dones, strict=True))
        ]
        usage, timings = self.usage(dones), self.timings(dones[0])
        return {**self._base(), "choices": choices, "usage": usage, "timings": timings}

    def _choice(self, index: int, job: Job, done: Done) -> dict[str, Any]:
        text = "".join(job.text)
        logprobs = self._logprobs(index, job.logprobs)
        if not self.chat:
            return {"index": index, "text": text, "logprobs": logprobs, **self._finish(done)}
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if calls := self._calls(index, job.calls):
            message["tool_calls"] = calls
            message["content"] = text or None
        return {"index": index, "message": message, "logprobs": logprobs, **self._finish(done)}

    @staticmethod
    def _finish(done: Done) -> dict[str, str]:
        return {"finish_reason": done.finish_reason}

    def _calls(self, index: int, parts: list[CallDelta], stream: bool = False) -> list[dict]:
        """Tool calls in OpenAI's shape: whole (parts joined), or in a stream as deltas,
        each call's first carrying its id, type and name."""
        shaped: list[dict[str, Any]] = []
        whole: dict[int, dict[str, Any]] = {}
        for part in parts:
            if part.index > 0 and not self.parallel_calls:
                continue
            if not stream and part.index in whole:
                whole[part.index]["function"]["arguments"] += part.arguments
                continue
            call: dict[str, Any] = {"index": part.index} if stream else {}
            function = {"arguments": part.arguments}
            if part.name is not None:
                key = (index, part.index)
                call_id = self.call_ids.setdefault(key, "call_" + secrets.token_hex(12))
                call |= {"id": call_id, "type": "function"}
                function = {"name": part.name, **function}
            call["function"] = function
            whole[part.index] = call
            shaped.append(call)
        return shaped

    def _logprobs(self, index: int, entries: list[Logprob]) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        if self.chat:
            return {"content": [_entry(e) for e in entries], "refusal": None}
        offset = self.offsets.get(index, 0)
        offsets = []
        for entry in entries:
            offsets.append(offset)
            offset += len(entry.token)
        self.offsets[index] = offset
        return {
            "tokens": [e.token for e in entries],
            "token_logprobs": [_finite(e.logprob) for e in entries],
            "top_logprobs": [{t.token: _finite(t.logprob) for t in e.top} for e in entries],
            "text_offset": offsets,
        }

    def chunk(
        self, index: int, token: Token | None, done: Done | None = None, first: bool = False
    ) -> str:
        finish = done.finish_reason if done else None
        text = token.text if token is not None else None
        logprobs = self._logprobs(index, [token.logprob]) if token and token.logprob else None
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if first else {}
            if text is not None:
                delta["content"] = text
            if token is not None and (calls := self._calls(index, token.calls, stream=True)):
                delta["tool_calls"] = calls
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
            body = {**self._base(".chunk"), "choices": [choice]}
        else:
            choice = {
                "index": index,
                "text": text or "",
                "logprobs": logprobs,
                "finish_reason": finish,
            }
            body = {**self._base(), "choices": [choice]}
        if self.include_usage:
            body["usage"] = None
        if done is not None:
            body["timings"] = self.timings(done)
        return sse(body)

    def usage_chunk(self, dones: list[Done]) -> str:
        suffix = ".chunk" if self.chat else ""
        return sse({**self._base(suffix), "choices": [], "usage": self.usage(dones)})


def _finite(logprob: float) -> float:
    """JSON has no infinity; OpenAI writes an impossible token's log-probability as -9999.
    Nor NaN, which only a broken distribution gives: -9999 too, never an unwritable answer."""
    return -9999.0 if math.isnan(logprob) else max(logprob, -9999.0)


def _entry(entry: Logprob | TopLogprob) -> dict[str, Any]:
    shaped = {"token": entry.token, "logprob": _finite(entry.logprob), "bytes": list(entry.raw)}
    if isinstance(entry, Logprob):
        shaped["top_logprobs"] = [_entry(top) for top in entry.top]
    return shaped


def sse(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


async def respond(
    request: Request, waiters: list[Waiter], answer: Answer, stream: bool, request_id: str
) -> Response:
    """Wait for each choice's first event, then answer whole (JSON) or as a stream (SSE).

    Until the answer starts, a client that hangs up cancels its jobs: no work for clients
    that left (once streaming, Starlette's own disconnect listener does the same)."""
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        firsts = [await _unless(gone, waiter.next()) for waiter in waiters]
        if not stream:
            dones = []
            for waiter, event in zip(waiters, firsts, strict=True):
                while not isinstance(event, Done):
                    event = await _unless(gone, waiter.next())
                dones.append(event)
            return JSONResponse(answer.full([w.job for w in waiters], dones))
    except ClientGone:
        _close(waiters)
        return Response(status_code=499)  # nginx's "client closed request", for the logs
    except BaseException:
        _close(waiters)
        raise
    finally:
        gone.cancel()
    return StreamingResponse(
        _stream(waiters, answer, firsts, request_id),
        media_type="text/event-stream",
        headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
    )


def _close(waiters: list[Waiter]) -> None:
    for waiter in waiters:
        waiter.close()


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


async def _events(
    waiters: list[Waiter], firsts: list[Token | Done]
) -> AsyncIterator[tuple[int, Token | Done]]:
    """Every choice's events, as they come: (choice, event). An error ends them all."""
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
            index, event = await merged.get()
            if isinstance(event, ApiError):
                raise event
            open_choices -= isinstance(event, Done)
            yield index, event
    finally:
        for task in pumps:
            task.cancel()


async def _stream(
    waiters: list[Waiter], answer: Answer, firsts: list[Token | Done], request_id: str
) -> AsyncIterator[str]:
    opened: set[int] = set()
    dones: list[Done] = []
    try:
        async with contextlib.aclosing(_events(waiters, firsts)) as events:
            async for index, event in events:
                if isinstance(event, Done):
                    if index not in opened:
                        yield answer.chunk(index, Token(-1, -1, ""), first=True)
                    yield answer.chunk(index, None, event)
                    dones.append(event)
                    continue
                yield answer.chunk(index, event, first=index not in opened)
                opened.add(index)
        if answer.include_usage:
            yield answer.usage_chunk(dones)
        yield "data: [DONE]\n\n"
    except ApiError as error:
        waiters[0].metrics.error(error.type)
        yield sse({"error": error.body(request_id)["error"]})
    finally:
        _close(waiters)

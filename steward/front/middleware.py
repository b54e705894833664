"""ASGI middleware: a request id on every response (and the `steward-ignored` header where
the route noted fields it does not know), a bounded request body that must arrive in time,
and the answer to requests on connections over the cap.

Pure ASGI rather than `BaseHTTPMiddleware`, so streaming responses pass straight through
and a body over the limit is refused while it arrives, before it is buffered whole.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from steward.config import ServeConfig
from steward.errors import ApiError, error_response
from steward.front.connections import OVER_CAP
from steward.front.ignored import HEADER
from steward.ops.metrics import Metrics

access = logging.getLogger("steward.access")

SANE_ID = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")
IGNORED_HEADER = HEADER.encode()


def request_id_from(scope: Scope) -> str:
    for name, value in scope.get("headers", []):
        if name == b"x-request-id":
            text = value.decode("latin-1")
            if SANE_ID.fullmatch(text):
                return text
    return uuid.uuid4().hex


class RequestContext:
    """Outermost: request id, body bound, then one access-log line and one metrics sample
    per response, with the route template (not the raw path) to keep label sets small.
    Errors it answers itself are in the envelope of the dialect the path belongs to."""

    def __init__(self, app: ASGIApp, config: ServeConfig, metrics: Metrics) -> None:
        self.app = app
        self.max_body_bytes = config.max_body_bytes
        self.body_timeout = config.body_timeout
        self.max_connections = config.max_connections
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        request_id = request_id_from(scope)
        scope.setdefault("state", {})["request_id"] = request_id
        header = request_id.encode()
        limit = self.max_body_bytes
        received = 0
        complete = False
        deadline = asyncio.get_running_loop().time() + self.body_timeout
        status = 500  # unless a response starts

        async def bounded_receive() -> Message:
            """The body within its size and time limits; after it, waiting is free (a
            streaming response listens for the client's disconnect this way)."""
            nonlocal received, complete
            if complete:
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise ApiError(
                    "body_timeout",
                    f"The request body did not arrive within {self.body_timeout:g} s.",
                    headers={"connection": "close"},
                ) from None
            received += len(message.get("body", b""))
            complete = not message.get("more_body", False)
            if received > limit:
                raise too_large(limit)
            return message

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = message.setdefault("headers", [])
                if not any(name.lower() == b"x-request-id" for name, _ in headers):
                    headers.append((b"x-request-id", header))
                if named := scope["state"].get("ignored"):  # ignored.py
                    headers.append((IGNORED_HEADER, named.encode()))
            await send(message)

        declared = dict(scope.get("headers", [])).get(b"content-length", b"0")
        refusal = None
        if declared.isdigit() and int(declared) > limit:
            refusal = too_large(limit)
        elif scope["state"].get(OVER_CAP) and not scope["path"].startswith(UNCAPPED):
            refusal = ApiError(
                "too_many_connections",
                f"More than {self.max_connections} connections are open (max-connections); "
                "retry shortly.",
                retry_after=1,
                headers={"connection": "close"},
            )
        try:
            if refusal is not None:
                self.metrics.error(refusal.type)
                scope["state"]["error_type"] = str(refusal.type)
                await error_response(refusal, request_id, scope["path"])(
                    scope, receive, send_with_id
                )
            else:
                await self.app(scope, bounded_receive, send_with_id)
        finally:
            route = getattr(scope.get("route"), "path", "other")
            self.metrics.request(route, status)
            took = (time.perf_counter() - started) * 1e3
            log_access(scope, status, route, took)


def log_access(scope: Scope, status: int, route: str, took: float) -> None:
    """One line a failed request can be found by without reproducing it: its id, the
    model, the error type and the token counts that the routes noted in the scope."""
    state = scope["state"]
    client = (scope.get("client") or ("-", 0))[0]
    prompt, completion = state.get("tokens", (None, None))
    fields = {
        "id": state["request_id"],
        "model": state.get("model"),
        "error": state.get("error_type"),
        "tokens": None if prompt is None else f"{prompt}+{completion}",
    }
    tail = "".join(f" {key}={value}" for key, value in fields.items() if value is not None)
    access.info(
        '%s "%s %s" %d %.1f ms%s',
        client,
        scope["method"],
        scope["path"],
        status,
        took,
        tail,
        extra={
            "request_id": state["request_id"],
            "access": {
                "client": client,
                "method": scope["method"],
                "path": scope["path"],
                "route": route,
                "status": status,
                "ms": round(took, 2),
                "model": state.get("model"),
                "error": state.get("error_type"),
                "prompt_tokens": prompt,
                "completion_tokens": completion,
            },
        },
    )


UNCAPPED = ("/health", "/metrics")  # probes are answered even over the connection cap


def too_large(limit: int) -> ApiError:
    return ApiError("request_too_large", f"Request body exceeds {limit} bytes.")

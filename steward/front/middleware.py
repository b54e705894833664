"""ASGI middleware: a request id on every response, and a bounded request body.

Pure ASGI rather than `BaseHTTPMiddleware`, so streaming responses pass straight through
and a body over the limit is refused while it arrives, before it is buffered whole.
"""

from __future__ import annotations

import logging
import re
import time
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from steward.errors import ApiError, error_response
from steward.ops.metrics import Metrics

access = logging.getLogger("steward.access")

SANE_ID = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")


def request_id_from(scope: Scope) -> str:
    for name, value in scope.get("headers", []):
        if name == b"x-request-id":
            text = value.decode("latin-1")
            if SANE_ID.fullmatch(text):
                return text
    return uuid.uuid4().hex


class RequestContext:
    """Outermost: request id, body bound, then one access-log line and one metrics sample
    per response, with the route template (not the raw path) to keep label sets small."""

    def __init__(self, app: ASGIApp, max_body_bytes: int, metrics: Metrics) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
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
        status = 500  # unless a response starts

        async def bounded_receive() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
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
            await send(message)

        declared = dict(scope.get("headers", [])).get(b"content-length", b"0")
        try:
            if declared.isdigit() and int(declared) > limit:
                self.metrics.error("request_too_large")
                await error_response(too_large(limit), request_id)(scope, receive, send_with_id)
            else:
                await self.app(scope, bounded_receive, send_with_id)
        finally:
            route = getattr(scope.get("route"), "path", "other")
            self.metrics.request(route, status)
            took = (time.perf_counter() - started) * 1e3
            client = scope.get("client") or ("-", 0)
            access.info(
                '%s "%s %s" %d %.1f ms',
                client[0],
                scope["method"],
                scope["path"],
                status,
                took,
                extra={
                    "request_id": request_id,
                    "access": {
                        "client": client[0],
                        "method": scope["method"],
                        "path": scope["path"],
                        "route": route,
                        "status": status,
                        "ms": round(took, 2),
                    },
                },
            )


def too_large(limit: int) -> ApiError:
    return ApiError("request_too_large", f"Request body exceeds {limit} bytes.")

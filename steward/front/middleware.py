"""ASGI middleware: a request id on every response, and a bounded request body.

Pure ASGI rather than `BaseHTTPMiddleware`, so streaming responses pass straight through
and a body over the limit is refused while it arrives, before it is buffered whole.
"""

from __future__ import annotations

import re
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from steward.errors import ApiError, error_response

SANE_ID = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")


def request_id_from(scope: Scope) -> str:
    for name, value in scope.get("headers", []):
        if name == b"x-request-id":
            text = value.decode("latin-1")
            if SANE_ID.fullmatch(text):
                return text
    return uuid.uuid4().hex


class RequestContext:
    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = request_id_from(scope)
        scope.setdefault("state", {})["request_id"] = request_id
        header = request_id.encode()
        limit = self.max_body_bytes
        received = 0
        declared = dict(scope.get("headers", [])).get(b"content-length", b"0")
        if declared.isdigit() and int(declared) > limit:
            await error_response(too_large(limit), request_id)(scope, receive, send)
            return

        async def bounded_receive() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > limit:
                raise too_large(limit)
            return message

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = message.setdefault("headers", [])
                if not any(name.lower() == b"x-request-id" for name, _ in headers):
                    headers.append((b"x-request-id", header))
            await send(message)

        await self.app(scope, bounded_receive, send_with_id)


def too_large(limit: int) -> ApiError:
    return ApiError("request_too_large", f"Request body exceeds {limit} bytes.")

"""A request body read as JSON, checked before FastAPI validates it against a model.

Starlette's `Request.json()` is `json.loads` on the event loop: it accepts lone surrogates
(which msgspec, the worker's wire format, and every UTF-8 consumer refuse), nests as deep as
the recursion limit allows, and a few MB of it stall the loop that answers `/health`. Here
the content type must say JSON, a large body is parsed off the loop, and the parsed value is
walked once, iteratively, for its depth and for strings that cannot be encoded, so the 400
names the field instead of a request wedging the worker's line.
"""

from __future__ import annotations

import email.message
import json
from collections.abc import Callable, Coroutine
from typing import Any

import anyio
from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel

from steward.errors import ApiError
from steward.front import ignored

MAX_DEPTH = 32  # OpenAI bodies nest a handful of levels; JSON schemas (tools) a few more
# Values in one body: a 2048-message chat is about 10,000; validating far more would hold
# the event loop (the walk itself runs off it for large bodies).
MAX_VALUES = 50_000
OFF_LOOP_BYTES = 256 * 1024


class JSONRequest(Request):
    @property
    def parsed(self) -> Any:
        """The body as parsed (None until `json()` has read it)."""
        return getattr(self, "_json", None)

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            if len(body) > OFF_LOOP_BYTES:
                self._json = await anyio.to_thread.run_sync(parse, body)
            else:
                self._json = parse(body)
        return self._json


class JSONRoute(APIRoute):
    """A route whose body must be JSON (`Content-Type: application/json`), read by `parse`;
    what it carries that steward does not know is noted as it validates (ignored.py), for
    the `steward-ignored` header the middleware writes on whatever answers it."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def checked(request: Request) -> Response:
            if self.body_field is None:
                return await handler(request)
            require_json(request.headers.get("content-type"))
            read = JSONRequest(request.scope, request.receive)
            with ignored.reading(request.app.state.config.strict_requests) as notes:
                try:
                    return await handler(read)
                except RequestValidationError:
                    ignored.unknown_at_top(notes, self.body_model, read.parsed)
                    raise
                finally:
                    agent = request.headers.get("user-agent", "")
                    if value := ignored.finish(notes, read.parsed, self.path, agent):
                        request.state.ignored = value

        return checked

    @property
    def body_model(self) -> type[BaseModel]:
        assert self.body_field is not None
        return self.body_field.field_info.annotation


def require_json(content_type: str | None) -> None:
    message = email.message.Message()
    message["content-type"] = content_type or ""
    subtype = message.get_content_subtype()
    if message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    ):
        return
    raise ApiError(
        "validation_error",
        "The request body must be JSON sent with 'Content-Type: application/json' "
        f"(got {content_type!r}; with curl: -H 'Content-Type: application/json').",
    )


def parse(body: bytes) -> Any:
    try:
        value = json.loads(body, parse_constant=_not_json)
    except RecursionError:
        raise ApiError("validation_error", f"body: JSON nested deeper than {MAX_DEPTH}") from None
    except ValueError as exc:  # JSONDecodeError, or bytes that are not UTF-8
        raise ApiError("validation_error", f"body: invalid JSON: {exc}") from None
    check(value)
    return value


def _not_json(name: str) -> None:
    raise ValueError(f"{name} is not a JSON value")


def check(value: Any) -> None:
    """Every string encodable as UTF-8, nesting at most `MAX_DEPTH` deep, at most
    `MAX_VALUES` values."""
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    seen = 0
    while stack:
        item, path, depth = stack.pop()
        seen += 1
        if seen > MAX_VALUES:
            raise ApiError("validation_error", f"body: more than {MAX_VALUES} JSON values")
        if isinstance(item, str):
            _encodable(item, path)
        elif isinstance(item, dict | list):
            if depth >= MAX_DEPTH:
                raise ApiError("validation_error", f"{path or 'body'}: nested too deeply")
            pairs = item.items() if isinstance(item, dict) else enumerate(item)
            for key, child in pairs:
                name = f"{path}.{key}" if path else str(key)
                if isinstance(key, str):
                    _encodable(key, name)
                stack.append((child, name, depth + 1))


def _encodable(text: str, path: str) -> None:
    if text.isascii():
        return
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        bad = text[exc.start : exc.end].encode("unicode_escape").decode()
        raise ApiError(
            "validation_error",
            f"{path or 'body'}: the string holds an unpaired surrogate ({bad}), which is "
            "not valid Unicode",
        ) from None

"""The API key (`--api-key`), checked on every route under /v1 whatever its dialect.

OpenAI's clients send `Authorization: Bearer KEY`, Anthropic's `x-api-key: KEY`; either
is accepted. The comparison takes constant time.
"""

from __future__ import annotations

import hmac

from fastapi import Request

from steward.errors import ApiError


def presented_key(request: Request) -> str | None:
    if (key := request.headers.get("x-api-key")) is not None:
        return key
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token if scheme.lower() == "bearer" else None


def require_key(request: Request) -> None:
    key = request.app.state.config.api_key
    if not key:
        return
    given = presented_key(request)
    if given is None or not hmac.compare_digest(given.encode(), key.encode()):
        raise ApiError(
            "unauthorized",
            "Missing or wrong API key (Authorization: Bearer ... or x-api-key: ...).",
            headers={"www-authenticate": "Bearer"},
        )

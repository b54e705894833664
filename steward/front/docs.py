"""What the served OpenAPI schema says about responses: the SPEC §4 envelope for every error
a route can give, and the SSE stream beside the JSON answer.

FastAPI would otherwise document a 422 "Validation Error" that steward never sends (its
validation errors are 400; 422 is `request_quarantined`) and no error body at all.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from steward.errors import ERROR_TYPES

ErrorType = Literal[tuple(ERROR_TYPES)]  # type: ignore[valid-type]


class FaultRef(BaseModel):
    class_: str = Field(alias="class")
    id: str


class ErrorBody(BaseModel):
    type: ErrorType
    message: str
    retryable: bool
    code: str
    param: str | None = None
    retry_after: int | None = None
    fault: FaultRef | None = None


class Envelope(BaseModel):
    """Every error response's body (SPEC §4); `x-should-retry` matches `retryable`. Under
    /v1/messages, Anthropic's shape instead (steward/errors.py `AnthropicEnvelope`)."""

    status: Literal["error"]
    error: ErrorBody
    request_id: str


# What a request carried that steward does not know (ignored.py), on answers and errors.
IGNORED = {
    "steward-ignored": {
        "description": "the paths of fields and tools the request carried that steward does "
        "not know or serve, left out (`client_metadata, tools.8`); absent when none",
        "schema": {"type": "string"},
    }
}

# Errors any route can meet: a bug, too many connections, a slow or oversized body.
COMMON = (408, 413, 500, 503)
GENERATION = (400, 404, 422, 429, 504, 507)


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` entries for these statuses (and the common ones), each the envelope."""
    types: dict[int, list[str]] = {}
    for name, (status, _retryable) in ERROR_TYPES.items():
        types.setdefault(status, []).append(name)
    return {
        status: {
            "model": Envelope,
            "description": "error: " + ", ".join(types[status]),
            "headers": IGNORED,
        }
        for status in sorted({*statuses, *COMMON})
    }


def generation_responses(obj: str) -> dict[int | str, dict[str, Any]]:
    """A completion: one JSON object, or with `"stream": true` server-sent events."""
    return {
        200: {
            "description": f"a `{obj}` object, or with `stream: true` an SSE stream of "
            f"`{obj}` chunks ending in `data: [DONE]`; a stream whose backend faults "
            'after its first token ends with one `data: {"error": {...}}` event instead',
            "content": {
                "application/json": {"schema": {"type": "object"}},
                "text/event-stream": {},  # events: `data: {chunk}` lines
            },
            "headers": IGNORED,
        },
        **error_responses(*GENERATION),
    }

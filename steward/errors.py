"""The error envelope of SPEC §4: one exception type, one place that renders it.

Every error a client can see is an `ApiError`; its `type` fixes the HTTP status and
whether a retry can help, so handlers never pick status codes or retry flags by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from starlette.responses import JSONResponse

# type -> (HTTP status, retryable)
ERROR_TYPES: dict[str, tuple[int, bool]] = {
    "validation_error": (400, False),
    "context_length_exceeded": (400, False),
    "unauthorized": (401, False),
    "model_not_found": (404, False),
    "not_found": (404, False),
    "method_not_allowed": (405, False),
    "body_timeout": (408, False),
    "request_too_large": (413, False),
    "request_quarantined": (422, False),
    "overloaded": (429, True),
    "internal_error": (500, False),
    "backend_unavailable": (503, True),
    "server_shutdown": (503, True),
    "too_many_connections": (503, True),
    "generation_timeout": (504, False),
    "insufficient_memory": (507, False),
}

MAX_RETRY_AFTER = 120


@dataclass
class ApiError(Exception):
    """An error for one request, rendered as the SPEC §4 envelope."""

    type: str
    message: str
    retry_after: int | None = None
    fault: dict[str, str] | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(self.message)
        if self.type not in ERROR_TYPES:
            raise ValueError(f"unknown error type {self.type!r}")
        if self.retryable:
            self.retry_after = min(max(1, self.retry_after or 1), MAX_RETRY_AFTER)
        else:
            self.retry_after = None

    @property
    def status(self) -> int:
        return ERROR_TYPES[self.type][0]

    @property
    def retryable(self) -> bool:
        return ERROR_TYPES[self.type][1]

    def body(self, request_id: str) -> dict[str, Any]:
        """The envelope; `error` alone is what an SSE error event carries."""
        error: dict[str, Any] = {
            "type": self.type,
            "message": self.message,
            "retryable": self.retryable,
            "code": self.type,
        }
        if self.retry_after is not None:
            error["retry_after"] = self.retry_after
        if self.fault is not None:
            error["fault"] = self.fault
        return {"status": "error", "error": error, "request_id": request_id}

    def response_headers(self, request_id: str) -> dict[str, str]:
        headers = {
            **self.headers,
            "x-should-retry": "true" if self.retryable else "false",
            "x-request-id": request_id,
        }
        if self.retry_after is not None:
            headers["retry-after"] = str(self.retry_after)
        return headers


def error_response(error: ApiError, request_id: str) -> JSONResponse:
    return JSONResponse(
        error.body(request_id), error.status, headers=error.response_headers(request_id)
    )

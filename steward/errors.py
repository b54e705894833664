"""The error envelope of SPEC §4: one exception type, one place that renders it.

Every error a client can see is an `ApiError`; its `type` fixes the HTTP status and
whether a retry can help, so handlers never pick status codes or retry flags by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from starlette.responses import JSONResponse


class ErrorType(StrEnum):
    VALIDATION_ERROR = "validation_error"
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    UNAUTHORIZED = "unauthorized"
    MODEL_NOT_FOUND = "model_not_found"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    BODY_TIMEOUT = "body_timeout"
    REQUEST_TOO_LARGE = "request_too_large"
    REQUEST_QUARANTINED = "request_quarantined"
    OVERLOADED = "overloaded"
    INTERNAL_ERROR = "internal_error"
    BACKEND_UNAVAILABLE = "backend_unavailable"
    SERVER_SHUTDOWN = "server_shutdown"
    TOO_MANY_CONNECTIONS = "too_many_connections"
    GENERATION_TIMEOUT = "generation_timeout"
    INSUFFICIENT_MEMORY = "insufficient_memory"


# type -> (HTTP status, retryable)
ERROR_TYPES: dict[ErrorType, tuple[int, bool]] = {
    ErrorType.VALIDATION_ERROR: (400, False),
    ErrorType.CONTEXT_LENGTH_EXCEEDED: (400, False),
    ErrorType.UNAUTHORIZED: (401, False),
    ErrorType.MODEL_NOT_FOUND: (404, False),
    ErrorType.NOT_FOUND: (404, False),
    ErrorType.METHOD_NOT_ALLOWED: (405, False),
    ErrorType.BODY_TIMEOUT: (408, False),
    ErrorType.REQUEST_TOO_LARGE: (413, False),
    ErrorType.REQUEST_QUARANTINED: (422, False),
    ErrorType.OVERLOADED: (429, True),
    ErrorType.INTERNAL_ERROR: (500, False),
    ErrorType.BACKEND_UNAVAILABLE: (503, True),
    ErrorType.SERVER_SHUTDOWN: (503, True),
    ErrorType.TOO_MANY_CONNECTIONS: (503, True),
    ErrorType.GENERATION_TIMEOUT: (504, False),
    ErrorType.INSUFFICIENT_MEMORY: (507, False),
}

MAX_RETRY_AFTER = 120


@dataclass
class ApiError(Exception):
    """An error for one request, rendered as the SPEC §4 envelope."""

    type: ErrorType | str  # a string is checked against ErrorType
    message: str
    retry_after: int | None = None
    fault: dict[str, str] | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(self.message)
        self.type = ErrorType(self.type)  # ValueError for a type the contract lacks
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

"""The error envelope of SPEC §4: one exception type, one place that renders it.

Every error a client can see is an `ApiError`; its `type` fixes the HTTP status and
whether a retry can help, so handlers never pick status codes or retry flags by hand.

How the error is written is the dialect's: an `Envelope` per dialect, chosen by the
request's path (`envelope_for`), so an error met before any route runs (an unknown route,
a missing API key, a body over the limit) is still written as the client's SDK reads it.
The status, `x-should-retry` and `Retry-After` are the same in every dialect.
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
    INSUFFICIENT_STORAGE = "insufficient_storage"  # a model that cannot fit the budget


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
    ErrorType.INSUFFICIENT_STORAGE: (507, False),
}

MAX_RETRY_AFTER = 120


@dataclass(frozen=True)
class Overflow:
    """A prompt the context cannot hold beside the completion the request wants: the
    prompt's tokens (`at_least`: a lower bound, counted from its characters before it was
    tokenised), the context's, the completion's. Each dialect's envelope words it as its
    own API does, with the numbers agents read back to compact by (Claude Code parses N and
    M out of "prompt is too long: N tokens > M maximum")."""

    prompt_tokens: int
    context_length: int
    completion_tokens: int
    at_least: bool = False

    @property
    def maximum(self) -> int:
        """The longest prompt this request could have had."""
        return self.context_length - self.completion_tokens

    def openai(self) -> str:
        """OpenAI's words (the code `context_length_exceeded` is what Codex and opencode
        read)."""
        least = "at least " if self.at_least else ""
        prompt, completion = self.prompt_tokens, self.completion_tokens
        counted = ", counted from its length before tokenising" if self.at_least else ""
        return (
            f"This model's maximum context length is {self.context_length} tokens. However, "
            f"you requested {least}{prompt + completion} tokens ({least}{prompt} in the "
            f"prompt{counted}, {completion} in the completion). Please reduce the length of "
            "the prompt or the completion."
        )

    def anthropic(self) -> str:
        """Anthropic's words, which Claude Code matches to compact."""
        least = "at least " if self.at_least else ""
        return f"prompt is too long: {least}{self.prompt_tokens} tokens > {self.maximum} maximum"


@dataclass
class ApiError(Exception):
    """An error for one request, rendered as the SPEC §4 envelope."""

    type: ErrorType | str  # a string is checked against ErrorType
    message: str
    retry_after: int | None = None
    fault: dict[str, str] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    param: str | None = None  # the request field at fault, when one is (OpenAI's `param`)
    overflow: Overflow | None = None  # a prompt over the context (`too_long`)

    @classmethod
    def too_long(cls, overflow: Overflow) -> ApiError:
        """`context_length_exceeded`, in OpenAI's words unless an envelope words it."""
        return cls("context_length_exceeded", overflow.openai(), overflow=overflow)

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
        """The SPEC §4 envelope; `error` alone is what an OpenAI SSE error event carries."""
        return SPEC.body(self, request_id)

    def details(self) -> dict[str, Any]:
        """steward's own fields, which every dialect's envelope carries beside its own."""
        extra: dict[str, Any] = {"retryable": self.retryable}
        if self.retry_after is not None:
            extra["retry_after"] = self.retry_after
        if self.fault is not None:
            extra["fault"] = self.fault
        return extra

    def response_headers(self, request_id: str) -> dict[str, str]:
        headers = {
            **self.headers,
            "x-should-retry": "true" if self.retryable else "false",
            "x-request-id": request_id,
        }
        if self.retry_after is not None:
            headers["retry-after"] = str(self.retry_after)
        return headers


class Envelope:
    """The SPEC §4 envelope (mlx-knife's, readable by the OpenAI SDK): OpenAI's dialects."""

    def body(self, error: ApiError, request_id: str) -> dict[str, Any]:
        shaped: dict[str, Any] = {
            "type": error.type,
            "message": error.message,
            "retryable": error.retryable,
            "code": error.type,
        }
        if error.param is not None:
            shaped["param"] = error.param
        shaped |= error.details()
        return {"status": "error", "error": shaped, "request_id": request_id}


# steward's type -> Anthropic's (docs.anthropic.com "Errors"); the status stays steward's.
ANTHROPIC_TYPES: dict[ErrorType, str] = {
    ErrorType.VALIDATION_ERROR: "invalid_request_error",
    ErrorType.CONTEXT_LENGTH_EXCEEDED: "invalid_request_error",
    ErrorType.UNAUTHORIZED: "authentication_error",
    ErrorType.MODEL_NOT_FOUND: "not_found_error",
    ErrorType.NOT_FOUND: "not_found_error",
    ErrorType.METHOD_NOT_ALLOWED: "invalid_request_error",
    ErrorType.BODY_TIMEOUT: "invalid_request_error",
    ErrorType.REQUEST_TOO_LARGE: "request_too_large",
    ErrorType.REQUEST_QUARANTINED: "invalid_request_error",
    ErrorType.OVERLOADED: "overloaded_error",
    ErrorType.INTERNAL_ERROR: "api_error",
    ErrorType.BACKEND_UNAVAILABLE: "overloaded_error",
    ErrorType.SERVER_SHUTDOWN: "overloaded_error",
    ErrorType.TOO_MANY_CONNECTIONS: "overloaded_error",
    ErrorType.GENERATION_TIMEOUT: "timeout_error",
    ErrorType.INSUFFICIENT_MEMORY: "api_error",
    ErrorType.INSUFFICIENT_STORAGE: "api_error",
}


class AnthropicEnvelope(Envelope):
    """Anthropic's `{"type": "error", "error": {"type", "message"}, "request_id"}`, with
    steward's own type as `code` and its retry and fault fields added: the body of an
    error response and, unchanged, the data of a stream's `event: error`. A prompt over
    the context says so in Anthropic's words (`Overflow.anthropic`)."""

    def body(self, error: ApiError, request_id: str) -> dict[str, Any]:
        message = error.overflow.anthropic() if error.overflow else error.message
        shaped = {
            "type": ANTHROPIC_TYPES[ErrorType(error.type)],
            "message": message,
            "code": error.type,
            **error.details(),
        }
        return {"type": "error", "error": shaped, "request_id": request_id}


SPEC = Envelope()
ANTHROPIC = AnthropicEnvelope()
ENVELOPES: tuple[tuple[str, Envelope], ...] = (("/v1/messages", ANTHROPIC),)


def envelope_for(path: str) -> Envelope:
    """The envelope of the dialect that serves `path` (its route's prefix); else SPEC §4."""
    for prefix, envelope in ENVELOPES:
        if path == prefix or path.startswith(prefix + "/"):
            return envelope
    return SPEC


def error_response(error: ApiError, request_id: str, path: str = "") -> JSONResponse:
    """The error as the dialect serving `path` writes it, with the SPEC §4 headers."""
    return JSONResponse(
        envelope_for(path).body(error, request_id),
        error.status,
        headers=error.response_headers(request_id),
    )

"""The supervisor's words: every error it answers a request with, in one place.

Each says what happened and whether waiting helps (`Retry-After`); one that a fault caused
names it (SPEC §4). The HTTP side (admission.py), the job path (dispatch.py) and the loop
(supervisor.py) choose which; the words are here.
"""

from __future__ import annotations

from steward.errors import ApiError, Overflow
from steward.supervisor.faults import Fault
from steward.supervisor.state import State
from steward.wire.protocol import Rejected


def refused(state: State, last: Fault | None, retry_after: int) -> ApiError | None:
    """The error for a new request in this state, if it may not wait."""
    if state is State.STOPPING:
        return ApiError("server_shutdown", "The server is shutting down.", retry_after)
    if state is State.FAILED:
        return exiting(last, retry_after)
    return None


def quarantined(window: float, fault: Fault | None = None) -> ApiError:
    return ApiError(
        "request_quarantined",
        "This request's payload was named by two backend faults; it and identical requests "
        f"are refused for {window:.0f} s.",
        fault=fault.ref() if fault else None,
    )


def full(size: int, retry_after: int) -> ApiError:
    return ApiError("overloaded", f"The request queue is full ({size} waiting).", retry_after)


def waited(state: State, queue_timeout: float, last: Fault | None, retry_after: int) -> ApiError:
    """Why a job is still waiting after --queue-timeout."""
    if state.serving:
        return ApiError(
            "overloaded", f"No capacity within {queue_timeout:.0f} s (queue-timeout).", retry_after
        )
    return ApiError(
        "backend_unavailable",
        f"The backend is {state}; not ready within {queue_timeout:.0f} s.",
        retry_after,
        fault=last.ref() if last else None,
    )


def exiting(fault: Fault | None, retry_after: int) -> ApiError:
    return ApiError(
        "backend_unavailable",
        "The backend cannot recover in this process; it is exiting to be restarted.",
        retry_after,
        fault=fault.ref() if fault else None,
    )


def too_big(fault: Fault) -> ApiError:
    return ApiError(
        "insufficient_memory",
        "The backend ran out of memory on this request and is healthy otherwise; a smaller "
        "request (shorter prompt, fewer max_tokens) may succeed.",
        fault=fault.ref(),
    )


def unusable(reason: str) -> ApiError:
    """The model cannot be loaded at all (exit 78): no retry will help."""
    return ApiError("backend_unavailable", f"The model cannot be served: {reason}.")


def shutdown() -> ApiError:
    return ApiError("server_shutdown", "The server shut down before answering.", 1)


def bug(what: str) -> ApiError:
    return ApiError("internal_error", f"A bug in steward failed this request ({what}).")


def rejection(rejected: Rejected) -> ApiError:
    """The worker's refusal of a request as its error; a prompt over the context keeps its
    counts, for each dialect's words."""
    if not rejected.context_length:
        return ApiError(rejected.type, rejected.message)
    counts = (rejected.prompt_tokens, rejected.context_length, rejected.completion_tokens)
    return ApiError.too_long(Overflow(*counts))

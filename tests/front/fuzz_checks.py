"""Schemathesis hooks for test_fuzz.py (loaded by the `st` CLI via SCHEMATHESIS_HOOKS).

One custom check: every error answer is its dialect's envelope (SPEC §4; Anthropic's
under /v1/messages, with steward's fields added).
"""

from __future__ import annotations

import json

import schemathesis


@schemathesis.check
def error_envelope(ctx, response, case) -> None:
    """Status >= 400: a JSON body in its dialect's envelope, `x-should-retry` matching it."""
    if response.status_code < 400:
        return
    try:
        body = json.loads(response.content)
    except ValueError:
        raise AssertionError(
            f"{response.status_code} answer is not JSON: {response.content[:300]!r}"
        ) from None
    assert isinstance(body, dict), f"{response.status_code} answer is not an object: {body!r}"
    error = body.get("error")
    anthropic = case.path == "/v1/messages" or case.path.startswith("/v1/messages/")
    key = "type" if anthropic else "status"
    assert body.get(key) == "error", f"no {key!r}: 'error' in {body!r}"
    assert isinstance(error, dict), f"no 'error' object in {body!r}"
    assert isinstance(error.get("type"), str) and error["type"], f"no error type in {body!r}"
    assert isinstance(error.get("message"), str) and error["message"], f"no message: {body!r}"
    assert isinstance(error.get("retryable"), bool), f"no boolean 'retryable' in {body!r}"
    assert isinstance(body.get("request_id"), str), f"no request_id in {body!r}"
    should_retry = response.headers.get("x-should-retry", [None])[0]
    assert should_retry == ("true" if error["retryable"] else "false"), (
        f"x-should-retry {should_retry!r} does not match retryable={error['retryable']}"
    )

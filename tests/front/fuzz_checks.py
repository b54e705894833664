"""Schemathesis hooks for test_fuzz.py (loaded by the `st` CLI via SCHEMATHESIS_HOOKS).

Two custom checks: every error answer is its dialect's envelope (SPEC §4; Anthropic's
under /v1/messages, with steward's fields added); and every top-level field a body carries
that its route's schema lacks is named in the `steward-ignored` header, on the answer or
the error (SPEC §8: ignored, never refused, never silently dropped). The schemas allow
extra fields, so the fuzzer sends them, of any name.
"""

from __future__ import annotations

import json

import schemathesis

from steward.errors import ApiError
from steward.front.body import check
from steward.front.ignored import join


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


@schemathesis.check
def unknown_fields_named(ctx, response, case) -> None:
    """Each top-level field of the body that the schema does not have is in
    `steward-ignored` (or past its bound, counted as `+N more`)."""
    if not isinstance(case.body, dict) or not case.operation.body or response.status_code >= 500:
        return
    if case.method.upper() != case.operation.method.upper():  # a 405: no route ran
        return
    sent_as = response.request.headers.get("Content-Type", "")
    if "json" not in sent_as or not readable(case.body):
        return  # refused before validation
    known = case.operation.body[0].resolved_schema.get("properties", {})
    unknown = [join("", key) for key in case.body if key not in known]
    if not unknown or response.status_code in (401, 413):  # refused before the body is read
        return
    named = response.headers.get("steward-ignored", [""])[0]
    if named.endswith(" more"):
        return
    missing = [path for path in unknown if path not in named.split(", ")]
    assert not missing, f"{missing} not named in steward-ignored: {named!r}"


def readable(body: object) -> bool:
    """A body steward reads at all (body.py: encodable strings, bounded nesting)."""
    try:
        check(body)
    except ApiError:
        return False
    return True

"""The dialect seam over a scripted supervisor (tests/front/scripted.py): error envelopes
per dialect, the API key in either header, model names and globs, the default cap, unknown
routes, `param`, and the access log."""

from __future__ import annotations

import logging

import pytest
from pydantic import BaseModel

from steward.errors import ANTHROPIC_TYPES, ErrorType
from steward.front.dialects.exchange import dialect_router
from tests.front.scripted import MODEL, client, says

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


class Probe(BaseModel):
    max_tokens: int


def hello(job):
    return says("Hel", "lo")


def test_every_steward_type_has_an_anthropic_type() -> None:
    assert set(ANTHROPIC_TYPES) == set(ErrorType)
    assert ANTHROPIC_TYPES[ErrorType.OVERLOADED] == "overloaded_error"
    assert ANTHROPIC_TYPES[ErrorType.BACKEND_UNAVAILABLE] == "overloaded_error"


def test_errors_under_messages_are_anthropic_shaped_before_any_route() -> None:
    http, _ = client(hello)
    answer = http.post("/v1/messages/nothing-here", json={})
    assert answer.status_code == 404
    body = answer.json()
    assert body["type"] == "error"
    assert body["error"]["type"] == "not_found_error"
    assert body["error"]["code"] == "not_found"
    assert body["error"]["retryable"] is False
    assert body["request_id"] == answer.headers["x-request-id"]
    assert answer.headers["x-should-retry"] == "false"
    assert http.post("/v1/messagesX", json={}).json()["status"] == "error"  # not the prefix


def test_an_oversized_body_under_messages_is_anthropic_shaped() -> None:
    http, _ = client(hello, max_body_bytes=100)
    answer = http.post("/v1/messages", content=b"x" * 200)
    assert answer.status_code == 413
    assert answer.json()["error"]["type"] == "request_too_large"


def test_validation_errors_under_messages_use_its_envelope() -> None:
    """A route a dialect adds under /v1/messages gets its validation errors in its shape."""
    http, _ = client(hello, api_key="k")
    router = dialect_router()

    @router.post("/messages/probe")
    def probe(body: Probe) -> dict:
        return {}

    http.app.include_router(router)
    answer = http.post("/v1/messages/probe", json={}, headers={"x-api-key": "k"})
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and "max_tokens" in error["message"]
    refused = http.post("/v1/messages/probe", json={"max_tokens": 1})
    assert refused.status_code == 401
    assert refused.json()["error"]["type"] == "authentication_error"
    wrong = http.get("/v1/messages/probe", headers={"x-api-key": "k"})
    assert wrong.status_code == 405 and wrong.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({}, 401),
        ({"x-api-key": "wrong"}, 401),
        ({"x-api-key": "sesame"}, 200),
        ({"authorization": "Bearer sesame"}, 200),
        ({"authorization": "Basic sesame"}, 401),
    ],
)
def test_the_api_key_in_either_header(headers: dict, status: int) -> None:
    http, _ = client(hello, api_key="sesame")
    answer = http.post("/v1/chat/completions", json=CHAT, headers=headers)
    assert answer.status_code == status, answer.text


def test_a_glob_maps_agent_names_and_is_not_listed() -> None:
    http, _ = client(hello, served_model_name=["smol", "claude-*"])
    for name in ("claude-sonnet-4-5", "claude-3-5-haiku-latest", "smol", MODEL, "default"):
        answer = http.post("/v1/chat/completions", json=CHAT | {"model": name})
        assert answer.status_code == 200, name
        assert answer.json()["model"] == MODEL
    unknown = http.post("/v1/chat/completions", json=CHAT | {"model": "gpt-4o"})
    assert unknown.status_code == 404
    assert unknown.json()["error"]["type"] == "model_not_found"
    assert unknown.json()["error"]["param"] == "model"
    listed = http.get("/v1/models").json()["data"]
    assert [m["id"] for m in listed] == [MODEL, "smol"]
    assert {m["max_tokens_default"] for m in listed} == {4096}


def test_the_default_cap_applies_when_max_tokens_is_omitted() -> None:
    http, supervisor = client(hello, max_tokens_default=100)
    http.post("/v1/chat/completions", json=CHAT)
    http.post("/v1/chat/completions", json=CHAT | {"max_tokens": 7})
    http.post("/v1/completions", json={"prompt": "x", "max_tokens": None})
    assert [job.request.max_tokens for job in supervisor.jobs] == [100, 7, 100]


def test_where_the_cap_leaves_no_room_the_context_bounds_the_answer() -> None:
    http, supervisor = client(hello, max_tokens_default=5000)  # context 2048
    assert http.post("/v1/chat/completions", json=CHAT).status_code == 200
    assert [job.request.max_tokens for job in supervisor.jobs] == [None]


def test_a_worker_rejection_of_the_cap_falls_back_to_the_context() -> None:
    from steward.errors import ApiError

    def reject_capped(job):
        if job.request.max_tokens is not None:
            return [ApiError("context_length_exceeded", "no room for 100")]
        return says("ok")

    http, supervisor = client(reject_capped, max_tokens_default=100)
    answer = http.post("/v1/chat/completions", json=CHAT)
    assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"] == "ok"
    assert [job.request.max_tokens for job in supervisor.jobs] == [100, None]
    explicit = http.post("/v1/chat/completions", json=CHAT | {"max_tokens": 9})
    assert explicit.status_code == 400  # a client's own max_tokens is never second-guessed


def test_an_unknown_route_names_the_served_ones() -> None:
    http, _ = client(hello)
    answer = http.post("/v1/chat/complete", json=CHAT)
    assert answer.status_code == 404
    message = answer.json()["error"]["message"]
    for route in ("POST /v1/chat/completions", "POST /v1/completions", "GET /v1/models"):
        assert route in message


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (CHAT | {"temperature": 9}, "temperature"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages.0.content.str"),
        (CHAT | {"tool_choice": "required"}, "tool_choice"),
        (CHAT | {"modalities": ["text", "audio"]}, "modalities"),
        (CHAT | {"n": 50}, "n"),
    ],
)
def test_validation_errors_carry_param(body: dict, param: str) -> None:
    http, _ = client(hello)
    answer = http.post("/v1/chat/completions", json=body)
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == param, answer.text


def test_the_access_log_says_id_model_error_and_tokens(caplog: pytest.LogCaptureFixture) -> None:
    http, _ = client(hello)
    with caplog.at_level(logging.INFO, logger="steward.access"):
        http.post("/v1/chat/completions", json=CHAT, headers={"x-request-id": "r-1"})
        http.post(
            "/v1/chat/completions", json=CHAT | {"model": "x"}, headers={"x-request-id": "r-2"}
        )
        stream = CHAT | {"stream": True}
        http.post("/v1/chat/completions", json=stream, headers={"x-request-id": "r-3"})
    lines = [r.getMessage() for r in caplog.records if r.name == "steward.access"]
    assert any(
        "id=r-1" in line and f"model={MODEL}" in line and "tokens=5+2" in line for line in lines
    )
    assert any("id=r-2" in line and "error=model_not_found" in line for line in lines)
    assert any("id=r-3" in line and "tokens=5+2" in line for line in lines), lines
    record = next(r for r in caplog.records if "id=r-1" in r.getMessage())
    assert record.access["completion_tokens"] == 2 and record.access["model"] == MODEL

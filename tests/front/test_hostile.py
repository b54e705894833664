"""Nothing a client sends may wedge steward (SPEC §4, §5a; issue 8).

Hostile bodies, routes and malformed HTTP against one real server on the tiny model. Each
test ends the way a new user's script would: a normal request, answered at once, and a
`/health` that is `ready` with no fault counted. A request's own error is a 4xx; it never
reaches the worker as a fault, never changes the state.

Every call has a short timeout: where a request is never answered (today's wedge), the test
fails in seconds instead of hanging. Tests share one server; if a test leaves it unusable
(it exited, stopped answering, or counted a fault), the next test gets a fresh one, so each
test fails for its own reason only.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import Server
from tests.front import rawhttp
from tests.front.test_openai_api import assert_envelope

CHAT = [{"role": "user", "content": "Hello there"}]
NORMAL = {"prompt": "hello", "max_tokens": 2, "temperature": 0}
JSON = {"content-type": "application/json"}
QUICK = 5.0  # seconds: a hostile request's answer, and the normal request after it


class Shared:
    """One server for the module, replaced when a test has left it harmed."""

    def __init__(self, tiny_model: Path) -> None:
        # Short queue and drain timeouts only shorten the failures of a wedged server.
        self.args = ["--model", str(tiny_model), "--queue-timeout", "2", "--drain-timeout", "1"]
        self.server: Server | None = None

    def get(self) -> Server:
        if self.server is not None and harm(self.server) is not None:
            self.server.stop()
            self.server = None
        if self.server is None:
            self.server = Server(self.args)
            self.server.wait(timeout=60)
        return self.server

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()


@pytest.fixture(scope="module")
def shared(tiny_model: Path) -> Iterator[Shared]:
    holder = Shared(tiny_model)
    yield holder
    holder.close()


@pytest.fixture
def server(shared: Shared) -> Server:
    return shared.get()


def harm(server: Server) -> str | None:
    """What is wrong with the server after a hostile request; None when nothing is."""
    if server.proc.poll() is not None:
        return f"the server exited {server.proc.returncode}"
    try:
        reply = httpx.post(server.url + "/v1/completions", json=NORMAL, timeout=QUICK)
        health = httpx.get(server.url + "/health", timeout=QUICK).json()
    except httpx.TransportError as exc:
        return f"a normal request got no answer within {QUICK} s ({exc!r})"
    if reply.status_code != 200:
        return f"a normal request got {reply.status_code}: {reply.text[:300]}"
    if health["status"] != "ready" or health["faults"]["total"] != 0:
        return f"/health is {health['status']} with {health['faults']['total']} fault(s)"
    return None


def assert_unharmed(server: Server) -> None:
    problem = harm(server)
    assert problem is None, problem


def post(
    server: Server, path: str, body: bytes | dict, headers: dict | None = None
) -> httpx.Response:
    """POST raw bytes (or JSON) with a short timeout; no answer is a clear failure."""
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    try:
        return httpx.post(
            server.url + path,
            content=content,
            headers=JSON if headers is None else headers,
            timeout=QUICK,
        )
    except httpx.TimeoutException:
        pytest.fail(f"POST {path}: no answer within {QUICK} s")


def assert_400(response: httpx.Response, *kinds: str) -> dict:
    """A 400 in the envelope, not retryable, of one of `kinds` (default validation_error)."""
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["error"]["type"] in (kinds or ("validation_error",)), body
    return assert_envelope(response, 400, body["error"]["type"])


# -- strings that cannot be encoded ---------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "raw", "field"),
    [
        ("/v1/completions", rb'{"prompt":"x\ud800","max_tokens":1}', "prompt"),
        ("/v1/completions", rb'{"prompt":["x\udfff"],"max_tokens":1}', "prompt"),
        (
            "/v1/chat/completions",
            rb'{"messages":[{"role":"user","content":"x\ud800"}],"max_tokens":1}',
            "messages.0.content",
        ),
        (
            "/v1/chat/completions",
            rb'{"messages":[{"role":"user","content":[{"type":"text","text":"\udc00"}]}],'
            rb'"max_tokens":1}',
            "messages.0.content",
        ),
        ("/v1/completions", rb'{"prompt":"hi","max_tokens":1,"stop":["\ud800"]}', "stop"),
        (
            "/v1/chat/completions",
            rb'{"messages":[{"role":"user","content":"hi","name":"\udfff"}],"max_tokens":1}',
            "messages.0.name",
        ),
    ],
    ids=["prompt", "prompt-list", "chat-content", "chat-part", "stop", "message-name"],
)
def test_lone_surrogate_is_400_naming_the_field(server, path, raw, field) -> None:
    body = assert_400(post(server, path, raw))
    assert field in body["error"]["message"], body
    assert_unharmed(server)


def test_surrogate_pair_is_a_character(server) -> None:
    reply = post(server, "/v1/completions", rb'{"prompt":"x\ud83d\ude00","max_tokens":1}')
    assert reply.status_code == 200, reply.text
    assert_unharmed(server)


# -- integers out of range -------------------------------------------------------------------


@pytest.mark.parametrize("value", [2**64, 2**63, -1], ids=["2^64", "2^63", "-1"])
@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/v1/completions", "max_tokens"),
        ("/v1/chat/completions", "max_tokens"),
        ("/v1/chat/completions", "max_completion_tokens"),
    ],
    ids=["completion", "chat", "chat-completion-tokens"],
)
def test_max_tokens_out_of_range_is_400(server, path, field, value) -> None:
    body = {"messages": CHAT} if path == "/v1/chat/completions" else {"prompt": "hi"}
    reply = post(server, path, {**body, field: value})
    assert_400(reply, "validation_error", "context_length_exceeded")
    assert_unharmed(server)


CHAT_BODY = {"messages": CHAT, "max_tokens": 1}
TEXT_BODY = {"prompt": "hi", "max_tokens": 1}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        *(
            (path, {**base, **extra})
            for path, base in (("/v1/chat/completions", CHAT_BODY), ("/v1/completions", TEXT_BODY))
            for extra in (
                {"seed": 2**64},
                {"seed": -(2**63) - 1},
                {"n": 2**64},
                {"logit_bias": {"18446744073709551616": 1}},
                {"logit_bias": {"5": 2**64}},
            )
        ),
        ("/v1/chat/completions", {**CHAT_BODY, "top_logprobs": 2**64}),
        ("/v1/completions", {**TEXT_BODY, "logprobs": 2**64}),
    ],
    ids=[
        *(
            f"{kind}-{name}"
            for kind in ("chat", "text")
            for name in ("seed-2^64", "seed-below-int64", "n-2^64", "bias-key", "bias-value")
        ),
        "chat-top_logprobs-2^64",
        "text-logprobs-2^64",
    ],
)
def test_numbers_out_of_range_are_400(server, path, body) -> None:
    assert_400(post(server, path, body))
    assert_unharmed(server)


# -- empty prompts ----------------------------------------------------------------------------


@pytest.mark.parametrize("prompt", ["", [""]], ids=["empty", "list-of-empty"])
def test_empty_prompt_is_400_not_a_fault(server, prompt) -> None:
    for seed in (1, 2):  # a client retrying with another seed: still no fault
        assert_400(
            post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 1, "seed": seed})
        )
    assert_unharmed(server)


# -- the context length -----------------------------------------------------------------------


def context_length(server: Server) -> int:
    models = httpx.get(server.url + "/v1/models", timeout=QUICK).json()["data"]
    return models[0]["context_length"]


def test_prompt_longer_than_context_is_400(server) -> None:
    words = context_length(server) + 100
    reply = post(server, "/v1/completions", {"prompt": "hello " * words, "max_tokens": 1})
    assert_400(reply, "context_length_exceeded")
    assert_unharmed(server)


def test_huge_prompt_is_refused_at_once(server) -> None:
    content = json.dumps({"prompt": "hello " * 3_500_000, "max_tokens": 1}).encode()
    assert 20 * 2**20 < len(content) < 30 * 2**20  # ~21 MB: under the 32 MB body limit
    reply = post(server, "/v1/completions", content)
    assert_400(reply, "context_length_exceeded")
    # refused by the front's bound on characters, never tokenised by the worker
    assert "counted from its length before tokenising" in reply.json()["error"]["message"]
    normal = post(server, "/v1/completions", NORMAL)
    assert normal.status_code == 200, normal.text
    assert_unharmed(server)


@pytest.mark.parametrize("over", [0, 1])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_max_tokens_at_context_length_is_400(server, path, over) -> None:
    limit = context_length(server) + over
    body = {"messages": CHAT} if path == "/v1/chat/completions" else {"prompt": "hi"}
    assert_400(post(server, path, {**body, "max_tokens": limit}), "context_length_exceeded")
    assert_unharmed(server)


# -- bodies that are not JSON, or not sane JSON ---------------------------------------------


@pytest.mark.parametrize(
    "content_type", ["application/x-www-form-urlencoded", "text/plain"], ids=["curl-d", "text"]
)
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_body_without_json_content_type_is_400_saying_so(server, path, content_type) -> None:
    body = {"messages": CHAT} if path == "/v1/chat/completions" else {"prompt": "hi"}
    content = json.dumps({**body, "max_tokens": 1}).encode()
    reply = post(server, path, content, headers={"content-type": content_type})
    message = assert_400(reply)["error"]["message"]
    assert "application/json" in message, message
    assert_unharmed(server)


DEEP = b"[" * 100_000 + b"]" * 100_000
DEEP_OBJECT = b'{"a":' * 100_000 + b"1" + b"}" * 100_000


@pytest.mark.parametrize(
    "raw",
    [
        b"{not json",
        b'{"prompt": "hi", "max_tokens": 1',
        b"",
        b'{"prompt": "\xff\xfe", "max_tokens": 1}',
        DEEP,
        DEEP_OBJECT,
        b'{"prompt":' + DEEP + b',"max_tokens":1}',
        b'{"prompt":"hi","max_tokens":1,"stream_options":' + DEEP_OBJECT + b"}",
    ],
    ids=[
        "garbage",
        "truncated",
        "empty",
        "not-utf8",
        "deep-array",
        "deep-object",
        "deep-field",
        "deep-object-field",
    ],
)
def test_invalid_or_deep_json_is_400(server, raw) -> None:
    assert_400(post(server, "/v1/completions", raw))
    assert_unharmed(server)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"prompt":"hi","max_tokens":1,"temperature":NaN}',
        b'{"prompt":"hi","max_tokens":1,"temperature":Infinity}',
        b'{"prompt":"hi","max_tokens":1,"temperature":-Infinity}',
        b'{"prompt":"hi","max_tokens":1,"top_p":NaN}',
        b'{"prompt":"hi","max_tokens":1,"top_p":Infinity}',
        b'{"prompt":"hi","max_tokens":1,"temperature":1e400}',
    ],
    ids=[
        "temperature-nan",
        "temperature-inf",
        "temperature-minus-inf",
        "top_p-nan",
        "top_p-inf",
        "temperature-1e400",
    ],
)
def test_nan_and_infinity_are_400(server, raw) -> None:
    assert_400(post(server, "/v1/completions", raw))
    assert_unharmed(server)


# -- routes ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/v1/nothing-here"), ("POST", "/v2/chat/completions"), ("GET", "/admin")],
)
def test_unknown_route_is_404_in_the_envelope(server, method, path) -> None:
    reply = httpx.request(method, server.url + path, timeout=QUICK)
    assert_envelope(reply, 404, "not_found")


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("GET", "/v1/chat/completions", "POST"),
        ("GET", "/v1/completions", "POST"),
        ("PUT", "/v1/completions", "POST"),
        ("DELETE", "/health", "GET"),
        ("POST", "/health/live", "GET"),
        ("POST", "/v1/models", "GET"),
    ],
)
def test_wrong_method_is_405_with_allow(server, method, path, allowed) -> None:
    reply = httpx.request(method, server.url + path, timeout=QUICK)
    assert_envelope(reply, 405, "method_not_allowed")
    assert "allow" in reply.headers, f"405 without an Allow header: {dict(reply.headers)}"
    methods = {m.strip().upper() for m in reply.headers["allow"].split(",")}
    assert allowed in methods and method not in methods, reply.headers["allow"]


# -- malformed HTTP, answered below the app ---------------------------------------------------


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: -1\r\n\r\n{}",
        # headers of 1 MB sent at once: more than one read holds, so h11's 16 KB bound for
        # headers still incomplete applies (20 KB arriving whole in one read would pass)
        b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: " + b"a" * 2**20 + b"\r\n\r\n",
        # still arriving: over 16 KB and no end of the headers yet
        b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: " + b"a" * 20_000,
    ],
    ids=["negative-content-length", "headers-of-1mb", "headers-over-16k-unfinished"],
)
def test_malformed_http_is_400_in_the_envelope_and_closed(server, request_bytes) -> None:
    response = rawhttp.exchange(server.port, request_bytes, timeout=QUICK)
    rawhttp.assert_raw_envelope(response, 400, "validation_error")
    assert response.closed, "the connection was left open after a malformed request"
    assert_unharmed(server)

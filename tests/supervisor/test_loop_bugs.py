"""The supervisor never dies silently (SPEC §4 `internal_error`, §6, §7 exit 70; issue 8).

A bug in steward's own supervision loop (injected at the `supervisor` point) fails only the
request that met it; if the loop ends anyway, health says `failed` at once and the process
exits 70 on its own. And the two requests that ended the loop unnoticed before (a lone
surrogate, a `max_tokens` of 2**64) leave the server serving.
"""

from __future__ import annotations

import httpx
import pytest

from tests.front.test_openai_api import assert_envelope

CHAT = [{"role": "user", "content": "Hello there"}]
BODY = {"messages": CHAT, "max_tokens": 2, "temperature": 0}
QUICK = 5.0


def chat(server, content: bytes | None = None, timeout: float = QUICK) -> httpx.Response:
    try:
        return httpx.post(
            server.url + "/v1/chat/completions",
            json=None if content else BODY,
            content=content,
            headers={"content-type": "application/json"},
            timeout=timeout,
        )
    except httpx.TimeoutException:
        pytest.fail(f"no answer within {timeout} s: the server is wedged")


def test_exception_in_the_loop_fails_only_its_request(serve, tiny_model) -> None:
    server = serve("--model", str(tiny_model), "--inject-fault", "supervisor:raise:nth=1")
    server.wait()
    body = assert_envelope(chat(server), 500, "internal_error")
    assert body["error"]["retryable"] is False
    assert chat(server).status_code == 200  # the loop went on
    health = server.health().json()
    assert health["status"] == "ready", health
    assert health["faults"]["total"] == 0  # a bug in steward is no backend fault
    assert server.health().status_code == 200
    assert server.output().count("Traceback (most recent call last)") == 1, server.output()


def test_loop_that_ends_says_failed_and_exits_70(serve, tiny_model) -> None:
    server = serve("--model", str(tiny_model), "--inject-fault", "supervisor:crash:nth=1")
    server.wait()
    assert_envelope(chat(server), 500, "internal_error")
    for path in ("/health", "/health/ready"):  # at once, before the process has gone
        reply = httpx.get(server.url + path, timeout=QUICK)
        assert reply.status_code == 503, (path, reply.text)
        assert reply.json()["status"] == "failed", (path, reply.text)
    assert server.exit_code(timeout=15) == 70, server.output()


@pytest.mark.parametrize(
    "content",
    [
        rb'{"messages":[{"role":"user","content":"x\ud800"}],"max_tokens":1}',
        b'{"messages":[{"role":"user","content":"hi"}],"max_tokens":18446744073709551616}',
    ],
    ids=["lone-surrogate", "max_tokens-2^64"],
)
def test_request_that_wedged_the_loop_leaves_it_serving(serve, tiny_model, content) -> None:
    server = serve("--model", str(tiny_model), "--drain-timeout", "1")  # if wedged, stop soon
    server.wait()
    hostile = chat(server, content)
    assert hostile.status_code == 400, hostile.text
    assert chat(server).status_code == 200
    health = server.health().json()
    assert health["status"] == "ready" and health["faults"]["total"] == 0, health

"""A prompt over the context gets the error its dialect's own API gives (issue 28, SPEC §8),
so agents that compact on it do: Anthropic's 400 `invalid_request_error` "prompt is too
long: N tokens > M maximum" (what Claude Code matches, reading N and M), OpenAI's 400 with
the code `context_length_exceeded` (what Codex and opencode match). On a real server whose
tiny model has a 256-token context, through both paths that refuse a prompt: the worker's,
after tokenising (N the prompt's true count), and the front's bound on characters before
it (N a lower bound, said so). `/v1/models` gives the context length before any request.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from tests.conftest import Server

CONTEXT = 256
ANTHROPIC = re.compile(r"^prompt is too long: (at least )?(\d+) tokens > (\d+) maximum$")
OPENAI = re.compile(r"^This model's maximum context length is (\d+) tokens\. However, you")
# Past the context once tokenised, within the front's bound on characters (its 1,000
# words are about 2,000 tokens; the bound lets through up to 256 x the longest token).
WORKER = "hello " * 1_000
FRONT = "hello " * 40_000  # past that bound: refused before it is tokenised


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> Iterator[Server]:
    from tests.tinymodel import build_tiny_model

    model = build_tiny_model(
        tmp_path_factory.mktemp("short") / "short", default_model_dir, context=CONTEXT
    )
    server = Server(["--model", str(model), "--standby", "none", "--served-model-name", "claude-*"])
    server.wait()
    yield server
    server.stop()


def messages(server: Server, text: str, route: str = "/v1/messages") -> dict[str, Any]:
    body: dict[str, Any] = {"model": "claude-x", "messages": [{"role": "user", "content": text}]}
    if route == "/v1/messages":
        body["max_tokens"] = 32000  # Claude Code's: a bound, not a demand
    answer = server.http.post(route, json=body)
    assert answer.status_code == 400, answer.text
    assert answer.headers["x-should-retry"] == "false"
    return answer.json()


def counts(message: str) -> tuple[bool, int, int]:
    """Anthropic's message read: a lower bound?, the prompt's tokens, the maximum."""
    found = ANTHROPIC.match(message)
    assert found, message
    return found[1] is not None, int(found[2]), int(found[3])


def test_models_give_the_context_length_before_any_request(server: Server) -> None:
    (model,) = server.http.get("/v1/models").json()["data"]
    assert model["context_length"] == CONTEXT


@pytest.mark.parametrize("route", ["/v1/messages", "/v1/messages/count_tokens"])
def test_anthropic_says_prompt_is_too_long_with_its_counts(server: Server, route: str) -> None:
    worker = messages(server, WORKER, route)
    assert worker["type"] == "error" and worker["error"]["type"] == "invalid_request_error"
    assert worker["error"]["code"] == "context_length_exceeded"
    # N is the prompt's true count, template included: 900 words (a token each) more than
    # the same prompt of 100 words, which fits and is counted
    short = {"model": "claude-x", "messages": [{"role": "user", "content": "hello " * 100}]}
    fits = server.http.post("/v1/messages/count_tokens", json=short).json()["input_tokens"]
    assert counts(worker["error"]["message"]) == (False, fits + 900, CONTEXT - 1)
    least, lower, maximum = counts(messages(server, FRONT, route)["error"]["message"])
    assert least and maximum == CONTEXT - 1 < lower


def test_the_anthropic_sdk_reads_it_as_claude_code_does(server: Server) -> None:
    client = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(
            model="claude-x", max_tokens=100, messages=[{"role": "user", "content": WORKER}]
        )
    # Claude Code's own reading of the SDK's error (its bundled cli.js, 2.1.332)
    found = re.search(r"prompt is too long[^0-9]*(\d+)\s*tokens?\s*>\s*(\d+)", str(refused.value))
    assert found and int(found[1]) > int(found[2]) == CONTEXT - 1


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("/v1/chat/completions", lambda text: {"messages": [{"role": "user", "content": text}]}),
        ("/v1/completions", lambda text: {"prompt": text, "max_tokens": 4}),
        ("/v1/responses", lambda text: {"input": text, "max_output_tokens": 4}),
    ],
)
def test_openai_dialects_say_context_length_exceeded(server: Server, route: str, body) -> None:
    for text, least in [(WORKER, False), (FRONT, True)]:
        answer = server.http.post(route, json=body(text))
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert error["code"] == "context_length_exceeded" == error["type"]
        assert OPENAI.match(error["message"]) and f" {CONTEXT} tokens" in error["message"]
        assert ("at least" in error["message"]) == least


def test_the_openai_sdk_raises_it_as_a_bad_request(server: Server) -> None:
    client = server.client(max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="default", input=WORKER, max_output_tokens=4)
    assert refused.value.code == "context_length_exceeded"

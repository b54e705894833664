"""Anthropic Messages through the official `anthropic` SDK against real servers: tiny
models (tests/tinymodel.py) whose greedy answers are known, so every answer, stream and
resumed stream is compared with what it must be.

- a thinking model (`<think> Let me see</think> Paris indeed`): thinking blocks whole and
  streamed, thinking off, `count_tokens` equal to the engine's own count, `x-api-key`;
- a scripted tool model (a call to `get_weather` in LFM2's format): `tool_use` blocks,
  a `tool_use` -> `tool_result` round trip, forced calls and JSON answers under a grammar;
- worker crashes mid-stream (`decode:crash:nth=1@K`, at the K-th token): the events equal
  the unfaulted run's, the same content block going on; a poison stream ends in its `error`
  event;
- a 503 while the worker is replaced, retried by the SDK on its own.
And the SDK's own `messages.create` signature against docs/dialects/anthropic.md.
"""

from __future__ import annotations

import inspect
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest

from steward.front.dialects.anthropic_answer import signature
from steward.front.dialects.anthropic_schema import CountTokensRequest, MessagesRequest
from tests.conftest import ROOT, Server
from tests.tinymodel import ANSWER, THINKING, build_scripted_model, build_thinking_model

ASK = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"name": "get_weather", "description": "The weather in a city.", "input_schema": CITY}]
GREEDY = {"extra_body": {"temperature": 0}}  # the current SDK has no `temperature`
SDK_ONLY = {"self", "extra_headers", "extra_query", "extra_body", "timeout"}
NOT_IN_BODY = {"output_format", "betas"}  # the SDK's: a type as `output_config.format`; a header


def sdk(server: Server, **options: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="none", **options)


def raw(client: anthropic.Anthropic, **params: Any) -> list[dict[str, Any]]:
    """A stream's events as the SDK parsed them, less what differs between two equal
    answers: the message id, and how the prompt's count splits between cache and not."""
    seen = []
    for event in client.messages.create(stream=True, **params):
        body = event.model_dump()
        if body["type"] == "message_start":
            body["message"]["id"] = "msg"
        if body["type"] == "message_delta":
            usage = body["usage"]
            usage["input_tokens"] += usage.pop("cache_read_input_tokens")
        seen.append(body)
    return seen


def total_input(usage: Any) -> int:
    return usage.input_tokens + usage.cache_read_input_tokens


# -- the contract ------------------------------------------------------------------------


def documented() -> dict[str, str]:
    """docs/dialects/anthropic.md's parameter table: name -> what steward does."""
    text = (ROOT / "docs" / "dialects" / "anthropic.md").read_text()
    rows = re.findall(r"^\| `([a-z_]+)` \|[^|]*\| (.+?) \|$", text, re.MULTILINE)
    return dict(rows)


@pytest.mark.parametrize(
    ("method", "body"),
    [
        (anthropic.resources.Messages.create, MessagesRequest),
        (anthropic.resources.Messages.stream, MessagesRequest),
        (anthropic.resources.Messages.count_tokens, CountTokensRequest),
        (anthropic.resources.beta.Messages.create, MessagesRequest),
    ],
)
def test_every_sdk_parameter_is_in_the_table(method: Any, body: type) -> None:
    """A new SDK release with a new parameter fails here, not as a silently ignored field:
    each is documented, and read on purpose (honoured, a no-op, or a 400 naming it)."""
    table = documented()
    params = set(inspect.signature(method).parameters) - SDK_ONLY
    assert not params - set(table), f"docs/dialects/anthropic.md lacks {params - set(table)}"
    unread = params - NOT_IN_BODY - set(body.model_fields)
    assert not unread, f"{body.__name__} does not read {unread}"


# -- a thinking model --------------------------------------------------------------------


@pytest.fixture(scope="module")
def thinking_model(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> Path:
    return build_thinking_model(tmp_path_factory.mktemp("thinking") / "think", default_model_dir)


@pytest.fixture(scope="module")
def thinker(thinking_model: Path) -> Iterator[Server]:
    server = Server(["--model", str(thinking_model), "--served-model-name", "claude-*"])
    server.wait()
    yield server
    server.stop()


def test_thinking_comes_back_as_a_thinking_block(thinker: Server) -> None:
    client = sdk(thinker)
    thinking = {"type": "enabled", "budget_tokens": 1024}
    message = client.messages.create(
        model="claude-sonnet-5", max_tokens=32, messages=ASK, thinking=thinking
    )
    block, text = message.content
    assert block.type == "thinking" and block.thinking == THINKING
    assert block.signature == signature(THINKING)
    assert text.type == "text" and text.text == ANSWER
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    assert message.model == "think"  # the model served, whatever name was asked
    usage = message.usage
    assert usage.output_tokens == 7 and usage.output_tokens_details.thinking_tokens == 5
    counted = client.messages.count_tokens(model="claude-x", messages=ASK, thinking=thinking)
    assert counted.input_tokens == total_input(usage)

    with client.messages.stream(
        model="claude-sonnet-5", max_tokens=32, messages=ASK, thinking=thinking
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert [b.model_dump(exclude={"parsed_output"}) for b in final.content] == [
        b.model_dump() for b in message.content
    ]
    assert {"thinking", "signature", "text"} <= set(kinds)
    assert kinds.index("signature") < kinds.index("text")
    assert total_input(final.usage) == counted.input_tokens
    assert final.usage.output_tokens == 7


def test_thinking_off_is_the_answer_alone_and_counted_so(thinker: Server) -> None:
    client = sdk(thinker)
    off = {"type": "disabled"}
    message = client.messages.create(model="default", max_tokens=32, messages=ASK, thinking=off)
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].text.strip() == ANSWER.strip()
    counted = client.messages.count_tokens(model="default", messages=ASK, thinking=off)
    assert counted.input_tokens == total_input(message.usage)
    thinks = client.messages.count_tokens(model="default", messages=ASK)
    assert counted.input_tokens > thinks.input_tokens  # the template closed a block itself


def test_an_agents_max_tokens_is_a_bound_not_a_demand(thinker: Server) -> None:
    """Claude Code asks for 32000 tokens of a model whose context is 2048."""
    with sdk(thinker).messages.stream(
        model="claude-opus-5", max_tokens=32000, messages=ASK
    ) as stream:
        message = stream.get_final_message()
    assert message.stop_reason == "end_turn" and message.content[-1].text == ANSWER


def test_the_api_key_in_x_api_key(thinking_model: Path, serve) -> None:
    server = serve("--model", str(thinking_model), "--api-key", "sesame", "--standby", "none")
    server.wait()
    client = anthropic.Anthropic(base_url=server.url, api_key="sesame")
    assert client.messages.create(model="default", max_tokens=8, messages=ASK).content
    with pytest.raises(anthropic.AuthenticationError) as refused:
        sdk(server).messages.create(model="default", max_tokens=8, messages=ASK)
    assert refused.value.body["error"]["type"] == "authentication_error"


# -- a tool model ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def caller(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> Iterator[Server]:
    model = build_scripted_model(tmp_path_factory.mktemp("tools") / "tools", default_model_dir)
    server = Server(["--model", str(model)])
    server.wait()
    yield server
    server.stop()


def test_a_tool_use_and_its_result_round_trip(caller: Server) -> None:
    client = sdk(caller)
    asked = client.messages.create(model="default", max_tokens=32, messages=WEATHER, tools=TOOLS)
    (call,) = asked.content
    assert call.type == "tool_use" and call.id.startswith("toolu_")
    assert (call.name, call.input) == ("get_weather", {"city": "Paris"})
    assert asked.stop_reason == "tool_use"

    with client.messages.stream(
        model="default", max_tokens=32, messages=WEATHER, tools=TOOLS
    ) as stream:
        kinds = [event.type for event in stream]
        streamed = stream.get_final_message()
    assert "input_json" in kinds and streamed.stop_reason == "tool_use"
    (call,) = streamed.content
    assert (call.name, call.input) == ("get_weather", {"city": "Paris"})

    result = {"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 21 C"}
    history = [*WEATHER, streamed.to_param(), {"role": "user", "content": [result]}]
    answered = client.messages.create(model="default", max_tokens=32, messages=history, tools=TOOLS)
    assert answered.stop_reason == "tool_use"  # the script calls again, whatever it is told
    counted = client.messages.count_tokens(model="default", messages=history, tools=TOOLS)
    assert counted.input_tokens == total_input(answered.usage) > total_input(asked.usage)
    failed = [
        *WEATHER,
        streamed.to_param(),
        {"role": "user", "content": [result | {"is_error": True}]},
    ]
    errored = client.messages.count_tokens(model="default", messages=failed, tools=TOOLS)
    assert errored.input_tokens > counted.input_tokens  # "Error: " reached the template


def test_forced_calls_and_json_answers_follow_their_schema(caller: Server) -> None:
    client = sdk(caller)
    short = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 8}},
        "required": ["city"],
        "additionalProperties": False,
    }
    tools = [{"name": "get_weather", "input_schema": short}]
    for choice in (
        {"type": "tool", "name": "get_weather"},
        {"type": "any", "disable_parallel_tool_use": True},
    ):
        message = client.messages.create(
            model="default",
            max_tokens=40,
            messages=WEATHER,
            tools=tools,
            tool_choice=choice,
            **GREEDY,
        )
        (call,) = message.content
        assert call.type == "tool_use" and call.name == "get_weather", choice
        assert set(call.input) == {"city"} and len(call.input["city"]) <= 8
        assert message.stop_reason == "tool_use"
    number = {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
        "additionalProperties": False,
    }
    message = client.messages.create(
        model="default",
        max_tokens=20,
        messages=WEATHER,
        output_config={"format": {"type": "json_schema", "schema": number}},
        **GREEDY,
    )
    assert isinstance(json.loads(message.content[0].text)["n"], int)


# -- faults ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("strike", "where"),
    [(3, "inside the thinking block"), (6, "at the first token of the text block")],
)
def test_a_thinking_stream_resumes_in_the_same_block(
    thinking_model: Path, serve, strike: int, where: str
) -> None:
    """The worker crashes at the answer's `strike`-th token (`<think>`, ` Let`, ` me`,
    ` see`, `</think>`, ` Paris`, ` indeed`), with the tokens before it sent: the resumed
    stream's events are the unfaulted run's, its block going on where it was."""
    server = serve("--model", str(thinking_model), "--inject-fault", f"decode:crash:nth=1@{strike}")
    server.wait()
    client = sdk(server)
    params = {"model": "default", "max_tokens": 32, "messages": ASK}
    faulted = raw(client, **params)
    assert server.health().json()["faults"]["total"] == 1, where
    assert faulted == raw(client, **params), where
    starts = [e["content_block"]["type"] for e in faulted if e["type"] == "content_block_start"]
    assert starts == ["thinking", "text"]
    deltas = [e["delta"] for e in faulted if e["type"] == "content_block_delta"]
    assert "".join(d.get("thinking", "") for d in deltas) == THINKING
    assert "".join(d.get("text", "") for d in deltas) == ANSWER
    assert deltas[3] == {"type": "signature_delta", "signature": signature(THINKING)}
    assert faulted[-2]["usage"]["output_tokens"] == 7


def test_a_text_stream_resumes_and_a_poison_one_ends_in_its_error_event(tiny_model, serve) -> None:
    server = serve(
        "--model",
        str(tiny_model),
        "--stall-timeout",
        "2",
        "--inject-fault",
        "decode:crash:nth=1@6;decode:crash:marker=POISON",
    )
    server.wait()
    client = sdk(server)
    params = {"model": "default", "max_tokens": 12, "messages": ASK, **GREEDY}
    faulted = raw(client, **params)
    assert server.health().json()["faults"]["total"] == 1
    assert faulted == raw(client, **params)
    kinds = [e["type"] for e in faulted]
    assert kinds.count("content_block_start") == 1 and kinds.count("content_block_delta") >= 2
    assert faulted[-2]["delta"]["stop_reason"] == "max_tokens"
    assert faulted[-2]["usage"]["output_tokens"] == 12

    poison = {**params, "messages": [{"role": "user", "content": "POISON, please."}]}
    with pytest.raises(anthropic.APIStatusError) as ended:
        raw(client, **poison)
    error = ended.value.body["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "request_quarantined"
    assert error["retryable"] is False and error["fault"]["class"] == "worker_crash"
    with pytest.raises(anthropic.UnprocessableEntityError) as again:  # before any stream
        sdk(server, max_retries=0).messages.create(**poison)
    assert again.value.response.headers["x-should-retry"] == "false"


def test_a_503_while_the_model_comes_up_is_retried_by_the_sdk(tiny_model, serve) -> None:
    """The first worker crashes while it loads, and its replacement loads slowly: a first
    start, whose end nothing measured says. A request sent meanwhile waits out the queue
    timeout and gets a retryable 503 naming the fault: the SDK retries one on its own,
    after `Retry-After`, until the worker answers it. (A request that meets a recovery of a
    model that has served waits for it instead: tests/supervisor/test_decisions.py.)"""
    server = serve(
        "--model",
        str(tiny_model),
        "--standby",
        "none",
        "--queue-timeout",
        "1",
        "--inject-fault",
        "load:crash:nth=1;load:slow=3:nth=2",
    )
    server.wait("starting")
    server.until(lambda health: health["faults"]["total"] == 1)  # the first worker is gone
    outcome: dict[str, Any] = {}

    def ask(name: str, messages: list[dict[str, Any]]) -> None:
        try:
            outcome[name] = sdk(server, max_retries=0).messages.create(
                model="default", max_tokens=8, messages=messages, **GREEDY
            )
        except anthropic.APIStatusError as error:
            outcome[name] = error

    impatient = threading.Thread(target=ask, args=("refused", WEATHER))
    impatient.start()
    patient = sdk(server, max_retries=10)
    reply = patient.messages.with_raw_response.create(
        model="default", max_tokens=8, messages=WEATHER, **GREEDY
    )
    assert reply.retries_taken >= 1
    assert reply.parse().usage.output_tokens == 8
    impatient.join()
    refused = outcome["refused"]
    assert refused.status_code == 503
    assert refused.response.headers["x-should-retry"] == "true"
    assert int(refused.response.headers["retry-after"]) >= 1
    error = refused.body["error"]
    assert error["type"] == "overloaded_error" and error["code"] == "backend_unavailable"
    assert error["retryable"] is True and error["fault"]["class"] == "worker_crash"

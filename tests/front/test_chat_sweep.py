"""What a sweep of popular clients found on chat completions (issue 21 item 8): fields
accepted on purpose, legacy `functions`, and a forced tool call cut before its name that
must not leak the grammar's text. Scripted (tests/front/scripted.py), then on the real
default model."""

from __future__ import annotations

import json

import pytest

from steward.wire.protocol import CallDelta, Token
from tests.conftest import function_tool
from tests.front.scripted import client, done, forced, says

CHAT = {"messages": [{"role": "user", "content": "Weather in Paris?"}]}
WEATHER = function_tool("get_weather", "The weather in a city.", {"city": {"type": "string"}})


def hello(job):
    return says("Hel", "lo")


def frames(answer) -> list[dict]:
    lines = [line.removeprefix("data: ") for line in answer.text.splitlines() if line]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


@pytest.mark.parametrize(
    "extra",
    [
        {"prompt_cache_key": "session-1"},
        {"safety_identifier": "user-hash"},
        {"verbosity": "low"},
        {"modalities": ["text"]},
        {"reasoning_effort": "high"},
    ],
)
def test_documented_fields_are_accepted(extra: dict) -> None:
    http, _ = client(hello)
    answer = http.post("/v1/chat/completions", json=CHAT | extra)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == "Hello"


def test_modalities_other_than_text_are_refused_by_name() -> None:
    http, _ = client(hello)
    answer = http.post("/v1/chat/completions", json=CHAT | {"modalities": ["text", "audio"]})
    assert answer.status_code == 400
    assert answer.json()["error"]["message"].startswith("modalities:")


@pytest.mark.parametrize(
    ("effort", "thinking"),
    [("none", False), ("minimal", False), ("low", True), ("high", True), (None, None)],
)
def test_reasoning_effort_turns_thinking_on_or_off(effort: str | None, thinking) -> None:
    http, supervisor = client(hello)
    body = CHAT if effort is None else CHAT | {"reasoning_effort": effort}
    assert http.post("/v1/chat/completions", json=body).status_code == 200
    assert supervisor.jobs[0].request.thinking is thinking


def calling(job):
    return [
        Token(0, 1, "", calls=[CallDelta(0, "get_weather", '{"city": ')]),
        Token(0, 2, "", calls=[CallDelta(0, None, '"Paris"}')]),
        done(2, "tool_calls"),
    ]


def test_legacy_functions_are_tools_and_answered_as_function_call() -> None:
    http, supervisor = client(calling)
    body = CHAT | {"functions": [WEATHER["function"]], "function_call": {"name": "get_weather"}}
    answer = http.post("/v1/chat/completions", json=body).json()
    request = supervisor.jobs[0].request
    assert request.calls == "named" and request.call_name == "get_weather"
    assert request.tools == [WEATHER]
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "function_call"
    assert choice["message"]["function_call"] == {
        "name": "get_weather",
        "arguments": '{"city": "Paris"}',
    }
    assert "tool_calls" not in choice["message"]
    streamed = frames(http.post("/v1/chat/completions", json=body | {"stream": True}))
    deltas = [f["choices"][0]["delta"] for f in streamed]
    assert deltas[0]["function_call"] == {"name": "get_weather", "arguments": '{"city": '}
    assert deltas[1]["function_call"] == {"arguments": '"Paris"}'}
    assert streamed[-1]["choices"][0]["finish_reason"] == "function_call"


def test_legacy_history_is_templated_as_a_tool_call_and_its_answer() -> None:
    http, supervisor = client(hello)
    history = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "function_call": {"name": "get_weather", "arguments": "{}"}},
        {"role": "function", "name": "get_weather", "content": "sunny"},
    ]
    body = {"messages": history, "functions": [WEATHER["function"]]}
    assert http.post("/v1/chat/completions", json=body).status_code == 200
    messages = supervisor.jobs[0].request.messages
    assert messages[1]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": {}}
    assert messages[2]["role"] == "tool" and messages[2]["tool_call_id"] == "get_weather"


def test_functions_and_tools_together_are_refused() -> None:
    http, _ = client(hello)
    body = CHAT | {"functions": [WEATHER["function"]], "tools": [WEATHER]}
    answer = http.post("/v1/chat/completions", json=body)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "functions"


def cut_before_the_name(job):
    """A forced answer cut by max_tokens before a call's name is whole (a named call's:
    before any of its text is, the detokenizer holding it still), as the worker sends it."""
    text = '[{"name":"get' if job.request.calls == "list" else ""
    return forced(job, text, finish="length", completion=3)


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_weather"}}]
)
def test_a_forced_call_cut_short_leaks_no_grammar_text(choice) -> None:
    http, _ = client(cut_before_the_name)
    body = CHAT | {"tools": [WEATHER], "tool_choice": choice, "max_tokens": 3}
    answer = http.post("/v1/chat/completions", json=body).json()["choices"][0]
    assert answer["message"]["content"] == "" and "tool_calls" not in answer["message"]
    assert answer["finish_reason"] == "length"
    streamed = frames(http.post("/v1/chat/completions", json=body | {"stream": True}))
    assert "".join(f["choices"][0]["delta"].get("content", "") for f in streamed) == ""
    assert streamed[-1]["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("stream", [False, True])
def test_a_real_forced_call_cut_by_max_tokens_is_empty_content(default_server, stream) -> None:
    client = default_server.client()
    reply = client.chat.completions.create(
        model="default",
        messages=CHAT["messages"],
        tools=[WEATHER],
        tool_choice="required",
        max_tokens=3,
        stream=stream,
    )
    if stream:
        chunks = list(reply)
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        calls = [c for c in chunks if c.choices and c.choices[0].delta.tool_calls]
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
    else:
        content = reply.choices[0].message.content or ""
        calls = reply.choices[0].message.tool_calls or []
        finish = reply.choices[0].finish_reason
    assert content == "" and not calls
    assert finish == "length"


def test_the_real_server_reports_its_default_cap(default_server) -> None:
    listed = default_server.client().models.list().data
    assert [m.id for m in listed] == ["SmolLM2-135M-Instruct", "smol"]
    assert all(m.model_extra["max_tokens_default"] == 4096 for m in listed)

"""Fields and tools steward does not know (issue 28, SPEC §8): ignored, never refused.

Over the scripted front (tests/front/scripted.py), in every generation dialect: an unknown
field at the top and nested, and a tool of a type no API has yet, are answered 200 with the
`steward-ignored` header naming them, and the worker gets what it gets without them;
`--strict-requests` refuses them, a 400 naming the path in the dialect's envelope; a 400
for another reason still names them; a stream carries the header. A tool with a name and a
schema is served whatever else it carries; Codex's namespace tools are flattened and a call
to one comes back with its namespace apart. Then on real servers, embeddings included: the
done-when of issue 28.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from steward.front import ignored
from steward.wire.protocol import CallDelta, Token
from tests.conftest import Server
from tests.front.scripted import client, done, says

PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}}}
HOLOGRAM = {"type": "hologram_2031", "projector": {"lumens": 9000}}  # no API has it yet
HI = "Hi"


def hello(job: Any) -> list:
    return says("Hel", "lo")


# Each dialect: its route, a plain body, the same body with unknown things, and the paths
# the header names (the top's own first, then in the body's order).
DIALECTS: dict[str, tuple[str, dict[str, Any], dict[str, Any], str]] = {
    "chat": (
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": HI}],
            "max_tokens": 4,
            "tools": [{"type": "function", "function": {"name": "w", "parameters": PARAMETERS}}],
        },
        {
            "max_tokens": 4,
            "future_knob": {"a": 1},
            "messages": [{"role": "user", "content": HI, "mood": "calm"}],
            "tools": [
                {"type": "function", "function": {"name": "w", "parameters": PARAMETERS}},
                HOLOGRAM,
            ],
        },
        "future_knob, messages.0.mood, tools.1",
    ),
    "completions": (
        "/v1/completions",
        {"prompt": HI, "max_tokens": 4},
        {"prompt": HI, "max_tokens": 4, "future_knob": 1},
        "future_knob",
    ),
    "messages": (
        "/v1/messages",
        {
            "max_tokens": 4,
            "messages": [{"role": "user", "content": [{"type": "text", "text": HI}]}],
            "tools": [{"name": "w", "input_schema": PARAMETERS}],
        },
        {
            "max_tokens": 4,
            "future_knob": [1, 2],
            "messages": [{"role": "user", "content": [{"type": "text", "text": HI, "mood": 1}]}],
            "tools": [{"name": "w", "input_schema": PARAMETERS}, HOLOGRAM | {"name": "holo"}],
        },
        "future_knob, messages.0.content.0.mood, tools.1",
    ),
    "count_tokens": (
        "/v1/messages/count_tokens",
        {
            "messages": [{"role": "user", "content": HI}],
            "tools": [{"name": "w", "input_schema": {}}],
        },
        {
            "messages": [{"role": "user", "content": HI}],
            "tools": [{"name": "w", "input_schema": {}}, HOLOGRAM],
            "future_knob": True,
        },
        "future_knob, tools.1",
    ),
    "responses": (
        "/v1/responses",
        {
            "input": [{"role": "user", "content": HI}],
            "max_output_tokens": 4,
            "tools": [{"type": "function", "name": "w", "parameters": PARAMETERS}],
        },
        {
            "max_output_tokens": 4,
            "input": [{"role": "user", "content": HI, "mood": "calm"}],
            "tools": [{"type": "function", "name": "w", "parameters": PARAMETERS}, HOLOGRAM],
            "client_metadata": {"turn": "1"},
        },
        "client_metadata, input.0.mood, tools.1",
    ),
}


@pytest.mark.parametrize("dialect", DIALECTS)
def test_unknown_fields_and_tools_are_ignored_and_named(dialect: str) -> None:
    route, plain, unknown, named = DIALECTS[dialect]
    http, supervisor = client(hello)
    answer = http.post(route, json=plain)
    assert answer.status_code == 200, answer.text
    assert "steward-ignored" not in answer.headers
    clean = supervisor.jobs[-1].request
    answer = http.post(route, json=unknown)
    assert answer.status_code == 200, answer.text
    assert answer.headers["steward-ignored"] == named
    assert supervisor.jobs[-1].request == clean  # the worker never sees them


@pytest.mark.parametrize("dialect", DIALECTS)
def test_strict_requests_refuse_them_naming_the_path(dialect: str) -> None:
    route, _, unknown, named = DIALECTS[dialect]
    http, supervisor = client(hello, strict_requests=True)
    answer = http.post(route, json=unknown)
    assert answer.status_code == 400, answer.text
    body = answer.json()
    error = body["error"]
    if route.startswith("/v1/messages"):
        assert body["type"] == "error" and error["type"] == "invalid_request_error"
    else:
        assert body["status"] == "error" and error["type"] == "validation_error"
    refused = named.split(", ")
    assert any(path in error["message"] for path in refused), error["message"]
    assert answer.headers["steward-ignored"]  # what it found before refusing
    assert not supervisor.jobs


def test_a_400_for_another_reason_still_names_them() -> None:
    http, _ = client(hello)
    answer = http.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": HI}], "max_token": 5, "temperature": 9},
    )
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "temperature"
    assert answer.headers["steward-ignored"] == "max_token"
    gone = http.post("/v1/responses", json={"input": HI, "x_trace": 1, "previous_response_id": "r"})
    assert gone.status_code == 400 and gone.headers["steward-ignored"] == "x_trace"
    # refused by a validator that runs before any other (the fuzzer found it)
    boxed = {"max_tokens": 2, "messages": [{"role": "user", "content": HI}], "container": "c"}
    refused = http.post("/v1/messages", json=boxed | {"x_trace": 1})
    assert refused.status_code == 400 and refused.headers["steward-ignored"] == "x_trace"


def test_a_stream_carries_the_header() -> None:
    http, _ = client(hello)
    body = {"stream": True, "max_tokens": 4, "messages": [{"role": "user", "content": HI}]}
    with http.stream("POST", "/v1/messages", json=body | {"future_knob": 1}) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        assert answer.headers["steward-ignored"] == "future_knob"
        assert "message_stop" in answer.read().decode()


def test_each_field_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    http, _ = client(hello)
    body = {"messages": [{"role": "user", "content": HI}], "max_tokens": 2}
    with caplog.at_level("WARNING", logger="steward.front"):
        for turn in range(3):
            call = {"messages": [{"role": "user", "content": HI, "logged_once": turn}] * 2}
            http.post("/v1/chat/completions", json=body | call, headers={"user-agent": "cli/9"})
    lines = [r.getMessage() for r in caplog.records if "logged_once" in r.getMessage()]
    assert len(lines) == 1 and "messages.*.logged_once" in lines[0] and "cli/9" in lines[0]


def test_the_header_is_bounded_and_plain_ascii() -> None:
    http, _ = client(hello)
    odd = {"a,b": 1, "new\nline": 2, "naïve": 3, ", ": 4}
    many = {f"knob_{i:04d}": i for i in range(600)}
    body = {"messages": [{"role": "user", "content": HI}], "max_tokens": 2} | odd | many
    answer = http.post("/v1/chat/completions", json=body)
    assert answer.status_code == 200
    header = answer.headers["steward-ignored"]
    assert header.isascii() and len(header) <= ignored.MAX_HEADER + 16
    assert header.startswith('"a\\u002cb", "new\\nline", "na\\u00efve", "\\u002c ", knob_0000, ')
    assert header.endswith(" more")
    # a name's comma is escaped: the header splits on ", " into the names, each JSON or plain
    names = header.split(", ")[:4]
    assert [json.loads(name) for name in names] == list(odd)


# -- tools -------------------------------------------------------------------------------


def test_anthropic_tools_with_a_schema_are_served_whatever_else_they_carry() -> None:
    """Claude Code's deferred tool, a type no API has, and every optional field are served;
    the tool search tool and other server tools (no schema) are left out and named."""
    http, supervisor = client(hello)
    tools = [
        {"name": "deferred", "input_schema": PARAMETERS, "defer_loading": True},
        {
            "name": "rich",
            "input_schema": PARAMETERS,
            "type": "custom_2031",
            "cache_control": {"type": "ephemeral"},
            "eager_input_streaming": True,
            "input_examples": [{"city": "Paris"}],
        },
        {"type": "tool_search_tool_regex_20251119", "name": "tool_search_tool_regex"},
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
        {"type": "bash_20250124", "name": "bash"},
    ]
    body = {"max_tokens": 4, "messages": [{"role": "user", "content": HI}], "tools": tools}
    answer = http.post("/v1/messages", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.headers["steward-ignored"] == "tools.2, tools.3, tools.4"
    served = supervisor.jobs[-1].request.tools or []
    assert [tool["function"]["name"] for tool in served] == ["deferred", "rich"]
    assert all(tool == {"type": "function", "function": tool["function"]} for tool in served)


def test_a_tool_search_result_reads_as_the_tools_definitions() -> None:
    """Claude Code 2.1.332 answers its `ToolSearch` with `tool_reference` blocks (and adds
    the tool to `tools`): the tool turn shows each as ToolSearch promises, a `<function>`
    line of its definition."""
    http, supervisor = client(hello)
    cron = {"name": "CronList", "description": "List cron jobs.", "input_schema": PARAMETERS}
    search = {"name": "ToolSearch", "input_schema": PARAMETERS}
    call = {"type": "tool_use", "id": "toolu_1", "name": "ToolSearch", "input": {"query": "cron"}}
    found = [{"type": "tool_reference", "tool_name": "CronList"}]
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": found}
    body = {
        "max_tokens": 4,
        "tools": [search, cron | {"defer_loading": True}],
        "messages": [
            {"role": "user", "content": "find cron tools"},
            {"role": "assistant", "content": [call]},
            {"role": "user", "content": [result | {"cache_control": {"type": "ephemeral"}}]},
        ],
    }
    answer = http.post("/v1/messages", json=body)
    assert answer.status_code == 200, answer.text
    definition = {"name": "CronList", "description": "List cron jobs.", "parameters": PARAMETERS}
    tool_turn = supervisor.jobs[-1].request.messages[-1]
    assert tool_turn["role"] == "tool" and tool_turn["name"] == "ToolSearch"
    assert tool_turn["content"] == f"<function>{json.dumps(definition)}</function>"


def test_chat_tools_of_any_type_with_a_function_are_served() -> None:
    http, supervisor = client(hello)
    function = {"name": "w", "parameters": PARAMETERS}
    tools = [
        {"type": "function_2031", "function": function},
        {"type": "custom", "custom": {"name": "patch", "format": {"type": "text"}}},
    ]
    body = {"messages": [{"role": "user", "content": HI}], "tools": tools}
    answer = http.post("/v1/chat/completions", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.headers["steward-ignored"] == "tools.1"
    assert supervisor.jobs[-1].request.tools == [{"type": "function", "function": function}]


NAMESPACE = {
    "type": "namespace",
    "name": "multi_agent_v1",
    "description": "Tools for spawning and managing sub-agents.",
    "tools": [
        {"type": "function", "name": "close_agent", "strict": False, "parameters": PARAMETERS},
        {"type": "custom", "name": "freeform", "format": {"type": "text"}},
    ],
}


def calls_close_agent(job: Any) -> list:
    call = CallDelta(0, "multi_agent_v1__close_agent", '{"city": "x"}')
    return [Token(0, 0, "", calls=[call]), done(1, "tool_calls")]


def test_a_namespace_is_flattened_and_its_call_comes_back_apart() -> None:
    """Codex's round trip (codex-rs: a `function_call` item's `namespace` and `name` make
    its `ToolName`; the history it sends back carries them apart again)."""
    http, supervisor = client(calls_close_agent)
    exec_command = {"type": "function", "name": "exec_command", "parameters": PARAMETERS}
    body = {"input": HI, "tools": [exec_command, NAMESPACE], "store": False, "stream": True}
    with http.stream("POST", "/v1/responses", json=body) as answer:
        assert answer.headers["steward-ignored"] == "tools.1.tools.1"
        frames = [json.loads(line[6:]) for line in answer.iter_lines() if line.startswith("data:")]
    served = [tool["function"]["name"] for tool in supervisor.jobs[-1].request.tools or []]
    assert served == ["exec_command", "multi_agent_v1__close_agent"]
    (item,) = [f["item"] for f in frames if f["type"] == "response.output_item.done"]
    assert item["type"] == "function_call" and item["arguments"] == '{"city": "x"}'
    assert (item["namespace"], item["name"]) == ("multi_agent_v1", "close_agent")

    output = {"type": "function_call_output", "call_id": item["call_id"], "output": "closed"}
    history = {"input": [{"role": "user", "content": HI}, item, output], "tools": [NAMESPACE]}
    answer = http.post("/v1/responses", json=history | {"store": False})
    assert answer.status_code == 200, answer.text
    messages = supervisor.jobs[-1].request.messages
    assert messages[1]["tool_calls"][0]["function"]["name"] == "multi_agent_v1__close_agent"
    assert messages[2] == {
        "role": "tool",
        "tool_call_id": item["call_id"],
        "content": "closed",
        "name": "multi_agent_v1__close_agent",
    }


# -- real servers: the done-when ---------------------------------------------------------


@pytest.fixture(scope="module")
def models(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: Path, default_model_dir: Path
) -> list[str]:
    from tests.tinyembed import build_tiny_embedder

    embedder = build_tiny_embedder(tmp_path_factory.mktemp("embed") / "embed", default_model_dir)
    return ["--model", f"chat={tiny_model}", "--model", f"embed={embedder}", "--standby", "none"]


@pytest.fixture(scope="module")
def lenient(models: list[str]) -> Iterator[Server]:
    server = Server(models)
    server.wait()
    yield server
    server.stop()


EMBEDDINGS = ("/v1/embeddings", {"model": "embed", "input": HI, "future_knob": 1}, "future_knob")
REAL = {d: (route, unknown, named) for d, (route, _, unknown, named) in DIALECTS.items()}
REAL["embeddings"] = EMBEDDINGS


def test_every_dialect_answers_what_no_api_has_yet_and_strict_refuses_it(
    lenient: Server, models: list[str]
) -> None:
    for dialect, (route, body, named) in REAL.items():
        answer = lenient.http.post(route, json=body)
        assert answer.status_code == 200, f"{dialect}: {answer.text}"
        assert answer.headers["steward-ignored"] == named, dialect
        first = named.split(", ")[0]
        assert lenient.output().count(f"ignored {first} on {route} ") == 1, dialect
    strict = Server([*models, "--strict-requests"])
    try:
        strict.wait()
        for dialect, (route, body, _) in REAL.items():
            answer = strict.http.post(route, json=body)
            assert answer.status_code == 400, f"{dialect}: {answer.text}"
    finally:
        strict.stop()

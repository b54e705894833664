"""The Responses dialect over a scripted supervisor (tests/front/scripted.py), in
milliseconds: the request read into the one `Generate`, the answer into output items and
events with continuous sequence numbers, the store, and every refusal named."""

from __future__ import annotations

import json

import pytest

from steward.errors import ApiError
from steward.front.dialects.responses_input import ENCRYPTED
from steward.front.dialects.responses_store import ResponseStore, Stored
from steward.wire.protocol import CallDelta, Token
from tests.front.scripted import MODEL, client, done, forced, says

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def thinks_then_says(job):
    return [
        Token(0, 0, "", reasoning="Hm"),
        Token(0, 1, "", reasoning=", Paris."),
        Token(0, 2, "Par"),
        Token(0, 3, "is"),
        done(4),
    ]


def calls(job):
    """An answer that says a word, then calls a function (the worker's `auto` parts)."""
    return [
        Token(0, 0, "Sure."),
        Token(0, 1, "", calls=[CallDelta(0, "get_weather", "")]),
        Token(0, 2, "", calls=[CallDelta(0, None, '{"city": ')]),
        Token(0, 3, "", calls=[CallDelta(0, None, '"Paris"}')]),
        done(4, "tool_calls"),
    ]


def events(answer) -> list[dict]:
    """The SSE stream's events, each checked to name its type in `event:` too."""
    seen = []
    for block in answer.text.strip().split("\n\n"):
        named, data = block.split("\n")
        body = json.loads(data.removeprefix("data: "))
        assert named == f"event: {body['type']}"
        seen.append(body)
    return seen


def test_a_text_answer_is_a_completed_response() -> None:
    http, supervisor = client(thinks_then_says)
    body = http.post("/v1/responses", json={"input": "hi", "instructions": "Be brief."}).json()
    assert body["object"] == "response" and body["id"].startswith("resp_")
    assert body["status"] == "completed" and body["model"] == MODEL
    reasoning, message = body["output"]
    assert reasoning["type"] == "reasoning" and reasoning["summary"] == []
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "Hm, Paris."}]
    assert "encrypted_content" not in reasoning
    assert message["type"] == "message" and message["role"] == "assistant"
    assert message["status"] == "completed"
    assert message["content"] == [
        {"type": "output_text", "text": "Paris", "annotations": [], "logprobs": []}
    ]
    assert body["usage"]["input_tokens"] == 5 and body["usage"]["output_tokens"] == 4
    (job,) = supervisor.jobs
    assert job.request.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]
    assert job.request.temperature == 1.0  # OpenAI's default, not greedy


def test_the_stream_is_every_event_in_order_numbered_without_a_gap() -> None:
    http, _ = client(thinks_then_says)
    seen = events(http.post("/v1/responses", json={"input": "hi", "stream": True}))
    assert [e["sequence_number"] for e in seen] == list(range(len(seen)))
    assert [e["type"].removeprefix("response.") for e in seen] == [
        "created",
        "in_progress",
        "output_item.added",
        "content_part.added",
        "reasoning_text.delta",
        "reasoning_text.delta",
        "reasoning_text.done",
        "content_part.done",
        "output_item.done",
        "output_item.added",
        "content_part.added",
        "output_text.delta",
        "output_text.delta",
        "output_text.done",
        "content_part.done",
        "output_item.done",
        "completed",
    ]
    assert seen[0]["response"]["status"] == "in_progress" and seen[0]["response"]["output"] == []
    assert [e["delta"] for e in seen if e["type"] == "response.output_text.delta"] == ["Par", "is"]
    final = seen[-1]["response"]
    assert final["output"][1]["content"][0]["text"] == "Paris"
    assert final["output"][0]["id"] == seen[2]["item"]["id"]
    assert final["usage"]["output_tokens"] == 4


def test_a_function_call_is_an_item_whose_arguments_stream() -> None:
    http, supervisor = client(calls)
    ask = {"input": "Weather in Paris?", "tools": [WEATHER]}
    whole = http.post("/v1/responses", json=ask).json()
    message, call = whole["output"]
    assert message["content"][0]["text"] == "Sure."
    assert call["type"] == "function_call" and call["name"] == "get_weather"
    assert call["call_id"].startswith("call_") and call["id"].startswith("fc_")
    assert json.loads(call["arguments"]) == {"city": "Paris"}
    assert whole["status"] == "completed" and whole["tool_choice"] == "auto"
    assert supervisor.jobs[0].request.calls == "auto"
    assert supervisor.jobs[0].request.tools == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city.",
                "parameters": WEATHER["parameters"],
            },
        }
    ]
    seen = events(http.post("/v1/responses", json=ask | {"stream": True}))
    deltas = [e["delta"] for e in seen if e["type"] == "response.function_call_arguments.delta"]
    assert deltas == ['{"city": ', '"Paris"}']
    (finished,) = [e for e in seen if e["type"] == "response.function_call_arguments.done"]
    assert finished["arguments"] == '{"city": "Paris"}' and finished["name"] == "get_weather"
    assert seen[-1]["response"]["output"][1]["arguments"] == '{"city": "Paris"}'


def test_a_forced_call_never_shows_its_grammar_text() -> None:
    def call(job):
        text = '[{"name": "get_weather", "arguments": {"city": "Paris"}}]'
        if job.request.calls == "named":
            text = '{"city": "Paris"}'
        return forced(job, text[:12], text[12:])

    http, supervisor = client(call)
    ask = {"input": "Weather?", "tools": [WEATHER], "tool_choice": "required"}
    body = http.post("/v1/responses", json=ask).json()
    assert [item["type"] for item in body["output"]] == ["function_call"]
    assert supervisor.jobs[0].request.calls == "list" and supervisor.jobs[0].request.grammar
    seen = events(http.post("/v1/responses", json=ask | {"stream": True}))
    assert not [e for e in seen if e["type"] == "response.output_text.delta"]
    named = ask | {"tool_choice": {"type": "function", "name": "get_weather"}}
    http.post("/v1/responses", json=named)
    assert supervisor.jobs[-1].request.calls == "named"
    assert supervisor.jobs[-1].request.call_name == "get_weather"


def test_allowed_tools_narrows_the_tools_the_model_sees() -> None:
    http, supervisor = client(hello)
    other = {**WEATHER, "name": "get_time"}
    choice = {
        "type": "allowed_tools",
        "mode": "auto",
        "tools": [{"type": "function", "name": "get_time"}],
    }
    ask = {"input": "x", "tools": [WEATHER, other], "tool_choice": choice}
    assert http.post("/v1/responses", json=ask).status_code == 200
    assert [t["function"]["name"] for t in supervisor.jobs[-1].request.tools] == ["get_time"]
    http.post("/v1/responses", json=ask | {"tool_choice": {**choice, "mode": "required"}})
    assert supervisor.jobs[-1].request.calls == "named"


def hello(job):
    return says("Hel", "lo")


def test_a_length_cut_is_incomplete() -> None:
    http, _ = client(lambda job: says("Hel", "lo", finish="length"))
    body = http.post("/v1/responses", json={"input": "hi", "max_output_tokens": 2}).json()
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["output"][0]["status"] == "incomplete"
    seen = events(
        http.post("/v1/responses", json={"input": "hi", "max_output_tokens": 2, "stream": True})
    )
    assert seen[-1]["type"] == "response.incomplete"


def test_a_stream_that_cannot_go_on_ends_in_response_failed() -> None:
    def quarantined(job):
        fault = {"class": "gpu_error", "id": "f-1"}
        return [Token(0, 0, "Hel"), ApiError("request_quarantined", "poison", fault=fault)]

    http, _ = client(quarantined)
    answer = http.post("/v1/responses", json={"input": "hi", "stream": True})
    seen = events(answer)
    assert [e["sequence_number"] for e in seen] == list(range(len(seen)))
    assert "[DONE]" not in answer.text
    last = seen[-1]
    assert last["type"] == "response.failed"
    assert last["response"]["status"] == "failed"
    error = last["response"]["error"]
    assert error["code"] == "request_quarantined" and error["retryable"] is False
    assert error["fault"] == {"class": "gpu_error", "id": "f-1"}
    assert error["request_id"] == answer.headers["x-request-id"]
    assert last["response"]["output"][0]["content"][0]["text"] == "Hel"


def test_errors_before_the_stream_are_the_spec_envelope() -> None:
    def busy(job):
        return [ApiError("backend_unavailable", "recovering", 4)]

    http, _ = client(busy)
    answer = http.post("/v1/responses", json={"input": "hi", "stream": True})
    assert answer.status_code == 503
    assert answer.headers["retry-after"] == "4" and answer.headers["x-should-retry"] == "true"
    assert answer.json()["error"]["type"] == "backend_unavailable"


THOUGHT = {"type": "reasoning_text", "text": "Call it."}
ARGS = '{"city": "Paris"}'


def test_input_items_are_read_as_chat_messages() -> None:
    http, supervisor = client(hello)
    items = [
        {"role": "developer", "content": "Use tools."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hm?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [THOUGHT]},
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_1",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Checking.", "annotations": []}],
        },
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": ARGS},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"role": "user", "content": "Thanks"},
    ]  # fmt: skip
    answer = http.post("/v1/responses", json={"input": items, "tools": [WEATHER]})
    assert answer.status_code == 200, answer.text
    assert supervisor.jobs[0].request.messages == [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Hm?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": "Call it.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny", "name": "get_weather"},
        {"role": "user", "content": "Thanks"},
    ]


def test_steward_reasoning_returns_through_encrypted_content() -> None:
    http, supervisor = client(thinks_then_says)
    ask = {"input": "hi", "store": False, "include": ["reasoning.encrypted_content"]}
    body = http.post("/v1/responses", json=ask).json()
    reasoning, message = body["output"]
    assert reasoning["encrypted_content"] == ENCRYPTED + "Hm, Paris."
    reasoning.pop("content")  # a stateless client may keep only the opaque blob
    turn = [{"role": "user", "content": "hi"}, reasoning, message, {"role": "user", "content": "?"}]
    assert http.post("/v1/responses", json={"input": turn, "store": False}).status_code == 200
    assert supervisor.jobs[-1].request.messages[1] == {
        "role": "assistant",
        "content": "Paris",
        "reasoning_content": "Hm, Paris.",
    }


@pytest.mark.parametrize(
    ("effort", "thinking"),
    [(None, None), ("none", False), ("minimal", False), ("low", True), ("max", True)],
)
def test_reasoning_effort_turns_thinking_on_or_off(effort, thinking) -> None:
    http, supervisor = client(hello)
    reasoning = {"effort": effort, "summary": "auto"} if effort else None
    assert (
        http.post("/v1/responses", json={"input": "x", "reasoning": reasoning}).status_code == 200
    )
    assert supervisor.jobs[-1].request.thinking is thinking


def test_text_format_json_schema_is_a_grammar() -> None:
    http, supervisor = client(lambda job: says('{"a": 1}'))
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    fmt = {"type": "json_schema", "name": "thing", "schema": schema, "strict": True}
    body = http.post("/v1/responses", json={"input": "x", "text": {"format": fmt}}).json()
    assert body["text"]["format"] == fmt
    assert supervisor.jobs[-1].request.grammar
    http.post("/v1/responses", json={"input": "x", "text": {"format": {"type": "json_object"}}})
    assert supervisor.jobs[-1].request.grammar
    http.post("/v1/responses", json={"input": "x", "text": {"format": {"type": "text"}}})
    assert supervisor.jobs[-1].request.grammar is None
    both = {"input": "x", "text": {"format": fmt}, "tools": [WEATHER]}
    assert http.post("/v1/responses", json=both).json()["error"]["param"] == "text.format"


def test_logprobs_come_when_included() -> None:
    from steward.wire.protocol import Logprob, TopLogprob

    def with_logprobs(job):
        entry = Logprob("Hi", b"Hi", -0.5, [TopLogprob("Hi", b"Hi", -0.5)])
        return [Token(0, 0, "Hi", logprob=entry), done(1)]

    http, supervisor = client(with_logprobs)
    ask = {"input": "x", "include": ["message.output_text.logprobs"], "top_logprobs": 1}
    body = http.post("/v1/responses", json=ask).json()
    assert supervisor.jobs[-1].request.logprobs == 1
    (entry,) = body["output"][0]["content"][0]["logprobs"]
    assert entry["token"] == "Hi" and entry["logprob"] == -0.5 and entry["top_logprobs"]
    assert (
        http.post("/v1/responses", json={"input": "x"})
        and supervisor.jobs[-1].request.logprobs == -1
    )


COMPUTER = {"type": "computer_use_preview", "display_width": 1, "display_height": 1}


@pytest.mark.parametrize(
    ("tool", "named"),
    [
        ({"type": "web_search"}, "web_search"),
        ({"type": "web_search_preview"}, "web_search_preview"),
        ({"type": "file_search", "vector_store_ids": ["v"]}, "file_search"),
        ({"type": "code_interpreter", "container": {"type": "auto"}}, "code_interpreter"),
        ({"type": "mcp", "server_label": "x", "server_url": "http://x"}, "mcp"),
        ({"type": "image_generation"}, "image_generation"),
        (COMPUTER, "computer_use_preview"),
        ({"type": "local_shell"}, "local_shell"),
        ({"type": "custom", "name": "apply_patch"}, "custom"),
    ],
)  # fmt: skip
def test_a_hosted_tool_is_left_out_and_named(tool: dict, named: str) -> None:
    """No schema to call it by: out of the prompt, named in the header; a 400 naming its
    type only with --strict-requests."""
    http, supervisor = client(hello)
    answer = http.post("/v1/responses", json={"input": "x", "tools": [WEATHER, tool]})
    assert answer.status_code == 200, answer.text
    assert answer.headers["steward-ignored"] == "tools.1"
    (served,) = supervisor.jobs[-1].request.tools or []
    assert served["function"]["name"] == "get_weather"
    assert [t["name"] for t in answer.json()["tools"]] == ["get_weather"]
    strict, supervisor = client(hello, strict_requests=True)
    answer = strict.post("/v1/responses", json={"input": "x", "tools": [WEATHER, tool]})
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert repr(named) in error["message"] and error["param"] == "tools"
    assert not supervisor.jobs


FILE = {"type": "input_file", "file_id": "f"}
IMAGE_FILE = {"type": "input_image", "file_id": "f"}
IMAGE_PARAM = "input.0.message.content.0.input_image"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"background": True}, "background"),
        ({"background_options": {"completion_window": "2h"}}, "background_options"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"moderation": {"model": "omni-moderation-latest"}}, "moderation"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt"),
        ({"truncation": "auto"}, "truncation"),
        ({"prompt_cache_options": {"prewarm": True}}, "prompt_cache_options"),
        ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"temperature": 3}, "temperature"),
        ({"input": [{"type": "web_search_call", "id": "w"}]}, "input"),
        ({"input": [{"role": "user", "content": [FILE]}]}, "input.0.message.content"),
        ({"input": [{"role": "user", "content": [IMAGE_FILE]}]}, IMAGE_PARAM),
        ({"input": []}, "input"),
        ({"previous_response_id": "resp_gone"}, "previous_response_id"),
    ],
)  # fmt: skip
def test_what_steward_cannot_do_is_a_400_naming_it(extra: dict, param: str) -> None:
    http, supervisor = client(hello)
    answer = http.post("/v1/responses", json={"input": "x"} | extra)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param, answer.text
    assert not supervisor.jobs


AUTO = {"tool_choice": "auto"}


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("/v1/responses", {"input": "Summarize.", "tools": []} | AUTO),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]} | AUTO),
    ],
)  # fmt: skip
def test_auto_tool_choice_without_tools_is_no_tools(route: str, body: dict) -> None:
    """Codex's compaction request sends `tool_choice: auto` and no tools (28b's finding);
    OpenAI answers it."""
    http, supervisor = client(hello)
    answer = http.post(route, json=body)
    assert answer.status_code == 200, answer.text
    assert supervisor.jobs[-1].request.tools is None
    assert http.post(route, json=body | {"tool_choice": "required"}).status_code == 400


def test_fields_that_change_nothing_here_are_accepted_and_echoed() -> None:
    http, _ = client(hello)
    quiet = {
        "metadata": {"run": "7"},
        "user": "u",
        "safety_identifier": "s",
        "prompt_cache_key": "k",
        "prompt_cache_retention": "24h",
        "prompt_cache_options": {"mode": "implicit", "ttl": "30m"},
        "service_tier": "priority",
        "max_tool_calls": 3,
        "truncation": "disabled",
        "background": False,
        "stream_options": {"include_obfuscation": False},
        "text": {"verbosity": "low"},
        "reasoning": {"summary": "detailed", "context": "auto", "mode": "standard"},
        "include": ["web_search_call.action.sources", "message.input_image.image_url"],
        "image": {"context_compression": "auto"},
        "access_programs": {"cyber": "standard"},
        "parallel_tool_calls": False,
        "store": True,
        "top_p": 0.5,
        "context_management": [{"type": "compaction", "compact_threshold": 1000}],
    }
    answer = http.post("/v1/responses", json={"input": "x"} | quiet)
    assert answer.status_code == 200, answer.text
    assert "steward-ignored" not in answer.headers
    body = answer.json()
    assert body["metadata"] == {"run": "7"} and body["service_tier"] == "default"
    assert body["prompt_cache_key"] == "k" and body["top_p"] == 0.5
    assert body["parallel_tool_calls"] is False


def test_a_chain_continues_its_stored_history() -> None:
    http, supervisor = client(hello)
    first = http.post("/v1/responses", json={"input": "one", "instructions": "Be brief."}).json()
    second = http.post(
        "/v1/responses", json={"input": "two", "previous_response_id": first["id"]}
    ).json()
    third = http.post(
        "/v1/responses", json={"input": "three", "previous_response_id": second["id"]}
    ).json()
    assert third["previous_response_id"] == second["id"]
    assert supervisor.jobs[-1].request.messages == [
        {"role": "user", "content": "one"},  # a previous response's instructions stay behind
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "two"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "three"},
    ]
    assert http.get(f"/v1/responses/{third['id']}").json() == third
    listed = http.get(f"/v1/responses/{third['id']}/input_items").json()
    assert listed["object"] == "list" and not listed["has_more"]
    (item,) = listed["data"]
    assert item["content"] == [{"type": "input_text", "text": "three"}]
    assert item["id"].startswith("msg_") and listed["first_id"] == item["id"]


def test_get_delete_and_cancel_of_a_stored_response() -> None:
    http, _ = client(hello)
    made = http.post("/v1/responses", json={"input": "x"}).json()
    url = f"/v1/responses/{made['id']}"
    assert http.post(url + "/cancel").status_code == 400
    assert http.get(url, params={"stream": "true"}).json()["error"]["param"] == "stream"
    assert http.delete(url).json() == {
        "id": made["id"],
        "object": "response.deleted",
        "deleted": True,
    }
    for gone in (http.get(url), http.delete(url), http.get(url + "/input_items")):
        assert gone.status_code == 404
        assert gone.json()["error"]["type"] == "not_found"
        assert "restarts" in gone.json()["error"]["message"]
        assert gone.headers["x-should-retry"] == "false"


def test_store_false_keeps_nothing() -> None:
    http, _ = client(hello)
    made = http.post("/v1/responses", json={"input": "x", "store": False}).json()
    assert made["store"] is False
    assert http.get(f"/v1/responses/{made['id']}").status_code == 404
    later = http.post("/v1/responses", json={"input": "y", "previous_response_id": made["id"]})
    assert later.status_code == 400


def test_input_items_pages() -> None:
    http, _ = client(hello)
    items = [{"role": "user", "content": str(i)} for i in range(5)]
    made = http.post("/v1/responses", json={"input": items}).json()
    url = f"/v1/responses/{made['id']}/input_items"
    newest = http.get(url, params={"limit": 2}).json()
    assert [i["content"][0]["text"] for i in newest["data"]] == ["4", "3"] and newest["has_more"]
    rest = http.get(url, params={"limit": 5, "after": newest["last_id"]}).json()
    assert [i["content"][0]["text"] for i in rest["data"]] == ["2", "1", "0"]
    oldest = http.get(url, params={"order": "asc", "limit": 1}).json()
    assert oldest["data"][0]["content"][0]["text"] == "0"


def record(name: str, pad: int = 0) -> Stored:
    return Stored({"id": name, "output": [], "pad": "x" * pad}, [], [])


def test_the_store_evicts_the_oldest_past_its_bytes() -> None:
    store = ResponseStore(max_bytes=200, max_age=60)
    for name in ("a", "b", "c"):
        assert store.put(record(name, 40))
    assert list(store.records) == ["b", "c"] and store.evicted == 1
    assert store.bytes == sum(r.size for r in store.records.values()) <= 200
    assert not store.put(record("huge", 500))  # larger than the whole budget: not kept
    assert store.get("huge") is None and list(store.records) == ["b", "c"]
    assert store.delete("b") and not store.delete("b")
    assert store.bytes == store.records["c"].size


def test_the_store_forgets_what_is_older_than_its_age() -> None:
    now = [0.0]
    store = ResponseStore(max_bytes=10_000, max_age=60, clock=lambda: now[0])
    store.put(record("old"))
    now[0] = 30
    store.put(record("young"))
    now[0] = 61
    assert store.get("old") is None and store.get("young") is not None
    now[0] = 91
    assert store.get("young") is None and store.bytes == 0


def test_a_record_holds_its_whole_conversation() -> None:
    first = Stored({"id": "r1", "output": [{"type": "message", "n": 1}]}, [{"n": 0}], [])
    second = Stored({"id": "r2", "output": [{"n": 3}]}, [{"n": 2}], first.conversation())
    assert [i["n"] for i in second.conversation()] == [0, 1, 2, 3]


def test_a_zero_byte_store_keeps_nothing() -> None:
    http, _ = client(hello, responses_store_bytes=0)
    made = http.post("/v1/responses", json={"input": "x"}).json()
    assert made["store"] is False  # said honestly: nothing was kept
    assert http.get(f"/v1/responses/{made['id']}").status_code == 404

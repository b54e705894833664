"""Anthropic Messages over a scripted supervisor (tests/front/scripted.py): the body into
the one `Generate`, the answer into a `message` and its event stream, every refusal a 400
naming its field, in milliseconds. (The official SDK against real servers:
test_anthropic_sdk.py.)"""

from __future__ import annotations

import json
from typing import Any

import pytest

from steward.errors import ApiError
from steward.front.dialects import anthropic_answer
from steward.front.dialects.anthropic_answer import signature
from steward.wire.protocol import CallDelta, Done, Token
from tests.front.scripted import MODEL, client, done, forced, says

ASK = [{"role": "user", "content": "hi"}]
BODY: dict[str, Any] = {"max_tokens": 16, "messages": ASK}
TOOL = {"name": "get_weather", "input_schema": {"type": "object"}}


def hello(job):
    return says("Hel", "lo")


def thinking_then_answer(job):
    return [
        Token(0, 1, "", reasoning=" Let me"),
        Token(0, 2, "", reasoning=" see"),
        Token(0, 3, ""),  # the end marker's token: text of neither part
        Token(0, 4, " Paris"),
        Token(0, 5, " indeed"),
        Done(0, "stop", 9, 5, ttft=0.01, decode_tps=10.0, cached_tokens=4, reasoning_tokens=3),
    ]


def events(text: str) -> list[tuple[str, dict]]:
    """An SSE body as (event name, data) pairs; each name must be its data's type."""
    found = []
    for frame in text.strip().split("\n\n"):
        name, data = frame.split("\n")
        assert name.startswith("event: ") and data.startswith("data: "), frame
        body = json.loads(data[6:])
        assert body["type"] == name[7:]
        found.append((name[7:], body))
    return found


def sent(supervisor) -> Any:
    return supervisor.jobs[-1].request


# -- the request -------------------------------------------------------------------------


def test_the_conversation_reaches_the_template_as_chat_turns() -> None:
    http, supervisor = client(hello)
    body = {
        "max_tokens": 16,
        "system": [
            {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "Be kind."},
        ],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "A tool.", "signature": "anything"},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"c": 1}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_2",
                        "content": [{"type": "text", "text": "no such city"}],
                        "is_error": True,
                    },
                    {"type": "text", "text": "Thanks."},
                ],
            },
        ],
        "tools": [TOOL | {"description": "The weather.", "cache_control": {"type": "ephemeral"}}],
    }
    assert http.post("/v1/messages", json=body).status_code == 200
    request = sent(supervisor)
    assert request.messages == [
        {"role": "system", "content": "Be brief.\nBe kind."},
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"c": 1}},
                }
            ],
            "reasoning_content": "A tool.",
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny", "name": "get_weather"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: no such city"},
        {"role": "user", "content": "Thanks."},
    ]
    function = {
        "name": "get_weather",
        "description": "The weather.",
        "parameters": TOOL["input_schema"],
    }
    assert request.tools == [{"type": "function", "function": function}]
    assert request.calls == "auto" and request.grammar is None


def test_sampling_stops_and_defaults() -> None:
    http, supervisor = client(hello)
    http.post("/v1/messages", json=BODY)
    assert (sent(supervisor).temperature, sent(supervisor).top_p) == (1.0, 1.0)  # Anthropic's
    body = BODY | {"temperature": 0, "top_p": 0.5, "top_k": 7, "stop_sequences": ["END", ""]}
    assert http.post("/v1/messages", json=body).status_code == 200
    request = sent(supervisor)
    assert (request.temperature, request.top_p, request.top_k) == (0.0, 0.5, 7)
    assert request.stop == ["END"] and request.max_tokens == 16


@pytest.mark.parametrize(
    ("thinking", "last", "enabled"),
    [
        (None, ASK, None),
        ({"type": "adaptive"}, ASK, None),
        ({"type": "enabled", "budget_tokens": 1024}, ASK, True),
        ({"type": "disabled"}, ASK, False),
        ({"type": "between_tools"}, ASK, False),
        (
            {"type": "between_tools"},
            [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]}],
            True,
        ),
    ],
)
def test_thinking_turns_the_templates_enable_thinking(thinking, last, enabled) -> None:
    http, supervisor = client(hello)
    body = {"max_tokens": 16, "messages": last} | ({"thinking": thinking} if thinking else {})
    assert http.post("/v1/messages", json=body).status_code == 200, body
    assert sent(supervisor).thinking is enabled


def test_a_forced_call_and_a_json_answer_are_grammars_with_thinking_off() -> None:
    http, supervisor = client(hello)
    tools = {"tools": [TOOL]}
    http.post(
        "/v1/messages", json=BODY | tools | {"tool_choice": {"type": "tool", "name": "get_weather"}}
    )
    named = sent(supervisor)
    assert (named.calls, named.call_name, named.thinking) == ("named", "get_weather", False)
    assert named.grammar
    choice = {"type": "any", "disable_parallel_tool_use": True}
    http.post("/v1/messages", json=BODY | tools | {"tool_choice": choice})
    assert sent(supervisor).calls == "list" and '"maxItems":1' in sent(supervisor).grammar
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    config = {
        "output_config": {"format": {"type": "json_schema", "schema": schema}, "effort": "low"}
    }
    assert http.post("/v1/messages", json=BODY | config).status_code == 200
    assert sent(supervisor).grammar and sent(supervisor).calls == ""
    http.post("/v1/messages", json=BODY | tools | {"tool_choice": {"type": "none"}})
    assert sent(supervisor).tools is None and sent(supervisor).calls == ""


def test_clear_thinking_keeps_the_last_turns_thinking() -> None:
    http, supervisor = client(hello)
    turn = {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "t", "signature": "s"},
            {"type": "text", "text": "a"},
        ],
    }
    messages = [ASK[0], turn, ASK[0], turn, ASK[0], turn, ASK[0]]

    def kept(keep: Any) -> list[bool]:
        edit = {"type": "clear_thinking_20251015"} | ({} if keep is None else {"keep": keep})
        body = {"max_tokens": 4, "messages": messages, "context_management": {"edits": [edit]}}
        assert http.post("/v1/messages", json=body).status_code == 200
        turns = [m for m in sent(supervisor).messages if m["role"] == "assistant"]
        return ["reasoning_content" in m for m in turns]

    assert kept(None) == [False, False, True]  # Anthropic's default: the last turn's
    assert kept({"type": "thinking_turns", "value": 2}) == [False, True, True]
    assert kept({"type": "thinking_turns", "value": 0}) == [False, False, False]
    assert kept("all") == kept({"type": "all"}) == [True, True, True]


def test_clear_tool_uses_is_served_only_where_it_cannot_fire() -> None:
    http, _ = client(hello)  # context 2048
    edit = {"type": "clear_tool_uses_20250919", "keep": {"type": "tool_uses", "value": 3}}
    management = {"context_management": {"edits": [edit]}}
    assert http.post("/v1/messages", json=BODY | management).status_code == 200  # 100k
    low = {"edits": [edit | {"trigger": {"type": "input_tokens", "value": 1000}}]}
    refused = http.post("/v1/messages", json=BODY | {"context_management": low})
    assert refused.status_code == 400
    assert refused.json()["error"]["type"] == "invalid_request_error"
    assert "clear_tool_uses_20250919" in refused.json()["error"]["message"]


def test_accepted_no_ops_change_nothing() -> None:
    http, supervisor = client(hello)
    http.post("/v1/messages", json=BODY)
    plain = sent(supervisor)
    no_ops = {
        "cache_control": {"type": "ephemeral", "ttl": "1h"},
        "metadata": {"user_id": "user_abc_account_def_session_ghi"},
        "service_tier": "standard_only",
        "speed": "fast",
        "inference_geo": "us",
        "diagnostics": {"previous_message_id": None},
        "user_profile_id": "p",
        "workspace_id": "w",
        "container": None,
        "output_config": {"effort": "max"},
        "model": "default",
        "mcp_servers": [],
        "billing_policy": {"mode": "x"},
        "fallback_credit_token": "t",
    }
    answer = http.post(
        "/v1/messages?beta=true", json=BODY | no_ops, headers={"anthropic-beta": "x"}
    )
    assert answer.status_code == 200, answer.text
    assert "steward-ignored" not in answer.headers
    assert sent(supervisor) == plain
    assert answer.json()["diagnostics"] is None


@pytest.mark.parametrize(
    ("change", "param", "says"),
    [
        ({"mcp_servers": [{"type": "url", "url": "http://x", "name": "x"}]}, None, "MCP"),
        ({"thread": {"id": "t"}}, None, "thread"),
        ({"temperature": 1.5}, "temperature", "less than or equal"),
        ({"max_tokens": None}, "max_tokens", ""),
        ({"container": "c_1"}, None, "container"),
        ({"messages": [{"role": "user", "content": [{"type": "document"}]}]}, None, "document"),
        (
            {"messages": [ASK[0], {"role": "assistant", "content": "The answer is"}]},
            None,
            "prefill",
        ),
        ({"messages": [{"role": "user", "content": []}]}, "messages.0.content", ""),
        ({"tools": [TOOL | {"strict": True}]}, None, "strict"),
        ({"tool_choice": {"type": "any"}}, None, "needs tools"),
        (
            {"tools": [TOOL], "tool_choice": {"type": "tool", "name": "x"}},
            None,
            "no tool is named",
        ),
        (
            {
                "tools": [TOOL],
                "tool_choice": {"type": "any"},
                "thinking": {"type": "enabled", "budget_tokens": 9},
            },
            None,
            "no room for thinking",
        ),
        ({"thinking": {"type": "enabled"}}, None, "budget_tokens"),
        (
            {"context_management": {"edits": [{"type": "compact_20260112"}]}},
            None,
            "compact_20260112",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "tool_use", "id": "a", "name": "b", "input": {}}],
                    }
                ]
            },
            None,
            "no tool_use blocks",
        ),
    ],
)
def test_what_is_not_served_is_a_400_naming_it(change: dict, param: str | None, says: str) -> None:
    http, supervisor = client(hello)
    answer = http.post("/v1/messages", json=BODY | change)
    assert answer.status_code == 400, answer.text
    assert answer.headers["x-should-retry"] == "false"
    body = answer.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert says in body["error"]["message"]
    if param is not None:
        assert param in body["error"]["message"]
    assert supervisor.jobs == []


def test_an_unknown_model_is_anthropics_not_found() -> None:
    http, _ = client(hello, served_model_name=["claude-*"])
    assert http.post("/v1/messages", json=BODY | {"model": "claude-haiku-4-5"}).status_code == 200
    answer = http.post("/v1/messages", json=BODY | {"model": "gpt-4o"})
    assert answer.status_code == 404 and answer.json()["error"]["type"] == "not_found_error"


# -- the answer --------------------------------------------------------------------------


def test_a_message_with_thinking_text_and_usage() -> None:
    http, _ = client(thinking_then_answer)
    message = http.post("/v1/messages", json=BODY | {"model": MODEL}).json()
    assert message["content"] == [
        {"type": "thinking", "thinking": " Let me see", "signature": signature(" Let me see")},
        {"type": "text", "text": " Paris indeed"},
    ]
    assert message["stop_reason"] == "end_turn" and message["stop_sequence"] is None
    assert message["usage"] == {
        "input_tokens": 5,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 4,
        "output_tokens": 5,
        "output_tokens_details": {"thinking_tokens": 3},
        "service_tier": "standard",
    }
    assert message["id"].startswith("msg_") and message["model"] == MODEL
    omitted = {"thinking": {"type": "adaptive", "display": "omitted"}}
    (block, _) = http.post("/v1/messages", json=BODY | omitted).json()["content"]
    assert block == {"type": "thinking", "thinking": "", "signature": signature(" Let me see")}


def test_the_stream_is_anthropics_event_grammar() -> None:
    http, _ = client(thinking_then_answer)
    answer = http.post("/v1/messages", json=BODY | {"stream": True})
    assert answer.headers["content-type"].startswith("text/event-stream")
    seen = events(answer.text)
    names = [name for name, _ in seen]
    assert names == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = seen[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert seen[2][1] == {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "thinking", "thinking": "", "signature": ""},
    }
    deltas = [body["delta"] for name, body in seen if name == "content_block_delta"]
    assert deltas[2] == {"type": "signature_delta", "signature": signature(" Let me see")}
    assert [d.get("text") for d in deltas[3:]] == [" Paris", " indeed"]
    assert seen[7][1]["content_block"] == {"type": "text", "text": ""}
    assert seen[7][1]["index"] == 1
    ending = seen[-2][1]
    assert ending["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert ending["usage"]["input_tokens"] == 5 and ending["usage"]["output_tokens"] == 5


def test_a_stop_string_is_named_whole_and_streamed() -> None:
    stopped = Done(0, "stop", 5, 2, 0.01, 100.0, stop_sequence="END")
    http, _ = client(lambda job: [Token(0, 1, " Paris"), Token(0, 2, " now"), stopped])
    body = BODY | {"stop_sequences": ["END"]}
    message = http.post("/v1/messages", json=body).json()
    assert (message["stop_reason"], message["stop_sequence"]) == ("stop_sequence", "END")
    seen = events(http.post("/v1/messages", json=body | {"stream": True}).text)
    ending = seen[-2][1]
    assert ending["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}


def test_tool_calls_are_tool_use_blocks_whole_and_streamed() -> None:
    def calls(job):
        # the worker keeps the first call alone where the request allows no parallel calls
        second = [CallDelta(1, "get_time", "{}")] if job.request.parallel_calls else []
        return [
            Token(0, 1, "Let me look."),
            Token(0, 2, "", calls=[CallDelta(0, "get_weather", '{"city": ')]),
            Token(0, 3, "", calls=[CallDelta(0, None, '"Paris"}')]),
            Token(0, 4, "", calls=second),
            done(4, "tool_calls"),
        ]

    http, _ = client(calls)
    body = BODY | {"tools": [TOOL, TOOL | {"name": "get_time"}]}
    message = http.post("/v1/messages", json=body).json()
    text, first, second = message["content"]
    assert text == {"type": "text", "text": "Let me look."}
    assert first["type"] == "tool_use" and first["id"].startswith("toolu_")
    assert (first["name"], first["input"]) == ("get_weather", {"city": "Paris"})
    assert (second["name"], second["input"]) == ("get_time", {})
    assert message["stop_reason"] == "tool_use"
    seen = events(http.post("/v1/messages", json=body | {"stream": True}).text)
    starts = [b["content_block"] for n, b in seen if n == "content_block_start"]
    assert [s["type"] for s in starts] == ["text", "tool_use", "tool_use"]
    assert starts[1]["input"] == {} and starts[1]["name"] == "get_weather"
    pieces = [b["delta"]["partial_json"] for n, b in seen if b.get("delta", {}).get("partial_json")]
    assert pieces == ['{"city": ', '"Paris"}', "{}"]
    single = body | {"tool_choice": {"type": "auto", "disable_parallel_tool_use": True}}
    assert [b["type"] for b in http.post("/v1/messages", json=single).json()["content"]] == [
        "text",
        "tool_use",
    ]


def test_a_forced_calls_text_is_never_content() -> None:
    def cut(job):
        return forced(job, '{"city"', finish="length", completion=16)

    http, _ = client(cut)
    body = BODY | {"tools": [TOOL], "tool_choice": {"type": "tool", "name": "get_weather"}}
    message = http.post("/v1/messages", json=body).json()
    assert [b["type"] for b in message["content"]] == ["tool_use"]
    assert message["content"][0]["input"] == {}  # cut short: no object
    assert message["stop_reason"] == "max_tokens"


def test_the_context_may_end_an_answer_before_max_tokens() -> None:
    def fits(job):
        if job.request.max_tokens is not None:
            return [ApiError("context_length_exceeded", "no room for 32000")]
        return says("a", "b", finish="length")

    http, supervisor = client(fits)
    message = http.post("/v1/messages", json=BODY | {"max_tokens": 32000}).json()
    assert [job.request.max_tokens for job in supervisor.jobs] == [None]  # refused at submit
    assert message["stop_reason"] == "model_context_window_exceeded"
    http.post("/v1/messages", json=BODY | {"max_tokens": 900})
    assert [job.request.max_tokens for job in supervisor.jobs][1:] == [900, None]
    message = client(lambda job: says("a", "b", finish="length"))[0].post(
        "/v1/messages", json=BODY | {"max_tokens": 2}
    )
    assert message.json()["stop_reason"] == "max_tokens"


def test_max_tokens_zero_warms_the_cache_and_answers_nothing() -> None:
    http, supervisor = client(hello)
    message = http.post("/v1/messages", json=BODY | {"max_tokens": 0}).json()
    assert sent(supervisor).max_tokens == 1
    assert message["content"] == [] and message["stop_reason"] == "max_tokens"
    assert message["usage"]["output_tokens"] == 0 and message["usage"]["input_tokens"] == 5
    names = [
        n
        for n, _ in events(
            http.post("/v1/messages", json=BODY | {"max_tokens": 0, "stream": True}).text
        )
    ]
    assert names == ["message_start", "ping", "message_delta", "message_stop"]


def test_a_stream_that_cannot_go_on_ends_with_an_error_event() -> None:
    def quarantined(job):
        error = ApiError(
            "request_quarantined", "poison", fault={"class": "worker_crash", "id": "f-1"}
        )
        return [Token(0, 1, "Hel"), error]

    http, _ = client(quarantined)
    seen = events(
        http.post(
            "/v1/messages", json=BODY | {"stream": True}, headers={"x-request-id": "r-9"}
        ).text
    )
    name, body = seen[-1]
    assert name == "error" and "message_stop" not in [n for n, _ in seen]
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["code"] == "request_quarantined" and body["error"]["retryable"] is False
    assert body["error"]["fault"] == {"class": "worker_crash", "id": "f-1"}
    assert body["request_id"] == "r-9"


def test_a_retryable_error_has_the_headers_the_sdk_obeys() -> None:
    def busy(job):
        return [ApiError("backend_unavailable", "recovering", retry_after=4)]

    http, _ = client(busy)
    answer = http.post("/v1/messages", json=BODY | {"stream": True})
    assert answer.status_code == 503  # before the first event: an error response, no stream
    assert answer.headers["x-should-retry"] == "true" and answer.headers["retry-after"] == "4"
    assert answer.json()["error"]["type"] == "overloaded_error"


def test_a_silent_stream_pings(monkeypatch: pytest.MonkeyPatch) -> None:
    """A started stream that hears nothing for `PING_SECONDS` (here: until its ping is
    written, when the rest of the answer is delivered) writes `ping`, and goes on."""
    jobs = []

    def first_only(job):
        jobs.append(job)
        return [Token(0, 1, "Hel")]

    def ping(self) -> list[str]:
        if self.pinged:
            jobs[0].deliver([Token(0, 2, "lo"), done(2)])
        self.pinged = True
        return [anthropic_answer.event({"type": "ping"})]

    monkeypatch.setattr(anthropic_answer.MessageAnswer, "idle_seconds", 0.01)
    monkeypatch.setattr(anthropic_answer.MessageAnswer, "pinged", False, raising=False)
    monkeypatch.setattr(anthropic_answer.MessageAnswer, "idle", ping)
    http, _ = client(first_only)
    names = [n for n, _ in events(http.post("/v1/messages", json=BODY | {"stream": True}).text)]
    assert names[:2] == ["message_start", "ping"]
    assert "ping" in names[2:-2] and names[-2:] == ["message_delta", "message_stop"]
    assert names.count("content_block_delta") == 2 and names.count("content_block_start") == 1


def test_count_tokens_is_the_engines_prompt_count_of_the_same_prompt() -> None:
    def counted(job):
        return [Token(0, 1, "x"), Done(0, "length", 42, 1, ttft=0.01, decode_tps=1.0)]

    http, supervisor = client(counted)
    body = {
        "messages": ASK,
        "system": "Be brief.",
        "tools": [TOOL],
        "tool_choice": {"type": "any"},
        "thinking": {"type": "disabled"},
    }
    answer = http.post("/v1/messages/count_tokens", json=body)
    assert answer.status_code == 200 and answer.json() == {"input_tokens": 42}
    request = sent(supervisor)
    assert request.max_tokens == 1 and request.grammar is None and request.calls == ""
    assert request.tools and request.messages[0] == {"role": "system", "content": "Be brief."}
    assert request.thinking is False
    ignored = http.post("/v1/messages/count_tokens", json=body | {"max_tokens": 3})
    assert ignored.status_code == 200 and ignored.headers["steward-ignored"] == "max_tokens"


def test_the_routes_are_documented_in_anthropics_envelope() -> None:
    http, _ = client(hello)
    paths = http.get("/openapi.json").json()["paths"]
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        responses = paths[path]["post"]["responses"]
        assert "422" in responses and "503" in responses
        schema = responses["503"]["content"]["application/json"]["schema"]
        assert schema["$ref"].endswith("/AnthropicError")
    assert "text/event-stream" in paths["/v1/messages"]["post"]["responses"]["200"]["content"]


def png(colour: str = "red") -> str:
    import base64
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (4, 4), colour).save(out, "PNG")
    return base64.b64encode(out.getvalue()).decode()


def colour(data: bytes) -> tuple[int, ...]:
    import io

    from PIL import Image

    return Image.open(io.BytesIO(data)).convert("RGB").getpixel((0, 0))


def image_block(colour: str) -> dict[str, Any]:
    source = {"type": "base64", "media_type": "image/png", "data": png(colour)}
    return {"type": "image", "source": source}


def test_images_reach_a_vision_model_in_place() -> None:
    http, supervisor = client(hello)
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": png()},
    }
    content = [{"type": "text", "text": "What is this?"}, image]
    body = {"max_tokens": 4, "messages": [{"role": "user", "content": content}]}
    refused = http.post("/v1/messages", json=body)
    assert (
        refused.status_code == 400 and "does not take images" in refused.json()["error"]["message"]
    )
    http.app.state.pool.slots[0].vision = True  # the model as the front sees it
    assert http.post("/v1/messages", json=body).status_code == 200
    request = sent(supervisor)
    assert request.messages == [
        {"role": "user", "content": [{"type": "text", "text": "What is this?"}, {"type": "image"}]}
    ]
    assert len(request.images) == 1 and request.images[0].startswith(b"\x89PNG")
    remote = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    body = {"max_tokens": 4, "messages": [{"role": "user", "content": [remote]}]}
    answer = http.post("/v1/messages", json=body)
    assert answer.status_code == 400 and "remote image URLs are refused" in answer.text


def test_an_image_in_a_tools_result_is_shown_after_the_tool_turns() -> None:
    """Claude Code's screenshots come back as images in a tool's result: for a vision model
    they follow the tool turns in a user turn (templates draw images in user turns), in
    order with the others; for a model without vision, the error of any image."""
    http, supervisor = client(hello)
    called = [{"type": "tool_use", "id": f"t{i}", "name": "shot", "input": {}} for i in (1, 2)]
    results = [
        {
            "type": "tool_result",
            "tool_use_id": "t1",
            "content": [{"type": "text", "text": "A"}, image_block("red")],
        },
        {"type": "tool_result", "tool_use_id": "t2", "content": [image_block("lime")]},
        {"type": "text", "text": "Compare them."},
        image_block("blue"),
    ]
    messages = [
        {"role": "user", "content": "Take two screenshots."},
        {"role": "assistant", "content": called},
        {"role": "user", "content": results},
    ]
    body = {"max_tokens": 4, "messages": messages, "tools": [TOOL | {"name": "shot"}]}
    refused = http.post("/v1/messages", json=body)
    assert refused.status_code == 400, refused.text
    assert "does not take images" in refused.json()["error"]["message"]
    assert supervisor.jobs == []
    http.app.state.pool.slots[0].vision = True
    answer = http.post("/v1/messages", json=body)
    assert answer.status_code == 200, answer.text
    request = sent(supervisor)
    assert request.messages[-3:] == [
        {"role": "tool", "tool_call_id": "t1", "content": "A", "name": "shot"},
        {"role": "tool", "tool_call_id": "t2", "content": "", "name": "shot"},
        {
            "role": "user",
            "content": [
                {"type": "image"},
                {"type": "image"},
                {"type": "text", "text": "Compare them."},
                {"type": "image"},
            ],
        },
    ]
    assert [colour(image) for image in request.images] == [(255, 0, 0), (0, 255, 0), (0, 0, 255)]


def test_a_system_message_in_the_conversation_is_a_system_turn() -> None:
    http, supervisor = client(hello)
    messages = [{"role": "system", "content": "Be brief."}, *ASK]
    assert (
        http.post("/v1/messages", json={"max_tokens": 4, "messages": messages}).status_code == 200
    )
    assert sent(supervisor).messages == [{"role": "system", "content": "Be brief."}, *ASK]

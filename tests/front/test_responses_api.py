"""The Responses API end to end, through the official `openai` SDK against real servers:
`responses.create` and `responses.stream`, thinking split into `reasoning` items (and into
chat's `reasoning_content`), a three-turn `previous_response_id` chain, a function-call
round trip, `text.format` `json_schema` enforced, the store's bound, GET and DELETE, a worker
crash mid-stream resumed to exactly the unfaulted answer, and quarantine as
`response.failed`. Answers stay a few tokens long (the CPU is slow)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import Server
from tests.tinymodel import (
    ANSWER,
    THINKING,
    TOOL_SCRIPT,
    build_scripted_model,
    build_thinking_model,
)

ASK = "What is the capital of France?"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
    "strict": True,
}


@pytest.fixture(scope="module")
def thinker(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> Iterator[Server]:
    model = build_thinking_model(tmp_path_factory.mktemp("think") / "think", default_model_dir)
    server = Server(["--model", str(model), "--served-model-name", "think"])
    server.wait()
    yield server
    server.stop()


def stream_events(client: openai.OpenAI, **ask: object) -> list:
    with client.responses.stream(model="default", **ask) as stream:
        return list(stream)


def numbered(events: list) -> list:
    assert [e.sequence_number for e in events] == list(range(len(events)))
    return events


def test_create_splits_thinking_into_a_reasoning_item(thinker: Server) -> None:
    reply = thinker.client().responses.create(
        model="think", input=ASK, temperature=0, max_output_tokens=24
    )
    assert reply.status == "completed" and reply.object == "response"
    reasoning, message = reply.output
    assert reasoning.type == "reasoning"
    assert [part.text for part in reasoning.content] == [THINKING]
    assert message.type == "message" and reply.output_text == ANSWER
    assert reply.usage.output_tokens_details.reasoning_tokens > 0
    assert reply.usage.output_tokens > reply.usage.output_tokens_details.reasoning_tokens


def test_stream_gives_the_same_response_event_by_event(thinker: Server) -> None:
    client = thinker.client()
    events = numbered(stream_events(client, input=ASK, temperature=0, max_output_tokens=24))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    thinking = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert (thinking, text) == (THINKING, ANSWER)
    assert kinds.index("response.output_item.done") < kinds.index("response.output_text.delta")
    final = events[-1].response
    assert final.output_text == ANSWER and final.output[0].content[0].text == THINKING


def test_no_reasoning_effort_turns_thinking_off(thinker: Server) -> None:
    reply = thinker.client().responses.create(
        model="think", input=ASK, temperature=0, max_output_tokens=24, reasoning={"effort": "none"}
    )
    assert [item.type for item in reply.output] == ["message"]
    assert reply.output_text.strip() == ANSWER.strip()  # the first token's space is dropped
    assert reply.usage.output_tokens_details.reasoning_tokens == 0


def test_chat_completions_give_reasoning_content(thinker: Server) -> None:
    client = thinker.client()
    chat = {"model": "think", "messages": [{"role": "user", "content": ASK}], "temperature": 0}
    reply = client.chat.completions.create(**chat, max_tokens=24)
    message = reply.choices[0].message
    assert message.content == ANSWER and message.reasoning_content == THINKING
    assert reply.usage.completion_tokens_details.reasoning_tokens > 0
    thinking, text = "", ""
    for chunk in client.chat.completions.create(**chat, max_tokens=24, stream=True):
        for choice in chunk.choices:
            thinking += getattr(choice.delta, "reasoning_content", None) or ""
            text += choice.delta.content or ""
    assert (thinking, text) == (THINKING, ANSWER)
    off = client.chat.completions.create(**chat, max_tokens=24, reasoning_effort="none")
    assert off.choices[0].message.content.strip() == ANSWER.strip()
    assert getattr(off.choices[0].message, "reasoning_content", None) is None
    history = [
        *chat["messages"],
        message.model_dump(exclude_none=True),
        {"role": "user", "content": "?"},
    ]
    again = client.chat.completions.create(**chat | {"messages": history}, max_tokens=24)
    assert again.choices[0].message.content == ANSWER  # reasoning_content sent back is taken


def test_a_three_turn_chain_and_its_stored_responses(thinker: Server) -> None:
    client = thinker.client()
    turns = []
    previous = None
    for question in ("One?", "Two?", "Three?"):
        reply = client.responses.create(
            model="think",
            input=question,
            previous_response_id=previous,
            temperature=0,
            max_output_tokens=24,
            metadata={"turn": question},
        )
        turns.append(reply)
        previous = reply.id
    prompts = [turn.usage.input_tokens for turn in turns]
    assert prompts[0] < prompts[1] < prompts[2]  # each turn sees the ones before it
    assert all(turn.output_text == ANSWER for turn in turns)
    fetched = client.responses.retrieve(turns[2].id)
    assert fetched.id == turns[2].id and fetched.previous_response_id == turns[1].id
    assert fetched.metadata == {"turn": "Three?"} and fetched.output_text == ANSWER
    (item,) = client.responses.input_items.list(turns[2].id).data
    assert item.content[0].text == "Three?"
    deleted = client.responses.delete(turns[1].id)
    assert deleted is None or getattr(deleted, "deleted", True)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(turns[1].id)
    # The newest holds the whole chain: a fourth turn still follows it.
    fourth = client.responses.create(
        model="think", input="Four?", previous_response_id=turns[2].id, max_output_tokens=24
    )
    assert fourth.usage.input_tokens > prompts[2]
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        client.responses.create(model="think", input="x", previous_response_id=turns[1].id)


def test_text_format_json_schema_is_enforced(serve, tiny_model) -> None:
    server = serve("--model", str(tiny_model))
    server.wait()
    schema = {
        "type": "object",
        "properties": {"city": {"enum": ["Paris", "Lyon"]}, "sunny": {"type": "boolean"}},
        "required": ["city", "sunny"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "name": "weather", "schema": schema, "strict": True}
    reply = server.client().responses.create(
        model="default", input=ASK, text={"format": fmt}, temperature=0, max_output_tokens=40
    )
    answer = json.loads(reply.output_text)  # a random model, held to the schema
    assert set(answer) == {"city", "sunny"} and answer["city"] in ("Paris", "Lyon")


def test_a_function_call_round_trip(tmp_path: Path, serve, default_model_dir: Path) -> None:
    """A scripted model that calls `get_weather(city="Paris")` in its own format: the call
    comes back as a `function_call` item; its output goes back by `previous_response_id`
    and, statelessly, with the whole history (as Codex sends it)."""
    model = build_scripted_model(tmp_path / "tool", default_model_dir, TOOL_SCRIPT)
    server = serve("--model", str(model))
    server.wait()
    client = server.client()
    first = client.responses.create(
        model="default", input=ASK, tools=[WEATHER], temperature=0, max_output_tokens=32
    )
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"}
    answer = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}
    second = client.responses.create(
        model="default",
        input=[answer],
        previous_response_id=first.id,
        tools=[WEATHER],
        temperature=0,
        max_output_tokens=32,
    )
    assert second.status == "completed"
    assert second.usage.input_tokens > first.usage.input_tokens  # the call and its output
    history = [{"role": "user", "content": ASK}, call.model_dump(exclude_none=True), answer]
    stateless = client.responses.create(
        model="default", input=history, tools=[WEATHER], store=False, max_output_tokens=32
    )
    assert stateless.usage.input_tokens == second.usage.input_tokens
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(stateless.id)
    hosted = client.responses.with_raw_response.create(  # left out of the prompt, named
        model="default", input=ASK, tools=[WEATHER, {"type": "web_search"}], temperature=0
    )
    assert hosted.headers["steward-ignored"] == "tools.1"
    (again,) = hosted.parse().output  # the same prompt: the same call
    assert again.name == "get_weather" and again.arguments == call.arguments


def test_the_store_evicts_the_oldest_at_its_bound(serve, tiny_model) -> None:
    server = serve("--model", str(tiny_model), "--responses-store-bytes", "6000")
    server.wait()
    client = server.client()
    made = [
        client.responses.create(model="default", input=f"q{i}", max_output_tokens=2)
        for i in range(6)
    ]
    assert client.responses.retrieve(made[-1].id).id == made[-1].id
    with pytest.raises(openai.NotFoundError, match="responses-store-bytes"):
        client.responses.retrieve(made[0].id)


def resumed_against_reference(server: Server, **ask: object) -> list:
    """The faulted stream (the worker crashes at its second token and the stream resumes),
    then the unfaulted reference: the same events, numbered the same, the same text."""
    client = server.client()
    faulted = numbered(stream_events(client, temperature=0, **ask))
    assert server.health().json()["faults"]["total"] == 1
    reference = numbered(stream_events(client, temperature=0, **ask))

    def shape(events: list) -> list:
        return [(e.type, e.sequence_number, getattr(e, "delta", None)) for e in events]

    assert shape(faulted) == shape(reference)
    assert faulted[-1].response.output_text == reference[-1].response.output_text
    return faulted


def test_a_crash_mid_stream_resumes_to_the_unfaulted_answer(serve, tiny_model) -> None:
    server = serve(
        "--model", str(tiny_model), "--stall-timeout", "2", "--inject-fault", "decode:crash:nth=1"
    )
    server.wait()
    events = resumed_against_reference(server, input=ASK, max_output_tokens=12)
    assert events[-1].type == "response.incomplete"  # a random model runs to its budget
    assert sum(e.type == "response.output_text.delta" for e in events) > 2
    assert server.health().json()["worker"]["generation"] == 2


def test_a_crash_mid_thought_resumes_the_same_reasoning_item(
    tmp_path: Path, serve, default_model_dir: Path
) -> None:
    model = build_thinking_model(tmp_path / "think", default_model_dir)
    server = serve(
        "--model", str(model), "--stall-timeout", "2", "--inject-fault", "decode:crash:nth=1"
    )
    server.wait()
    events = resumed_against_reference(server, input=ASK, max_output_tokens=24)
    added = [e.item.type for e in events if e.type == "response.output_item.added"]
    assert added == ["reasoning", "message"]  # one reasoning item, continued, not reopened
    assert events[-1].response.output_text == ANSWER


def test_a_poison_stream_ends_in_response_failed(serve, tiny_model) -> None:
    server = serve("--model", str(tiny_model), "--inject-fault", "decode:raise:marker=X-POISON")
    server.wait()
    events = numbered(
        list(
            server.client().responses.create(
                model="default", input="X-POISON", stream=True, max_output_tokens=8
            )
        )
    )
    assert events[0].type == "response.created"
    failed = events[-1]
    assert failed.type == "response.failed" and failed.response.status == "failed"
    error = failed.response.error.model_dump()
    assert error["code"] == "request_quarantined" and error["retryable"] is False
    assert error["fault"]["class"] in ("gpu_timeout", "gpu_error", "backend_error")
    retry = httpx.post(
        server.url + "/v1/responses", json={"input": "X-POISON", "max_output_tokens": 8}, timeout=60
    )
    assert retry.status_code == 422 and retry.json()["error"]["type"] == "request_quarantined"

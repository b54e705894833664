"""Speculative decoding through real servers and the official clients (SPEC §11): a tiny
model's greedy answers in every dialect, streamed and not, are the same with speculation
always on, judged (`auto`, on a server whose verify steps are made to lose) and off;
OpenAI's `prediction` is taken, its draft tokens counted in usage and in `/metrics`, and
not drafted where verifying loses; a thinking answer verified several tokens a step is
split into thinking and answer, and a tool call parsed, as one token a step is."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anthropic
import pytest

from tests.conftest import Server, function_tool
from tests.tinymodel import (
    ANSWER,
    THINKING,
    TOOL_SCRIPT,
    build_scripted_model,
    build_thinking_model,
)

# The tiny random model's answer repeats itself: lookup in its own answer drafts it.
ASK = "def area(w, h):\n    return w * h\n" * 4
TOKENS = 40
# SPEC §6: every verify step 200 ms slower; on a loaded CPU a decode step can take 30 ms.
LOSING = "verify:slow=0.2:every"


@pytest.fixture(scope="module")
def servers(tiny_model: Path) -> Iterator[dict[str, Server]]:
    """The tiny model with speculation always on, judged where every verify step is 200 ms
    slower (a device where verifying loses), and off (the default)."""
    named = ["--model", str(tiny_model), "--served-model-name", "tiny"]
    both = {
        "always": Server([*named, "--speculate", "always"]),
        "auto": Server([*named, "--speculate", "auto", "--inject-fault", LOSING]),
        "none": Server([*named, "--speculate", "none"]),
    }
    try:
        for server in both.values():
            server.wait()
        yield both
    finally:
        for server in both.values():
            server.stop()


def chat(server: Server, stream: bool) -> str:
    client = server.client()
    messages: Any = [{"role": "user", "content": ASK}]
    ask: dict[str, Any] = {"model": "tiny", "messages": messages, "max_tokens": TOKENS}
    if not stream:
        return client.chat.completions.create(temperature=0, **ask).choices[0].message.content
    chunks = client.chat.completions.create(temperature=0, stream=True, **ask)
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def completions(server: Server, stream: bool) -> str:
    ask = {"model": "tiny", "prompt": ASK, "max_tokens": TOKENS, "temperature": 0}
    client = server.client()
    if not stream:
        return client.completions.create(**ask).choices[0].text
    return "".join(c.choices[0].text for c in client.completions.create(stream=True, **ask))


def responses(server: Server, stream: bool) -> str:
    ask = {"model": "tiny", "input": ASK, "max_output_tokens": TOKENS, "temperature": 0}
    client = server.client()
    if not stream:
        return client.responses.create(**ask).output_text
    events = client.responses.create(stream=True, **ask)
    return "".join(e.delta for e in events if e.type == "response.output_text.delta")


def messages(server: Server, stream: bool) -> str:
    client = anthropic.Anthropic(base_url=server.url, api_key="none")
    ask: dict[str, Any] = {
        "model": "tiny",
        "max_tokens": TOKENS,
        "messages": [{"role": "user", "content": ASK}],
        "extra_body": {"temperature": 0},
    }
    if not stream:
        return "".join(b.text for b in client.messages.create(**ask).content if b.type == "text")
    with client.messages.stream(**ask) as events:
        return "".join(events.text_stream)


@pytest.mark.parametrize("dialect", [chat, completions, responses, messages])
def test_greedy_answers_are_the_same_with_speculation_on_and_off(servers, dialect) -> None:
    with ThreadPoolExecutor(4) as pool:  # both servers, streamed and not, at once
        got = {
            (spec, stream): pool.submit(dialect, server, stream)
            for spec, server in servers.items()
            for stream in (False, True)
        }
        texts = {key: future.result() for key, future in got.items()}
    assert len(set(texts.values())) == 1, texts
    assert texts["none", False]


def test_a_prediction_is_counted_in_usage_and_metrics(servers) -> None:
    client = servers["always"].client()
    reference = chat(servers["none"], stream=False)
    messages: Any = [{"role": "user", "content": ASK}]
    predicted = client.chat.completions.create(
        model="tiny",
        messages=messages,
        max_tokens=TOKENS,
        temperature=0,
        prediction={"type": "content", "content": [{"type": "text", "text": reference}]},
    )
    assert predicted.choices[0].message.content == reference
    details = predicted.usage.completion_tokens_details
    # The random model's text does not always encode back to its tokens: some refused.
    assert details.accepted_prediction_tokens >= TOKENS // 2
    assert details.rejected_prediction_tokens < details.accepted_prediction_tokens
    metrics = servers["always"].http.get("/metrics").text
    accepted = next(
        line for line in metrics.splitlines() if line.startswith("steward_draft_tokens_total")
    )
    assert 'result="accepted"' in accepted and float(accepted.split()[-1]) >= TOKENS // 2
    off = (
        servers["none"]
        .client()
        .chat.completions.create(
            model="tiny",
            messages=messages,
            max_tokens=TOKENS,
            temperature=0,
            prediction={"type": "content", "content": reference},
        )
    )
    assert off.usage.completion_tokens_details.accepted_prediction_tokens == 0


def test_auto_drafts_a_prediction_only_while_verifying_pays(servers) -> None:
    """On the `auto` server every verify step loses: after its trial it decodes the rest
    plainly, answering the same, its usage counting what the trial drafted."""
    reference = chat(servers["none"], stream=False)
    messages: Any = [{"role": "user", "content": ASK}]
    ask: dict[str, Any] = {"model": "tiny", "messages": messages, "max_tokens": TOKENS}
    prediction = {"type": "content", "content": reference}
    judged, always = (
        servers[mode].client().chat.completions.create(temperature=0, prediction=prediction, **ask)
        for mode in ("auto", "always")
    )
    assert judged.choices[0].message.content == always.choices[0].message.content == reference
    accepted = (
        r.usage.completion_tokens_details.accepted_prediction_tokens for r in (judged, always)
    )
    judged_accepted, always_accepted = accepted
    assert 0 < judged_accepted < always_accepted


def test_a_prediction_of_another_type_is_refused(servers) -> None:
    response = servers["always"].http.post(
        "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "hi"}],
            "prediction": {"type": "image", "content": "x"},
        },
    )
    assert response.status_code == 400 and "prediction" in response.text


def test_a_draft_model_answers_as_without_and_a_foreign_or_sliding_one_exits_78(
    servers, tiny_model: Path, tmp_path: Path, default_model_dir: Path, serve
) -> None:
    drafted = serve(
        "--model", str(tiny_model), "--draft-model", str(tiny_model), "--speculate", "always"
    )
    drafted.wait()
    assert chat(drafted, stream=True) == chat(servers["none"], stream=True)
    story: Any = {"messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 24}
    answers = [
        server.http.post("/v1/chat/completions", json={**story, "temperature": 0}).json()
        for server in (drafted, servers["none"])
    ]
    assert answers[0]["choices"] == answers[1]["choices"]
    details = answers[0]["usage"]["completion_tokens_details"]
    assert details["accepted_prediction_tokens"] > 0  # the model as its own draft model
    think = build_thinking_model(tmp_path / "think", default_model_dir)  # tokens of its own
    foreign = serve("--model", str(tiny_model), "--draft-model", str(think))
    assert foreign.exit_code() == 78
    assert "tokenizer is not the model's" in foreign.output()
    sliding = Path(shutil.copytree(tiny_model, tmp_path / "sliding"))  # the same tokenizer
    config = json.loads((sliding / "config.json").read_text())
    layers = config["num_hidden_layers"]
    kinds = ["sliding_attention"] * (layers - 1) + ["full_attention"]  # mlx-lm wants one full
    config |= {"layer_types": kinds, "sliding_window": 16}
    (sliding / "config.json").write_text(json.dumps(config))
    args = ("--model", str(tiny_model), "--draft-model", str(sliding), "--speculate", "always")
    rolling = serve(*args)
    assert rolling.exit_code() == 78
    assert "whose cache cannot be rolled back" in rolling.output()


def test_a_thinking_answer_verified_several_tokens_a_step_splits_as_alone(
    tmp_path: Path, default_model_dir: Path, serve
) -> None:
    model = build_thinking_model(tmp_path / "think", default_model_dir)
    server = serve("--model", str(model), "--served-model-name", "think", "--speculate", "always")
    server.wait()
    whole = "<think>" + THINKING + "</think>" + ANSWER
    for stream in (False, True):
        body = {
            "model": "think",
            "messages": [{"role": "user", "content": "Where?"}],
            "max_tokens": 24,
            "temperature": 0,
            "prediction": {"type": "content", "content": whole},
            "stream": stream,
        }
        if not stream:
            reply = server.http.post("/v1/chat/completions", json=body).json()
            message = reply["choices"][0]["message"]
            thinking, text = message["reasoning_content"], message["content"]
            usage = reply["usage"]
        else:
            client = server.client()
            chunks = list(
                client.chat.completions.create(stream_options={"include_usage": True}, **body)
            )
            deltas = [c.choices[0].delta for c in chunks if c.choices]
            thinking = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
            text = "".join(d.content or "" for d in deltas)
            usage = chunks[-1].usage.model_dump()
        assert (thinking, text) == (THINKING, ANSWER)
        assert usage["completion_tokens_details"]["accepted_prediction_tokens"] > 0


def test_a_tool_call_verified_several_tokens_a_step_is_parsed_as_alone(
    tmp_path: Path, default_model_dir: Path, serve
) -> None:
    model = build_scripted_model(tmp_path / "tools", default_model_dir)
    server = serve("--model", str(model), "--served-model-name", "tools", "--speculate", "always")
    server.wait()
    weather = function_tool("get_weather", "The weather in a city.", {"city": {"type": "string"}})
    reply = server.client().chat.completions.create(
        model="tools",
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[weather],
        temperature=0,
        max_tokens=32,
        prediction={"type": "content", "content": TOOL_SCRIPT},
    )
    (call,) = reply.choices[0].message.tool_calls
    assert reply.choices[0].finish_reason == "tool_calls" and not reply.choices[0].message.content
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "get_weather",
        {"city": "Paris"},
    )
    assert reply.usage.completion_tokens == 11  # the script's tokens, as without a prediction
    assert reply.usage.completion_tokens_details.accepted_prediction_tokens > 0

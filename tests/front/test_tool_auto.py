"""`tool_choice: "auto"` end to end: a scripted tiny model (tests/tinymodel.py) whose greedy
answer is a tool call in LFM2's format, `<|tool_call_start|>[get_weather(city="Paris")]
<|tool_call_end|>`, which mlx-lm recognises from its chat template (the `pythonic` parser).
Through the official `openai` client, the call comes back as OpenAI `tool_calls`, whole and
streamed; with `tool_choice: "none"` the same text is plain content; and a second turn, with
the call and the tool's answer in the history, goes through the template. A call cut short
by max_tokens stays text.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from tests.conftest import Server, function_tool
from tests.tinymodel import TOOL_SCRIPT, build_scripted_model

MODEL = "scripted"
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOLS = [function_tool("get_weather", "The weather in a city.", {"city": {"type": "string"}})]


@pytest.fixture(scope="module")
def scripted_model(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> Path:
    return build_scripted_model(tmp_path_factory.mktemp("scripted") / "scripted", default_model_dir)


@pytest.fixture(scope="module")
def server(scripted_model: Path) -> Iterator[Server]:
    server = Server(["--model", str(scripted_model), "--served-model-name", MODEL])
    server.wait()
    yield server
    server.stop()


def ask(server: Server, **extra: object):
    extra = {"temperature": 0, "max_tokens": 32, **extra}
    return server.client().chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, **extra)


def test_auto_returns_the_models_call_as_tool_calls(server: Server) -> None:
    reply = ask(server)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert not choice.message.content
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert reply.usage.completion_tokens == 11  # the script's tokens: markers are one each


def test_auto_streams_the_call_as_deltas(server: Server) -> None:
    calls: dict[int, dict] = {}
    content, finishes = "", []
    for chunk in ask(server, stream=True):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            finishes.append(choice.finish_reason)
            for part in choice.delta.tool_calls or []:
                if part.index not in calls:  # a call's first part: its id, type and name
                    assert part.id and part.id.startswith("call_")
                    assert part.type == "function" and part.function.name
                    calls[part.index] = {"id": part.id, "name": part.function.name, "args": ""}
                elif part.id is not None:
                    assert part.id == calls[part.index]["id"]
                calls[part.index]["args"] += part.function.arguments or ""
    assert content == ""
    assert [f for f in finishes if f] == ["tool_calls"] and finishes[-1] == "tool_calls"
    assert list(calls) == [0]
    assert calls[0]["name"] == "get_weather"
    assert json.loads(calls[0]["args"]) == {"city": "Paris"}


def test_none_leaves_the_text_as_content(server: Server) -> None:
    choice = ask(server, tool_choice="none").choices[0]
    assert choice.finish_reason == "stop"
    assert not choice.message.tool_calls
    assert choice.message.content == TOOL_SCRIPT


def test_a_call_cut_short_stays_content(server: Server) -> None:
    choice = ask(server, max_tokens=5).choices[0]
    assert choice.finish_reason == "length"
    assert not choice.message.tool_calls
    assert choice.message.content == "<|tool_call_start|>[get_weather"


def test_a_second_turn_renders_the_call_and_its_answer(server: Server, scripted_model) -> None:
    first = ask(server).choices[0].message.tool_calls[0]
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": first.id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": first.function.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": first.id, "content": "Sunny, 21 °C."},
    ]
    reply = server.client().chat.completions.create(
        model=MODEL, messages=history, tools=TOOLS, temperature=0, max_tokens=32
    )
    # The prompt is the template's rendering of the whole history, the call included.
    templated = [
        *ASK,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": first.id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": first.id, "content": "Sunny, 21 °C."},
    ]
    tokenizer = AutoTokenizer.from_pretrained(str(scripted_model))
    text = tokenizer.apply_chat_template(
        templated, tools=TOOLS, add_generation_prompt=True, tokenize=False
    )
    assert '[get_weather(city="Paris")]' in text and "Sunny, 21 °C." in text
    assert reply.usage.prompt_tokens == len(tokenizer.encode(text, add_special_tokens=False))
    assert reply.choices[0].finish_reason == "tool_calls"  # the script, once more

"""Structured outputs and forced tool calls on the real default model, through the official
`openai` client: `parse()` with a nested Pydantic model returns a parsed object for every
prompt (10 of 10, together in one batch, and streamed), and a tool loop with
`tool_choice="required"` gets schema-valid arguments every time."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from enum import StrEnum

from pydantic import BaseModel, Field

from tests.conftest import function_tool

TOPICS = [
    "Paris",
    "the Nile",
    "Mount Fuji",
    "Jupiter",
    "the Moon",
    "Rome",
    "the Amazon",
    "Everest",
    "London",
    "Mars",
]


class Kind(StrEnum):
    city = "city"
    river = "river"
    mountain = "mountain"
    planet = "planet"
    other = "other"


class Fact(BaseModel):
    label: str = Field(max_length=40)
    kind: Kind


class Card(BaseModel):
    """Strings are bounded: a 135M model can ramble inside a string to its token limit."""

    subject: str = Field(max_length=40)
    kind: Kind
    facts: list[Fact] = Field(max_length=2)
    note: str | None = Field(max_length=40)


CITY = {"type": "string", "maxLength": 30}
TOOLS = [
    function_tool(
        "get_weather",
        "The weather in a city.",
        {"city": CITY, "unit": {"enum": ["c", "f"]}},
        additionalProperties=False,
    ),
    function_tool(
        "get_time", "The local time in a city.", {"city": CITY}, additionalProperties=False
    ),
]


def ask(topic: str) -> list[dict]:
    return [{"role": "user", "content": f"Describe {topic} as a short JSON card."}]


def test_parse_returns_an_object_for_every_prompt(default_server) -> None:
    client = default_server.client()

    def parse(topic: str) -> Card | None:
        reply = client.chat.completions.parse(
            model="smol", messages=ask(topic), response_format=Card, max_tokens=160, temperature=0
        )
        return reply.choices[0].message.parsed

    with ThreadPoolExecutor(10) as pool:
        cards = list(pool.map(parse, TOPICS))
    assert all(isinstance(card, Card) for card in cards), cards
    with client.chat.completions.stream(
        model="smol", messages=ask("Paris"), response_format=Card, max_tokens=160, temperature=0
    ) as stream:
        streamed = stream.get_final_completion().choices[0].message.parsed
    assert streamed == cards[0]


def test_a_required_tool_loop_gets_valid_arguments(default_server) -> None:
    client = default_server.client()
    questions = [
        "What is the weather in Paris?",
        "What time is it in Tokyo?",
        "Is it raining in London?",
        "Weather in Rome, please.",
    ]

    def call(messages: list[dict], **extra):
        return client.chat.completions.create(
            model="smol",
            messages=messages,
            tools=TOOLS,
            tool_choice="required",
            max_tokens=60,
            temperature=0,
            **extra,
        )

    def opening(question: str):
        messages = [{"role": "user", "content": question}]
        return messages, call(messages)

    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(opening, questions))
    for _, reply in replies:
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        for tool_call in choice.message.tool_calls:
            arguments = json.loads(tool_call.function.arguments)
            if tool_call.function.name == "get_weather":
                assert set(arguments) == {"city", "unit"} and arguments["unit"] in ("c", "f")
            else:
                assert tool_call.function.name == "get_time" and set(arguments) == {"city"}
    messages, reply = replies[0]
    streamed = call(messages, stream=True)
    calls: dict[int, dict] = {}
    for chunk in streamed:
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(delta.index, {"name": "", "arguments": ""})
                call["name"] += delta.function.name or ""
                call["arguments"] += delta.function.arguments or ""
    whole = [
        {"name": c.function.name, "arguments": c.function.arguments}
        for c in reply.choices[0].message.tool_calls
    ]
    assert list(calls.values()) == whole
    first = reply.choices[0].message.tool_calls[0]
    messages += [
        {"role": "assistant", "tool_calls": [first.model_dump()]},
        {"role": "tool", "tool_call_id": first.id, "content": "Sunny, 21 degrees."},
    ]
    final = client.chat.completions.create(
        model="smol", messages=messages, tools=TOOLS, max_tokens=20, temperature=0
    )
    assert final.choices[0].message.content

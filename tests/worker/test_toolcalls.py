"""A forced list of tool calls streams call by call, its arguments as they come: fed in any
pieces, the deltas reassemble to each call's own text."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from steward.worker.toolcalls import ToolCalls

CALLS = [
    {"name": "get_weather", "arguments": {"city": 'Paris "}, ]', "days": [1, 2], "x": None}},
    {"name": "get_time", "arguments": {"city": "K\\u00f8ge \\\\ {", "nested": {"a": {}}}},
]


def reassembled(calls: ToolCalls, text: str, pieces: list[int]) -> tuple[list[dict], int]:
    """Each call's name and arguments as a client joins the deltas, and how many deltas."""
    found: dict[int, dict] = {}
    deltas = 0
    cuts = [0, *sorted(pieces), len(text)]
    for start, end in itertools.pairwise(cuts):
        content, delta = calls.feed(text[start:end])
        assert content == ""
        deltas += len(delta)
        for d in delta:
            call = found.setdefault(d.index, {"name": "", "arguments": ""})
            call["name"] += d.name or ""
            call["arguments"] += d.arguments
    assert calls.finish() == ("", [])
    return [found[i] for i in sorted(found)], deltas


@pytest.mark.parametrize("separators", [(",", ":"), (", ", ": ")])
@pytest.mark.parametrize("seed", range(6))
def test_a_list_streams_back_to_its_calls(separators: tuple[str, str], seed: int) -> None:
    text = json.dumps(CALLS, separators=separators)
    pieces = random.Random(seed).sample(range(1, len(text)), k=seed * 7)
    calls = ToolCalls("list")
    found, _ = reassembled(calls, text, pieces)
    assert [c["name"] for c in found] == [c["name"] for c in CALLS]
    assert [json.loads(c["arguments"]) for c in found] == [c["arguments"] for c in CALLS]
    assert [c["arguments"] for c in found] == [
        json.dumps(c["arguments"], separators=separators) for c in CALLS
    ]  # the model's own text, as OpenAI's API sends it
    assert calls.made and calls.count == 2


def test_arguments_come_as_they_are_written() -> None:
    text = json.dumps(CALLS)
    middle = text.index("days")  # inside the first call's arguments
    calls = ToolCalls("list")
    _, first = calls.feed(text[:middle])
    assert first and first[0].name == "get_weather"
    assert "".join(d.arguments for d in first) == text[text.index('{"city"') : middle]
    _, rest = calls.feed(text[middle:])
    assert [d.name for d in rest if d.name] == ["get_time"]


def test_arguments_before_the_name_wait_for_it() -> None:
    text = '[{"arguments": {"a": [1, {"b": "}"}]}, "name": "f"}]'
    found, deltas = reassembled(ToolCalls("list"), text, [5, 20, 30])
    assert found == [{"name": "f", "arguments": '{"a": [1, {"b": "}"}]}'}] and deltas == 1


def test_a_list_cut_before_any_call_stays_content() -> None:
    calls = ToolCalls("list")
    assert calls.feed('[{"na') == ("", [])
    assert calls.finish() == ('[{"na', []) and not calls.made

"""A forced list of tool calls streams call by call, its arguments as they come: fed in any
pieces, the deltas reassemble to each call's own text."""

from __future__ import annotations

import itertools
import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from steward.worker.answer import Answer
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


def test_a_list_cut_before_any_call_is_no_content() -> None:
    """A forced answer's text is the grammar's JSON, never content: cut by max_tokens before
    its first call's name is whole, it is no call and no text (not `[{"na`)."""
    calls = ToolCalls("list")
    assert calls.feed('[{"na') == ("", [])
    assert calls.finish() == ("", []) and not calls.made
    answer = Answer(None, [], ToolCalls("list"))
    assert answer.feed_text('[{"name":"get', "length") == ("", "", [], "length")


def json_calls(body: str, tools: object) -> object:
    """A parser for calls written as JSON between the markers (as Qwen's format is)."""
    return json.loads(body)


@pytest.mark.parametrize("parallel", [True, False])
def test_without_parallel_calls_only_the_first_comes(parallel: bool) -> None:
    """A request that allows no parallel calls gets the first; the model may still write
    more (in its own format, which no grammar bounds): they are dropped, and the answer is
    still a call."""
    written = "Looking." + "".join(f"<tool_call>{json.dumps(c)}</tool_call>" for c in CALLS)
    markers = ("<tool_call>", "</tool_call>")
    auto = ToolCalls("auto", markers=markers, parser=json_calls, parallel=parallel)
    text, _, found, finish = Answer(None, [], auto).feed_text(written, "stop")
    assert text == "Looking." and finish == "tool_calls"
    assert [c.name for c in found] == ["get_weather", "get_time"][: 2 if parallel else 1]
    listed = ToolCalls("list", parallel=parallel)
    found, _ = reassembled(listed, json.dumps(CALLS), [30, 90])
    assert [c["name"] for c in found] == ["get_weather", "get_time"][: 2 if parallel else 1]
    assert listed.made and listed.count == 2


def test_only_a_call_s_own_keys_name_it() -> None:
    """A "name" or "arguments" key deeper than a call's own, an answer that is no list, and
    a call without a name (none the grammar lets through): no call, nothing of one leaks."""
    text = '[{"x": {"name": "no", "arguments": 1}, "name": "f", "arguments": {"name": "g"}}]'
    assert reassembled(ToolCalls("list"), text, [9, 17])[0] == [
        {"name": "f", "arguments": '{"name": "g"}'}
    ]
    calls = ToolCalls("list")
    assert calls.feed('{"name": "f", "arguments": {}}') == ("", []) and not calls.made
    nameless = '[{"arguments": {"a": 1}}, {"name": "g", "arguments": {"b": 2}}]'
    assert reassembled(ToolCalls("list"), nameless, [])[0] == [
        {"name": "g", "arguments": '{"b": 2}'}
    ]


@pytest.mark.parametrize("mode", ["list", "named"])
def test_stop_strings_do_not_cut_a_forced_call(mode: str) -> None:
    """A forced call's JSON is no text to cut: a stop string inside it would leave
    arguments that break the schema under `finish_reason: tool_calls`."""
    text = '[{"name": "f", "arguments": {"a": "STOP"}}]' if mode == "list" else '{"a": "STOP"}'
    answer = Answer(None, ["STOP"], ToolCalls(mode, "f"))  # fed text, it needs no detokenizer
    _, _, calls, finish = answer.feed_text(text, "stop")
    assert finish == "tool_calls"
    assert json.loads("".join(c.arguments for c in calls)) == {"a": "STOP"}
    auto = Answer(None, ["STOP"], None)
    assert auto.feed_text("a STOP b", None) == ("a ", "", [], "stop")


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(
    calls=st.lists(st.tuples(st.text(min_size=1), JSON, st.booleans()), min_size=1, max_size=3),
    spaced=st.booleans(),
    ascii_only=st.booleans(),
    cuts=st.lists(st.integers(min_value=1), max_size=12),
)
def test_any_list_of_calls_in_any_pieces(calls, spaced, ascii_only, cuts) -> None:
    """Arguments of any JSON type, keys in either order, escapes, any split: each call's
    deltas join to its name and its arguments' own text."""
    comma, colon = (", ", ": ") if spaced else (",", ":")
    raw = [
        json.dumps(args, separators=(comma, colon), ensure_ascii=ascii_only) for _, args, _ in calls
    ]
    items = []
    for (name, _, first), arguments in zip(calls, raw, strict=True):
        fields = [f'"name"{colon}{json.dumps(name)}', f'"arguments"{colon}{arguments}']
        items.append("{" + comma.join(fields if first else fields[::-1]) + "}")
    text = "[" + comma.join(items) + "]"
    found, _ = reassembled(ToolCalls("list"), text, sorted({c % len(text) or 1 for c in cuts}))
    assert found == [
        {"name": name, "arguments": a} for (name, _, _), a in zip(calls, raw, strict=True)
    ]

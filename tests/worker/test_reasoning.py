"""A thinking model's answer split in the worker: thinking to `Token.reasoning`, the answer
to `Token.text`, the markers in neither; stop strings and tool calls only in the answer;
the thinking state restored on resume and read from a prompt that opens a block; thinking
turned off through the template's `enable_thinking`."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from steward.wire.protocol import Done, Generate
from steward.worker.answer import Answer
from steward.worker.injection import Injector
from steward.worker.reasoning import ReasoningSplit
from steward.worker.toolcalls import ToolCalls
from tests.tinymodel import ANSWER, THINKING, build_thinking_model

HELLO = [{"role": "user", "content": "hello"}]
MARKERS = ("<think>", "</think>")


def engine_for(model_dir: Path):
    from steward.worker.backend import Backend
    from steward.worker.engine import Engine

    return Engine(Backend(model_dir, Injector([], 1)), 8, 1 << 30)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path):
    out = tmp_path_factory.mktemp("think") / "m"
    return engine_for(build_thinking_model(out, default_model_dir))


@pytest.fixture(scope="module")
def opening(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path):
    """Its template opens the thinking block in the generation prompt."""
    out = tmp_path_factory.mktemp("opens") / "m"
    return engine_for(build_thinking_model(out, default_model_dir, opens=True))


@dataclass
class Heard:
    """What one request got: its token ids, answer text, thinking text and `Done`."""

    ids: list[int] = field(default_factory=list)
    text: str = ""
    reasoning: str = ""
    done: Done | None = None


def run(engine, *reqs: Generate) -> dict[int, Heard]:
    """The requests in one batch (one alone runs alone)."""
    heard = {req.id: Heard() for req in reqs}
    for req in reqs:
        engine.add(req)
    while engine.busy:
        step = engine.step()
        for token in step.tokens:
            got = heard[token.id]
            got.ids += [token.token] if token.token >= 0 else []
            got.text += token.text
            got.reasoning += token.reasoning
        for done in step.done:
            heard[done.id].done = done
    return heard


def chat(req_id: int, **more) -> Generate:
    return Generate(id=req_id, seq=req_id, attempt=1, max_tokens=20, messages=HELLO, **more)


def think_tokens(engine) -> int:
    """`<think>`, the thinking's tokens, `</think>`."""
    return 2 + len(engine.backend.tokenizer.encode(THINKING, add_special_tokens=False))


def test_thinking_and_answer_are_split_the_markers_in_neither(engine) -> None:
    assert engine.backend.thinking  # what `Ready.thinking` says
    alone = run(engine, chat(1))[1]
    assert (alone.reasoning, alone.text) == (THINKING, ANSWER)
    assert alone.done.finish_reason == "stop"
    assert alone.done.reasoning_tokens == think_tokens(engine)
    assert alone.done.completion_tokens == len(alone.ids) == think_tokens(engine) + 2
    batched = run(engine, chat(2), chat(3, temperature=1.0, seed=5))
    for got in batched.values():
        assert (got.reasoning, got.text, got.ids) == (alone.reasoning, alone.text, alone.ids)
        assert got.done.reasoning_tokens == alone.done.reasoning_tokens


def test_a_model_without_thinking_marks_none(tiny_model: Path) -> None:
    from steward.worker.backend import Backend

    backend = Backend(tiny_model, Injector([], 1))
    assert not backend.thinking
    assert backend.reasoning_split(chat(4), [1, 2, 3]) is None


def test_a_raw_completion_is_not_split(engine) -> None:
    """A completion prompt is the model's own text, markers and all."""
    prompt = "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    got = run(engine, Generate(id=5, seq=5, attempt=1, max_tokens=20, prompt=prompt))[5]
    assert got.text == "<think>" + THINKING + "</think>" + ANSWER and got.reasoning == ""
    assert got.done.reasoning_tokens == 0


def test_stop_strings_apply_to_the_answer_only(engine) -> None:
    in_thinking = run(engine, chat(6, stop=[" me"]))[6]
    assert (in_thinking.reasoning, in_thinking.text) == (THINKING, ANSWER)
    in_answer = run(engine, chat(7, stop=[" indeed"]))[7]
    assert (in_answer.reasoning, in_answer.text) == (THINKING, " Paris")
    assert in_answer.done.finish_reason == "stop"
    assert in_answer.done.stop_sequence == " indeed"  # named: Messages' `stop_sequence`
    assert in_thinking.done.stop_sequence == ""  # the model's own end


def test_tool_calls_are_found_in_the_answer_only() -> None:
    calls = ToolCalls(
        "auto", markers=("<tool_call>", "</tool_call>"), parser=lambda body, _: json.loads(body)
    )
    answer = Answer(None, [], calls, ReasoningSplit(*MARKERS, inside=False))
    segments = [
        '<think>Maybe <tool_call>{"name": "f"}</tool_call>?',
        "</think>",
        '<tool_call>{"name": "g", "arguments": {}}</tool_call>',
    ]
    pieces = [answer.feed_text(s, None) for s in segments] + [answer.feed_text("", "stop")]
    assert "".join(p.reasoning for p in pieces) == 'Maybe <tool_call>{"name": "f"}</tool_call>?'
    assert [c.name for p in pieces for c in p.calls] == ["g"]
    assert pieces[-1].finish == "tool_calls" and answer.reasoning_tokens == 2


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("cut", [1, 2, 4])
def test_a_resume_mid_thinking_goes_on_thinking(engine, cut: int, batched: bool) -> None:
    """After a fault the client has the first `cut` tokens (inside the block; 4: all of it
    but `</think>`): the rest of the split comes as it would have, and the usage counts
    every thinking token once."""
    whole = run(engine, chat(8))[8]
    assert cut < think_tokens(engine)
    sent = engine.backend.tokenizer.decode(whole.ids[1:cut])  # the thinking after `<think>`
    beside = [chat(10)] if batched else []
    resumed = run(engine, chat(9, resume=whole.ids[:cut]), *beside)[9]
    assert resumed.ids == whole.ids[cut:]
    assert (sent + resumed.reasoning, resumed.text) == (THINKING, ANSWER)
    assert resumed.done.reasoning_tokens == whole.done.reasoning_tokens


def test_a_prompt_that_opens_the_block_starts_in_thinking(opening) -> None:
    got = run(opening, chat(12))[12]
    assert got.reasoning.strip() == THINKING.strip() and got.text == ANSWER
    assert got.done.reasoning_tokens == think_tokens(opening) - 1  # its `<think>` is the prompt's


def test_thinking_turned_off_through_the_template(engine, opening) -> None:
    for model in (engine, opening):
        prompt = model.backend.tokenizer.decode(model.backend.encode(chat(13, thinking=False)))
        assert prompt.endswith("<think></think>")  # the template closed the block itself
        off = run(model, chat(13, thinking=False))[13]
        assert off.reasoning == "" and off.text.strip() == ANSWER.strip()
        assert off.done.reasoning_tokens == 0
        on = run(model, chat(14, thinking=True))[14]
        assert on.reasoning.strip() == THINKING.strip() and on.text == ANSWER


@given(st.lists(st.integers(0, 60), max_size=6))
def test_any_split_of_the_text_splits_alike(cuts: list[int]) -> None:
    """However the detokenizer cuts the text (a marker in pieces, or with text on either
    side of it), the thinking and the answer join up the same."""
    text = "<think>a <b</think>> c<think>d</think>e<"
    bounds = sorted({0, len(text), *(min(c, len(text)) for c in cuts)})
    split = ReasoningSplit(*MARKERS, inside=False)
    parts = [split.feed(text[a:b]) for a, b in itertools.pairwise(bounds)]
    parts.append(split.flush())
    assert "".join(p[0] for p in parts) == "a <bd"
    assert "".join(p[1] for p in parts) == "> ce<"

"""The agent-facing API on the tiny model through the official `openai` client: logprobs,
penalties, `logit_bias`, top_k/min_p, `n`, grammar-constrained answers, the rule for
parameters; each inside a batch and across an injected fault."""

from __future__ import annotations

import json
import math
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
from transformers import AutoTokenizer

ASK = [{"role": "user", "content": "Tell me about lighthouses."}]
SCHEMA = {
    "type": "object",
    "properties": {
        "kind": {"enum": ["tower", "ship", "rock"]},
        "lit": {"type": "boolean"},
        "names": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 2},
    },
    "required": ["kind", "lit", "names"],
    "additionalProperties": False,
}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "light", "schema": SCHEMA}}


@pytest.fixture(scope="module")
def server(tiny_model: Path):
    from tests.conftest import Server

    server = Server(["--model", str(tiny_model)])
    server.wait()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return server.client()


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path):
    return AutoTokenizer.from_pretrained(str(tiny_model))


def chat(client: openai.OpenAI, **extra):
    ask = {"model": "default", "messages": ASK, "max_tokens": 8, "temperature": 0, **extra}
    return client.chat.completions.create(**ask)


def tokens(reply) -> list[str]:
    return [entry.token for entry in reply.choices[0].logprobs.content]


def test_logprobs_are_a_distribution_that_holds_the_greedy_choice(client) -> None:
    reply = chat(client, logprobs=True, top_logprobs=5)
    entries = reply.choices[0].logprobs.content
    assert len(entries) == reply.usage.completion_tokens == 8
    # (the detokenizer drops the answer's leading space; the token keeps it)
    assert "".join(e.token for e in entries).lstrip() == reply.choices[0].message.content
    for entry in entries:
        assert len(entry.top_logprobs) == 5
        assert sum(math.exp(top.logprob) for top in entry.top_logprobs) <= 1 + 1e-4
        assert entry.top_logprobs[0].token == entry.token  # greedy takes the most likely
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)
        assert bytes(entry.bytes).decode() == entry.token
        ranked = [top.logprob for top in entry.top_logprobs]
        assert ranked == sorted(ranked, reverse=True)


def test_streamed_chunks_carry_their_logprobs(client) -> None:
    whole = chat(client, logprobs=True, top_logprobs=2)
    streamed = chat(client, logprobs=True, top_logprobs=2, stream=True)
    entries = [
        entry
        for chunk in streamed
        for choice in chunk.choices
        for entry in (choice.logprobs.content if choice.logprobs else [])
    ]
    assert [e.token for e in entries] == tokens(whole)
    assert [e.logprob for e in entries] == pytest.approx(
        [e.logprob for e in whole.choices[0].logprobs.content]
    )


def test_completions_logprobs_in_the_legacy_shape(client) -> None:
    reply = client.completions.create(
        model="default", prompt="Once upon", max_tokens=5, temperature=0, logprobs=3
    )
    logprobs = reply.choices[0].logprobs
    assert "".join(logprobs.tokens).lstrip() == reply.choices[0].text.lstrip()
    assert logprobs.text_offset == [sum(len(t) for t in logprobs.tokens[:i]) for i in range(5)]
    for token, value, top in zip(
        logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True
    ):
        assert (
            len(top) == 3 and max(top, key=top.get) == token and top[token] == pytest.approx(value)
        )


def test_logit_bias_bans_and_forces_tokens(client, tokenizer) -> None:
    plain = chat(client, logprobs=True)
    first = tokenizer.convert_tokens_to_ids(tokenizer.tokenize(tokens(plain)[0]))[0]
    banned = chat(client, logprobs=True, logit_bias={str(first): -100})
    assert tokens(banned)[0] != tokens(plain)[0]
    assert tokens(plain)[0] not in tokens(banned)
    forced_id = tokenizer.convert_tokens_to_ids("Ġlighthouse")
    forced = chat(client, logit_bias={str(forced_id): 100})
    assert forced.choices[0].message.content == (" lighthouse" * 8).lstrip()


@pytest.mark.parametrize(
    "penalty", [{"frequency_penalty": 2.0}, {"presence_penalty": 2.0}, {"repetition_penalty": 3.0}]
)
def test_penalties_cut_repetition(client, penalty) -> None:
    def repeats(reply) -> int:
        return sum(n - 1 for n in Counter(tokens(reply)).values())

    plain = chat(client, logprobs=True, max_tokens=24)
    assert repeats(plain) > 0  # the tiny model repeats itself: something to cut
    penalised = chat(client, logprobs=True, max_tokens=24, extra_body=penalty)
    assert repeats(penalised) < repeats(plain)


def test_the_penalty_range_keeps_logprobs_numbers(client) -> None:
    """The fuzzer's find: `repetition_penalty` 5e-324 divided a logit to infinity and the
    logprobs to NaN, which JSON cannot carry (a 500). The range is 0.1-10 now, and at its
    ends every log-probability is a number."""
    for penalty in (5e-324, 0.09, 10.5):
        with pytest.raises(openai.BadRequestError, match="repetition_penalty"):
            chat(client, extra_body={"repetition_penalty": penalty})
    for penalty in (0.1, 10.0):
        reply = chat(
            client, logprobs=True, max_tokens=12, extra_body={"repetition_penalty": penalty}
        )
        assert all(math.isfinite(e.logprob) for e in reply.choices[0].logprobs.content)


def test_top_k_one_is_greedy_at_any_temperature(client) -> None:
    greedy = chat(client).choices[0].message.content
    for seed in (1, 2):
        hot = chat(client, temperature=1.5, seed=seed, extra_body={"top_k": 1})
        assert hot.choices[0].message.content == greedy
    assert (
        chat(client, temperature=1.5, seed=3, extra_body={"min_p": 1.0}).choices[0].message.content
        == greedy
    )


def test_n_choices_share_the_prompt_and_count_usage_once(client) -> None:
    one = chat(client)
    reply = chat(client, n=3)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert {c.message.content for c in reply.choices} == {one.choices[0].message.content}
    assert reply.usage.prompt_tokens == one.usage.prompt_tokens
    assert reply.usage.completion_tokens == 3 * one.usage.completion_tokens
    seeded = chat(client, n=3, temperature=1.0, seed=11, stream=True)
    texts = ["", "", ""]
    for chunk in seeded:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    assert len(set(texts)) == 3  # each choice its own seed
    again = chat(client, n=3, temperature=1.0, seed=11)
    assert [c.message.content for c in again.choices] == texts


def test_a_json_schema_is_enforced_streamed_or_not(client) -> None:
    reply = chat(client, response_format=JSON_SCHEMA, max_tokens=60)
    answer = json.loads(reply.choices[0].message.content)
    assert answer["kind"] in ("tower", "ship", "rock") and isinstance(answer["lit"], bool)
    streamed = chat(client, response_format=JSON_SCHEMA, max_tokens=60, stream=True)
    assert (
        "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
        == reply.choices[0].message.content
    )
    anything = chat(
        client, response_format={"type": "json_object"}, max_tokens=200, extra_body={"top_k": 0}
    )
    if anything.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(anything.choices[0].message.content), dict)


def test_eight_together_answer_as_each_alone(client) -> None:
    asks = [
        {"logprobs": True, "top_logprobs": 3},
        {"response_format": JSON_SCHEMA, "max_tokens": 40},
        {"extra_body": {"frequency_penalty": 1.5}},
        {"extra_body": {"repetition_penalty": 2.0}},
        {"logit_bias": {"2": -100, "28": 5}},
        {"temperature": 1.0, "seed": 5, "extra_body": {"top_k": 20, "min_p": 0.05}},
        {"response_format": JSON_SCHEMA, "max_tokens": 40, "logprobs": True},
        {"n": 2, "extra_body": {"presence_penalty": 1.0}},
    ]

    def answer(ask: dict) -> list:
        reply = chat(client, **{k: (dict(v) if isinstance(v, dict) else v) for k, v in ask.items()})
        return [(c.message.content, c.logprobs and tokens(reply)) for c in reply.choices]

    alone = [answer(ask) for ask in asks]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(answer, asks))
    assert together == alone


def test_unsupported_parameters_are_refused_and_unknown_ones_named(client) -> None:
    raw = client.completions.with_raw_response.create(
        model="default", prompt="hi", max_tokens=2, extra_body={"max_token": 3, "functions": []}
    )
    assert raw.headers["steward-ignored"] == "max_token, functions"  # completions have none
    assert raw.parse().choices[0].finish_reason == "length"
    for extra, named in [({"store": True}, "store"), ({"best_of": 2}, "best_of")]:
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(model="default", prompt="hi", max_tokens=2, extra_body=extra)
        assert named in refused.value.message
    ok = chat(
        client, max_tokens=2, user="u-1", metadata={"team": "a"}, store=False, service_tier="auto"
    )
    assert ok.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError) as refused:
        chat(
            client,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "object", "if": {}}},
            },
        )
    assert "if" in refused.value.message and "not supported" in refused.value.message
    with pytest.raises(openai.BadRequestError, match="max-n"):
        chat(client, n=9)


def test_a_constrained_stream_with_logprobs_resumes_across_a_crash(serve, tiny_model) -> None:
    server = serve("--model", str(tiny_model), "--inject-fault", "decode:crash:nth=1")
    server.wait()
    client = server.client()

    def streamed() -> tuple[str, list[str]]:
        text, entries = "", []
        for chunk in chat(
            client, response_format=JSON_SCHEMA, max_tokens=40, logprobs=True, stream=True
        ):
            for choice in chunk.choices:
                text += choice.delta.content or ""
                entries += [e.token for e in (choice.logprobs.content if choice.logprobs else [])]
        return text, entries

    faulted = streamed()  # the fault strikes at its second token; the stream resumes
    assert server.health().json()["faults"]["total"] == 1
    assert faulted == streamed()
    assert "".join(faulted[1]).lstrip() == faulted[0]
    json.loads(faulted[0])


def test_a_required_call_streams_its_arguments_in_pieces_across_a_crash(serve, tiny_model) -> None:
    """A forced call streams its arguments as they come; the fault strikes at its second
    token (nothing sent yet: replayed), and the deltas join to the unfaulted answer's call.
    (A fault inside the arguments, resumed: `test_engine`.)"""
    server = serve("--model", str(tiny_model), "--inject-fault", "decode:crash:nth=1")
    server.wait()
    client = server.client()
    weather = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["c", "f"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    }
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": weather}}]

    def streamed() -> tuple[list[tuple[str, str]], int, str | None]:
        calls: dict[int, list[str]] = {}
        deltas, finish = 0, None
        for chunk in chat(client, tools=tools, tool_choice="required", max_tokens=60, stream=True):
            for choice in chunk.choices:
                for delta in choice.delta.tool_calls or []:
                    call = calls.setdefault(delta.index, ["", ""])
                    call[0] += delta.function.name or ""
                    call[1] += delta.function.arguments or ""
                    deltas += 1
                finish = choice.finish_reason or finish
        return [(name, arguments) for name, arguments in calls.values()], deltas, finish

    faulted, deltas, finish = streamed()
    assert server.health().json()["faults"]["total"] == 1
    assert (faulted, finish) == streamed()[::2]
    assert finish == "tool_calls" and deltas > len(faulted)  # arguments in pieces
    for name, arguments in faulted:
        assert name == "get_weather" and set(json.loads(arguments)) == {"city", "unit"}


def test_eight_streams_together_resume_across_a_crash_as_each_alone(serve, tiny_model) -> None:
    """Every agent parameter at once, eight streams in one batch, and the worker crashes
    mid-batch (the ninth request's second token): each stream resumes to exactly what it
    got alone, logprobs, schema-bound text and tool-call deltas included."""
    server = serve("--model", str(tiny_model), "--inject-fault", "decode:crash:nth=9")
    server.wait()
    client = server.client(max_retries=0)
    city = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 8}},
        "required": ["city"],
        "additionalProperties": False,
    }
    tools = [
        {"type": "function", "function": {"name": name, "parameters": city}}
        for name in ("get_weather", "get_time")
    ]
    asks = [
        {"logprobs": True, "top_logprobs": 3},
        {"response_format": JSON_SCHEMA, "max_tokens": 40},
        {"extra_body": {"frequency_penalty": 1.5}, "logit_bias": {"2": -100}},
        {"tools": tools, "tool_choice": "required", "max_tokens": 40},
        {"temperature": 1.0, "seed": 5, "extra_body": {"top_k": 20, "min_p": 0.05}},
        {"response_format": JSON_SCHEMA, "max_tokens": 40, "logprobs": True},
        {"n": 2, "extra_body": {"presence_penalty": 1.0, "repetition_penalty": 1.5}},
        {"tools": tools, "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
    ]
    asks[7]["max_tokens"] = 40

    def streamed(ask: dict) -> dict[int, tuple]:
        """Each choice as its deltas join: content, logprob tokens, calls, finish reason."""
        choices: dict[int, list] = {}
        for chunk in chat(client, stream=True, **ask):
            for choice in chunk.choices:
                text, entries, calls, finish = choices.setdefault(choice.index, ["", [], {}, None])
                text += choice.delta.content or ""
                entries += [e.token for e in (choice.logprobs.content if choice.logprobs else [])]
                for delta in choice.delta.tool_calls or []:
                    call = calls.setdefault(delta.index, ["", ""])
                    call[0] += delta.function.name or ""
                    call[1] += delta.function.arguments or ""
                finish = choice.finish_reason or finish
                choices[choice.index] = [text, entries, calls, finish]
        return {
            index: (text, entries, [tuple(call) for call in calls.values()], finish)
            for index, (text, entries, calls, finish) in choices.items()
        }

    alone = [streamed(ask) for ask in asks]  # requests 1-8
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(streamed, asks))  # 9-16: the crash strikes among them
    assert server.health().json()["faults"]["total"] == 1
    assert together == alone
    assert len(alone[6]) == 2 and alone[0][0][1] and alone[5][0][1]
    for i in (3, 7):
        _, _, calls, finish = alone[i][0]
        assert finish == "tool_calls" and calls[0][0] in ("get_weather", "get_time")
        assert set(json.loads(calls[0][1])) == {"city"}

"""End to end on the real default model, through the official `openai` client."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import openai
import pytest
from transformers import AutoTokenizer

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def tokenizer(default_model_dir: Path):
    return AutoTokenizer.from_pretrained(str(default_model_dir))


def test_chat_answers_paris_with_true_usage(default_server, tokenizer) -> None:
    client = default_server.client()
    reply = client.chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=QUESTION, max_tokens=12, temperature=0
    )
    text = reply.choices[0].message.content
    assert "Paris" in text
    assert reply.choices[0].finish_reason == "stop"
    assert reply.model == "SmolLM2-135M-Instruct"
    prompt = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True)["input_ids"]
    assert reply.usage.prompt_tokens == len(prompt)
    assert reply.usage.completion_tokens == len(tokenizer.encode(text))
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_stream_arrives_chunk_by_chunk(default_server) -> None:
    client = default_server.client()
    arrivals, pieces, finish, usage = [], [], None, None
    stream = client.chat.completions.create(
        model="default",
        messages=QUESTION,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                pieces.append(choice.delta.content)
                arrivals.append(time.monotonic())
            finish = choice.finish_reason or finish
    assert "Paris" in "".join(pieces)
    assert len(pieces) >= 4
    assert arrivals[-1] - arrivals[0] > 0.2  # tokens came as generated, not in one burst
    assert finish == "stop"
    assert usage is not None and usage.completion_tokens == len(pieces)


def test_length_stop_and_seed(default_server) -> None:
    client = default_server.client()
    cut = client.chat.completions.create(model="smol", messages=QUESTION, max_tokens=3)
    assert cut.choices[0].finish_reason == "length"
    assert cut.usage.completion_tokens == 3
    stopped = client.chat.completions.create(
        messages=QUESTION, model="smol", max_tokens=12, temperature=0, stop=["Paris"]
    )
    assert stopped.choices[0].finish_reason == "stop"
    assert "Paris" not in stopped.choices[0].message.content
    assert stopped.choices[0].message.content.startswith("The capital")
    sampled = [
        client.chat.completions.create(
            messages=QUESTION, model="smol", max_tokens=4, temperature=1.0, seed=7
        )
        .choices[0]
        .message.content
        for _ in range(2)
    ]
    assert sampled[0] == sampled[1]


def test_text_completion(default_server) -> None:
    reply = default_server.client().completions.create(
        model="SmolLM2-135M-Instruct",
        prompt="The capital of France is",
        max_tokens=3,
        temperature=0,
    )
    assert "Paris" in reply.choices[0].text
    assert reply.usage.prompt_tokens == 5


def test_models_lists_context_length(default_server) -> None:
    models = default_server.http.get("/v1/models").json()["data"]
    assert [m["id"] for m in models] == ["SmolLM2-135M-Instruct", "smol"]
    assert all(m["context_length"] == 8192 for m in models)


def assert_envelope(response: httpx.Response, status: int, kind: str) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["status"] == "error"
    assert body["error"]["type"] == kind
    assert body["error"]["message"]
    retryable = body["error"]["retryable"]
    assert response.headers["x-should-retry"] == ("true" if retryable else "false")
    assert ("retry-after" in response.headers) == retryable
    assert body["request_id"] == response.headers["x-request-id"]
    return body


@pytest.mark.parametrize(
    ("method", "path", "payload", "status", "kind"),
    [
        (
            "POST",
            "/v1/chat/completions",
            {"model": "gpt-4o", "messages": QUESTION},
            404,
            "model_not_found",
        ),
        (
            "POST",
            "/v1/chat/completions",
            {"messages": QUESTION, "temperature": 5},
            400,
            "validation_error",
        ),
        ("POST", "/v1/chat/completions", {"messages": []}, 400, "validation_error"),
        ("POST", "/v1/chat/completions", {"messages": QUESTION, "n": 9}, 400, "validation_error"),
        (
            "POST",
            "/v1/chat/completions",
            {"messages": [{"role": "robot", "content": "x"}]},
            400,
            "validation_error",
        ),
        (
            "POST",
            "/v1/completions",
            {"prompt": "x", "max_tokens": 9000},
            400,
            "context_length_exceeded",
        ),
        (
            "POST",
            "/v1/completions",
            {"prompt": "hello " * 9000, "max_tokens": 1},
            400,
            "context_length_exceeded",
        ),
        ("GET", "/v1/nothing-here", None, 404, "not_found"),
        ("GET", "/v1/chat/completions", None, 405, "method_not_allowed"),
    ],
)
def test_errors_follow_the_envelope(default_server, method, path, payload, status, kind) -> None:
    response = default_server.http.request(method, path, json=payload)
    assert_envelope(response, status, kind)


def test_bad_json_and_request_ids(default_server) -> None:
    response = default_server.http.post(
        "/v1/chat/completions", content=b"{not json", headers={"x-request-id": "client-42"}
    )
    body = assert_envelope(response, 400, "validation_error")
    assert body["request_id"] == "client-42"
    insane = default_server.http.get("/v1/models", headers={"x-request-id": "bad id\x01"})
    assert insane.headers["x-request-id"] != "bad id\x01"
    assert len(insane.headers["x-request-id"]) == 32


def test_body_too_large(default_server) -> None:
    response = default_server.http.post(
        "/v1/completions",
        content=b'{"prompt": "' + b"a" * (33 * 2**20) + b'"}',
        headers={"content-type": "application/json"},
    )
    assert_envelope(response, 413, "request_too_large")


def test_sdk_sees_typed_errors(default_server) -> None:
    client = default_server.client(max_retries=0)
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="llama-70b", messages=QUESTION, max_tokens=2)
    assert caught.value.body["type"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="default", prompt="x", max_tokens=100_000)
    assert caught.value.body["type"] == "context_length_exceeded"

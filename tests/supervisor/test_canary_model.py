"""A healthy model whose greedy answer is its end token at once is served (issue 20): the
canary suppresses end tokens, so it gets its golden tokens from any model, and a client's
request gets the model's own answer, empty."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def eos_model(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> Path:
    from tests.tinymodel import build_eos_model

    return build_eos_model(tmp_path_factory.mktemp("eos") / "eos", default_model_dir)


def test_a_model_that_answers_with_its_end_token_is_served(serve, eos_model: Path) -> None:
    server = serve("--model", str(eos_model))
    health = server.wait("ready")
    assert health["faults"]["total"] == 0 and health["worker"]["generation"] == 1
    reply = server.http.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8},
    )
    assert reply.status_code == 200, reply.text
    (choice,) = reply.json()["choices"]
    assert choice["finish_reason"] == "stop" and choice["message"]["content"] == ""
    assert reply.json()["usage"]["completion_tokens"] == 0
    assert server.health().json()["status"] == "ready"

"""The fault matrix's hang case on the real default model (issue 20): a stall verdict must
come from what the backend measured it needs, not from a fixed bound alone.

`--stall-timeout 3` is below what this model needs on a slow CPU for a first canary or a
replayed prefill. The server still comes up (its first canary is not judged stalled), the
injected hang on request 2 costs exactly one replacement, and request 2 is answered by its
replay, as request 1 was answered: greedy, the same answer.
"""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

CHAT = [{"role": "user", "content": "What is the capital of France?"}]


def test_one_hang_costs_one_replacement_on_the_default_model(
    serve, default_model_dir: Path
) -> None:
    server = serve("--stall-timeout", "3", "--inject-fault", "decode:hang:nth=2")
    server.wait(timeout=300)
    assert server.health().json()["faults"]["total"] == 0, "a healthy first worker was faulted"
    with server.client(max_retries=0, timeout=300) as client:

        def ask(n: int) -> tuple[str | None, str | None]:
            try:
                reply = client.chat.completions.create(
                    model="default", messages=CHAT, max_tokens=4, temperature=0
                )
            except openai.APIError as exc:
                health = server.health().json()
                pytest.fail(f"request {n} failed: {exc}\n{health}\n(whole log: {server.log})")
            return reply.choices[0].message.content, reply.choices[0].finish_reason

        first = ask(1)
        assert first[0] and first[1] in ("stop", "length"), first
        assert server.health().json()["faults"]["total"] == 0, "request 1 was judged stalled"
        second = ask(2)  # hangs at its second token; replayed on the new worker
    assert second == first
    health = server.until(lambda health: health["status"] in ("ready", "degraded"), within=60)
    context = f"{health}\n(whole log: {server.log})"
    assert health["faults"]["total"] == 1, context  # the hang, and nothing else
    assert health["faults"]["last"]["class"] == "stall", context
    assert health["restarts_in_window"] == 1, context
    assert server.http.get("/health/ready").status_code == 200
    assert server.proc.poll() is None

"""The fault matrix's hang case on the real default model (issues 20, 29): a hang is
suspected from what the worker's own steps measured, not from a fixed bound, and the
verdict waits for the ceiling.

On a slow CPU this model's steps take a good part of a second, and its first canary and a
replayed prefill longer: no healthy step may be judged hung (the server comes up, request 1
is answered, nothing counted). The injected hang on request 2 is suspected at the bound its
measured steps set, far below `--stall-timeout` (the ceiling); the spare takes over and
request 2 is answered by its replay, as request 1 was (greedy: the same answer); the hung
worker is counted once, a `stall`, at the ceiling, and costs exactly one restart.
"""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

CHAT = [{"role": "user", "content": "What is the capital of France?"}]


def test_one_hang_costs_one_replacement_on_the_default_model(
    serve, default_model_dir: Path
) -> None:
    server = serve("--stall-timeout", "20", "--inject-fault", "decode:hang:nth=2")
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
    health = server.until(lambda h: h["faults"]["total"] == 1 and not h["suspects"], within=90)
    context = f"{health}\n(whole log: {server.log})"
    assert health["faults"]["total"] == 1, context  # the hang, and nothing else
    assert health["faults"]["last"]["class"] == "stall", context
    assert health["restarts_in_window"] == 1, context
    assert server.http.get("/health/ready").status_code == 200
    assert server.proc.poll() is None

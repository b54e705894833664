"""A fault during a verify step (SPEC §6, §11) is a fault like any other: the worker that
crashed while its step verified a prediction's drafts is replaced, and the stream resumes
from exactly the tokens the client had, to the unfaulted answer."""

from __future__ import annotations

from pathlib import Path

from tests.supervisor.test_resume import assert_whole, stream


def test_a_crash_during_a_verify_step_resumes_exactly(serve, tiny_model: Path) -> None:
    # The second request's tenth token is drawn by a verify step: its prediction is right.
    server = serve(
        "--model",
        str(tiny_model),
        "--speculate",
        "always",
        "--stall-timeout",
        "2",
        "--inject-fault",
        "decode:crash:nth=2@10",
    )
    server.wait()
    reference = stream(server.url, max_tokens=24)
    assert reference["usage"]["completion_tokens"] == 24
    prediction = {"type": "content", "content": reference["text"]}
    faulted = stream(server.url, max_tokens=24, prediction=prediction)
    assert_whole(faulted, reference)
    details = faulted["usage"]["completion_tokens_details"]
    assert details["accepted_prediction_tokens"] > 0  # the resumed attempt's drafts
    health = server.health().json()
    assert health["faults"]["total"] == 1
    assert health["faults"]["last"]["request_id"] is not None

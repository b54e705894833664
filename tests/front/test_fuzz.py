"""Fuzzing the served API (issue 8): schemathesis against `/openapi.json`, bounded.

A real server on a tiny random-weight model with a 64-token context, so no generation can
be long. Schemathesis (its `st` CLI, in a subprocess with a hard time bound) sends what the
schema allows and what it does not; every answer must conform to the schema the server
documents, no answer may be a 5xx, every error must be the SPEC §4 envelope
(tests/front/fuzz_checks.py), and afterwards the server must be `ready` with no fault
counted: nothing a client sends is a backend fault.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT, Server

CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
    "error_envelope",  # ours: tests/front/fuzz_checks.py
)
WALL_CLOCK = 300  # seconds: the whole run, however the generation goes


@pytest.fixture(scope="module")
def small_server(
    tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path
) -> Iterator[Server]:
    from tests.tinymodel import build_tiny_model

    model = build_tiny_model(
        tmp_path_factory.mktemp("tiny64") / "tiny64", default_model_dir, context=64
    )
    server = Server(["--model", str(model)])
    try:
        server.wait(timeout=60)
        yield server
    finally:
        server.stop()


def fuzz(server: Server, workdir: Path) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "run",
        f"{server.url}/openapi.json",
        "--checks",
        ",".join(CHECKS),
        "--phases",
        "examples,coverage,fuzzing",
        "--max-examples",
        "60",
        "--max-response-time",
        "10",
        "--request-timeout",
        "20",
        "--workers",
        "1",
        "--generation-database",
        "none",
        "--continue-on-failure",
        "--no-color",
    ]
    env = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": "tests.front.fuzz_checks",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    try:
        return subprocess.run(
            command, cwd=workdir, env=env, capture_output=True, text=True, timeout=WALL_CLOCK
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        pytest.fail(f"schemathesis ran over {WALL_CLOCK} s:\n{out[-4000:]}")


def test_fuzzing_finds_no_fault_and_no_unenveloped_error(small_server, tmp_path) -> None:
    run = fuzz(small_server, tmp_path)
    saved = Path(os.environ["STEWARD_TEST_LOGS"]) / f"schemathesis-{small_server.port}.txt"
    saved.write_text(run.stdout + run.stderr)
    health = httpx.get(small_server.url + "/health", timeout=5).json()
    problems = []
    if health["status"] != "ready" or health["faults"]["total"] != 0:
        problems.append(f"/health after fuzzing: {health['status']}, faults {health['faults']}")
    if health["worker"]["generation"] != 1:
        problems.append(f"the worker was replaced: {health['worker']}")
    if run.returncode != 0:
        problems.append(f"schemathesis exited {run.returncode} (all of it in {saved}):")
        problems.append(run.stdout[-12000:] + run.stderr[-3000:])
    assert not problems, "\n".join(problems)

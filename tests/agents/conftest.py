"""Fixtures of the agents' tests: the CLIs (installed from npm, or the reason they are
not), the test model built for each, and the server's account of the requests it answered."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.agents import install
from tests.agents.model import CALLS, LONG_CONTEXT, build_agent_model
from tests.conftest import Server

REQUIRED = "STEWARD_AGENTS_REQUIRED"  # set by .ci/run: a CLI that cannot run fails the run


@pytest.fixture(scope="session")
def agent_commands() -> dict[str, Path]:
    """Each CLI's command, at the pinned versions (or STEWARD_AGENT_VERSIONS')."""
    try:
        return install.commands()
    except install.Unavailable as why:
        if os.environ.get(REQUIRED):
            pytest.fail(f"{REQUIRED} is set and the agents' CLIs cannot be installed: {why}")
        pytest.skip(f"the agents' CLIs are not installed: {why}")


@pytest.fixture(scope="session")
def agent_model(
    tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path
) -> Callable[..., Path]:
    """`agent_model(cli, context)`: the test model that calls `cli`'s shell tool, built once."""
    built: dict[tuple[str, int], Path] = {}

    def build(cli: str, context: int = LONG_CONTEXT) -> Path:
        if (cli, context) not in built:
            out = tmp_path_factory.mktemp(f"agent-{cli}-{context}") / "model"
            built[cli, context] = build_agent_model(
                out, default_model_dir, CALLS[cli], context=context
            )
        return built[cli, context]

    return build


ACCESS = re.compile(
    r'"(?P<method>[A-Z]+) (?P<path>/v1/\S*)" (?P<status>\d{3})(?:.* model=(?P<model>\S+))?'
    r"(?:.* error=(?P<error>\S+))?(?:.* tokens=(?P<prompt>\d+)\+\d+)?"
)


@dataclass(frozen=True)
class Request:
    """One request the server answered, from its access log."""

    method: str
    path: str
    status: int
    model: str | None
    prompt_tokens: int | None
    error: str | None


def requests(server: Server, model: str) -> list[Request]:
    """The /v1 requests for `model` the server has answered so far, in order."""
    found = []
    for line in server.output().splitlines():
        if (match := ACCESS.search(line)) and match["model"] == model:
            tokens = match["prompt"] and int(match["prompt"])
            status = int(match["status"])
            found.append(
                Request(match["method"], match["path"], status, model, tokens, match["error"])
            )
    return found

"""Fixtures of the agents' tests: the CLIs (installed from npm, or the reason they are
not), the test model built for each, the servers that serve them (each CLI its own models,
by name), and the server's account of the requests it answered."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.agents import install
from tests.agents.clis import AGENTS, Agent, Limits
from tests.agents.model import CALLS, LONG_CONTEXT, build_agent_model, with_context
from tests.conftest import Server

REQUIRED = "STEWARD_AGENTS_REQUIRED"  # set by .ci/run: a CLI that cannot run fails the run
NOTE = "steward-note-4127"  # what note.txt holds: the tool's result
DIALECT = {"claude": "messages", "codex": "responses", "opencode": "chat"}
# A first request may wait for its model's load, which a busy CPU slows past the default.
QUEUE_TIMEOUT = "120"


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
    """`agent_model(cli, context)`: the test model that calls `cli`'s shell tool, built once
    (another context is the same files but for its config)."""
    built: dict[tuple[str, int], Path] = {}

    def build(cli: str, context: int = LONG_CONTEXT) -> Path:
        if (cli, context) not in built:
            out = tmp_path_factory.mktemp(f"agent-{cli}-{context}") / "model"
            made = next((path for (name, _), path in built.items() if name == cli), None)
            built[cli, context] = (
                with_context(made, out, context)
                if made
                else build_agent_model(out, default_model_dir, CALLS[cli], context=context)
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
    prompt_tokens: int | None
    error: str | None


def requests(server: Server, model: str) -> list[Request]:
    """The /v1 requests for `model` the server has answered so far, in order."""
    found = []
    for line in server.output().splitlines():
        if (match := ACCESS.search(line)) and match["model"] == model:
            tokens = match["prompt"] and int(match["prompt"])
            status = int(match["status"])
            found.append(Request(match["method"], match["path"], status, tokens, match["error"]))
    return found


def model(cli: str, short: bool = False) -> str:
    """The name a CLI's model is served under (none names a model the CLI knows)."""
    return f"{'short' if short else 'tiny'}-{DIALECT[cli]}"


def serve(models: dict[str, Path], *args: str) -> Server:
    """A server of `models` (name: folder), each loaded on its first request."""
    named = [arg for name, path in models.items() for arg in ("--model", f"{name}={path}")]
    server = Server([*named, "--queue-timeout", QUEUE_TIMEOUT, *args])
    server.wait()
    return server


@pytest.fixture(scope="module", params=list(AGENTS))
def cli(request: pytest.FixtureRequest) -> str:
    return request.param


def agent(
    cli: str, commands: dict[str, Path], tmp_path: Path, server: Server, limits: Limits
) -> Agent:
    """The CLI in `tmp_path`, pointed at `server`'s model for it (of the context `limits`
    says: the short one where it is not the long)."""
    name = model(cli, short=limits.window != LONG_CONTEXT)
    made = AGENTS[cli](commands[cli], tmp_path, server.url, name, limits)
    (made.work / "note.txt").write_text(NOTE + "\n")
    return made


def answered(server: Server, runner: Agent, since: int) -> list[Request]:
    """The CLI's requests from the `since`-th: there were some, and each was answered 200."""
    made = requests(server, runner.model)[since:]
    assert made, "the CLI made no request"
    assert all(r.status == 200 for r in made), made
    return made

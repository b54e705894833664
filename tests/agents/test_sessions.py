"""The real agents' CLIs against a real `steward serve`: a turn and the session's next one
with its history, a turn through a worker crash, a tool the model calls and the CLI runs.

Each CLI runs in a home and a folder of its own (tests/agents/clis.py); what the server
answered is read from its access log. The model (tests/agents/model.py) answers " All done",
or, asked by ASK in the user's turn, calls the CLI's shell tool to `cat note.txt`. Two
servers serve every CLI, each CLI its own model (the call differs): one healthy, one whose
models' workers each crash at their first request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.agents.clis import AGENTS, Limits
from tests.agents.conftest import NOTE, agent, answered, model, requests, serve
from tests.agents.model import ANSWER, ASK, LONG_CONTEXT
from tests.conftest import Server

LONG = Limits(LONG_CONTEXT)
FAULT = "decode:crash:nth=1"  # without model=NAME: every model's, each counting its own


@pytest.fixture(scope="module")
def healthy(agent_model: Callable[..., Path]) -> Iterator[Server]:
    """Every CLI's model, with no spare workers (nothing fails here)."""
    server = serve({model(cli): agent_model(cli) for cli in AGENTS}, "--standby", "none")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def crashing(agent_model: Callable[..., Path]) -> Iterator[Server]:
    """Every CLI's model, each one's worker crashing at its first decode step."""
    server = serve({model(cli): agent_model(cli) for cli in AGENTS}, "--inject-fault", FAULT)
    yield server
    server.stop()


def test_a_turn_and_the_next_with_its_history(
    cli: str, agent_commands: dict[str, Path], healthy: Server, tmp_path: Path
) -> None:
    runner = agent(cli, agent_commands, tmp_path, healthy, LONG)
    since = len(requests(healthy, runner.model))
    first = runner.turn("Say hi")
    assert first.code == 0, first
    assert ANSWER.strip() in first.out, first
    between = len(requests(healthy, runner.model))
    second = runner.turn("And again", again=True)
    assert second.code == 0, second
    assert ANSWER.strip() in second.out, second
    before = answered(healthy, runner, since)[: between - since]
    after = answered(healthy, runner, between)
    # The next turn's prompt holds the first turn's question and answer.
    assert max(r.prompt_tokens or 0 for r in after) > max(r.prompt_tokens or 0 for r in before)


def test_a_turn_through_a_worker_crash(
    cli: str, agent_commands: dict[str, Path], crashing: Server, tmp_path: Path
) -> None:
    runner = agent(cli, agent_commands, tmp_path, crashing, LONG)
    turn = runner.turn("Say hi")
    assert turn.code == 0, turn
    assert ANSWER.strip() in turn.out, turn
    answered(crashing, runner, 0)
    faults = crashing.health().json()["models"][runner.model]["faults"]
    assert faults["total"] >= 1  # the crash did happen


def test_a_tool_round_trip(
    cli: str, agent_commands: dict[str, Path], healthy: Server, tmp_path: Path
) -> None:
    runner = agent(cli, agent_commands, tmp_path, healthy, LONG)
    since = len(requests(healthy, runner.model))
    turn = runner.turn(f"{ASK} Show me note.txt")
    assert turn.code == 0, turn
    assert ANSWER.strip() in turn.out, turn  # the model answers so only with a tool result
    made = answered(healthy, runner, since)
    assert len([r for r in made if r.prompt_tokens]) >= 2  # the call, then its result's answer
    # The CLI ran the call and kept its output as the tool's result in its session.
    assert runner.holds(NOTE.encode()), f"{NOTE} is in none of {cli}'s files"

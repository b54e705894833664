"""The real agents' CLIs against a real `steward serve`: a turn, a turn through a worker
crash, the session's next turn with its history, a tool the model calls and the CLI runs.

Each CLI runs in a home and a folder of its own (tests/agents/clis.py); what the server
answered is read from its access log. The model (tests/agents/model.py) answers " All done",
or, asked by ASK in the user's turn, calls the CLI's shell tool to `cat note.txt`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.agents.clis import AGENTS, MODEL, Agent, Limits
from tests.agents.conftest import Request, requests
from tests.agents.model import ANSWER, ASK, LONG_CONTEXT
from tests.conftest import Server

NOTE = "steward-note-4127"  # what note.txt holds: the tool's result


@pytest.fixture(scope="module", params=list(AGENTS))
def cli(request: pytest.FixtureRequest) -> str:
    return request.param


def start(
    cli: str, agent_model: Callable[..., Path], *args: str, context: int = LONG_CONTEXT
) -> Server:
    server = Server(
        ["--model", str(agent_model(cli, context)), "--served-model-name", MODEL, *args]
    )
    server.wait()
    return server


@pytest.fixture(scope="module")
def healthy(cli: str, agent_model: Callable[..., Path]) -> Iterator[Server]:
    """A server of the CLI's model, shared by the module's healthy tests of that CLI."""
    server = start(cli, agent_model)
    yield server
    server.stop()


def agent(
    cli: str,
    commands: dict[str, Path],
    tmp_path: Path,
    server: Server,
    limits: Limits | None = None,
) -> Agent:
    made = AGENTS[cli](commands[cli], tmp_path, server.url, limits or Limits(LONG_CONTEXT))
    (made.work / "note.txt").write_text(NOTE + "\n")
    return made


def all_answered(server: Server, since: int) -> list[Request]:
    """The requests made since the `since`-th: there were some, and each was answered 200."""
    made = requests(server)[since:]
    assert made, "the CLI made no request"
    assert all(r.status == 200 for r in made), made
    return made


def test_a_turn(cli: str, agent_commands: dict[str, Path], healthy: Server, tmp_path: Path) -> None:
    since = len(requests(healthy))
    turn = agent(cli, agent_commands, tmp_path, healthy).turn("Say hi")
    assert turn.code == 0, turn
    assert ANSWER.strip() in turn.out, turn
    all_answered(healthy, since)


def test_a_turn_through_a_worker_crash(
    cli: str,
    agent_commands: dict[str, Path],
    agent_model: Callable[..., Path],
    serve: Callable,
    tmp_path: Path,
) -> None:
    server = start(cli, agent_model, "--inject-fault", "decode:crash:nth=1")
    try:
        turn = agent(cli, agent_commands, tmp_path, server).turn("Say hi")
        assert turn.code == 0, turn
        assert ANSWER.strip() in turn.out, turn
        all_answered(server, 0)
        assert server.health().json()["faults"]["total"] >= 1  # the crash did happen
    finally:
        server.stop()


def test_the_next_turn_sends_the_history(
    cli: str, agent_commands: dict[str, Path], healthy: Server, tmp_path: Path
) -> None:
    runner = agent(cli, agent_commands, tmp_path, healthy)
    since = len(requests(healthy))
    first = runner.turn("Say hi")
    assert first.code == 0, first
    between = len(requests(healthy))
    second = runner.turn("And again", again=True)
    assert second.code == 0, second
    assert ANSWER.strip() in second.out, second
    before, after = all_answered(healthy, since)[: between - since], all_answered(healthy, between)
    # The next turn's prompt holds the first turn's question and answer.
    assert max(r.prompt_tokens or 0 for r in after) > max(r.prompt_tokens or 0 for r in before)


def test_a_tool_round_trip(
    cli: str, agent_commands: dict[str, Path], healthy: Server, tmp_path: Path
) -> None:
    runner = agent(cli, agent_commands, tmp_path, healthy)
    since = len(requests(healthy))
    turn = runner.turn(f"{ASK} Show me note.txt")
    assert turn.code == 0, turn
    assert ANSWER.strip() in turn.out, turn  # the model answers so only with a tool result
    made = all_answered(healthy, since)
    assert len([r for r in made if r.prompt_tokens]) >= 2  # the call, then its result's answer
    # The CLI ran the call and kept its output as the tool's result in its session.
    assert runner.holds(NOTE.encode()), f"{NOTE} is in none of {cli}'s files"


@dataclass(frozen=True)
class Outgrowing:
    """A session that outgrows a short context: what the CLI is told, its turns, each
    turn's words (about 2,500 tokens for every 285)."""

    limits: Limits
    turns: int
    words: int

    def turn(self, i: int) -> str:
        return (
            f"Turn {i}. Please read this. "
            + "the quick brown fox jumps over the lazy dog " * self.words
        )


# Claude Code and opencode compact to a summary and the latest turn: three turns of 2,500
# tokens on their own 8-12 thousand outgrow 16,384 tokens. Codex keeps the session's user
# messages up to 20,000 (approximate) tokens beside its summary (codex-rs compact.rs,
# COMPACT_USER_MESSAGE_MAX_TOKENS), so only a context well above that and its own 9,000 can
# hold a compacted session: four turns of 6,000 tokens outgrow 32,768.
SHORT = Limits(16_384, output=2048, compact_at=12_000)
OUTGROWING = {
    "claude": Outgrowing(SHORT, turns=3, words=285),
    "codex": Outgrowing(Limits(32_768, output=2048, compact_at=24_000), turns=4, words=680),
    "opencode": Outgrowing(SHORT, turns=3, words=285),
}


def test_a_session_that_outgrows_the_context(
    cli: str, agent_commands: dict[str, Path], agent_model: Callable[..., Path], tmp_path: Path
) -> None:
    """The session's turns outgrow the context: the CLI compacts it (in time, or on the 400
    that says the prompt is too long) and every turn is answered."""
    session = OUTGROWING[cli]
    server = start(cli, agent_model, context=session.limits.window)
    try:
        runner = agent(cli, agent_commands, tmp_path, server, session.limits)
        for i in range(session.turns):
            turn = runner.turn(session.turn(i), again=i > 0)
            assert turn.code == 0, turn
            assert ANSWER.strip() in turn.out, turn
        made = requests(server)
        refused = [r for r in made if r.status != 200]
        assert all(r.status == 400 and r.error == "context_length_exceeded" for r in refused), made
        assert runner.holds(runner.compacted), f"{cli} never compacted its session: {made}"
        assert made[-1].status == 200
    finally:
        server.stop()

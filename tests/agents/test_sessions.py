"""The real agents' CLIs against a real `steward serve`: a turn and the session's next one
with its history, a turn through a worker crash, a tool the model calls and the CLI runs,
and a session that outgrows the context.

Each CLI runs in a home and a folder of its own (tests/agents/clis.py); what the server
answered is read from its access log. The model (tests/agents/model.py) answers " All done",
or, asked by ASK in the user's turn, calls the CLI's shell tool to `cat note.txt`. Two
servers serve every CLI, each CLI its own models (the call differs): one healthy, one whose
models' workers each crash on their first request; models load on their first request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.agents.clis import AGENTS, Agent, Limits
from tests.agents.conftest import Request, requests
from tests.agents.model import ANSWER, ASK, LONG_CONTEXT
from tests.conftest import Server

NOTE = "steward-note-4127"  # what note.txt holds: the tool's result
DIALECT = {"claude": "messages", "codex": "responses", "opencode": "chat"}
# A first request may wait for its model's load, which a busy CPU slows past the default.
QUEUE_TIMEOUT = "120"
FAULT = "decode:crash:nth=1"  # without model=NAME: every model's, each counting its own


WORDS = "the quick brown fox jumps over the lazy dog "


@dataclass(frozen=True)
class Outgrowing:
    """A session that outgrows a short context: what the CLI is told, its turns, each
    turn's words (about 2,500 tokens for every 285)."""

    limits: Limits
    turns: int
    words: int

    def turn(self, i: int) -> str:
        return f"Turn {i}. Please read this. " + WORDS * self.words


# Claude Code compacts on the 400 and keeps a summary: three turns of 2,500 tokens on its own
# 12,000 outgrow 16,384 tokens. opencode compacts in time (clis.py) to a summary and what of
# the latest turn fits a quarter of the window: two turns of 5,000 tokens on its own 7,700
# outgrow it. Codex keeps the session's user messages up to 20,000 (approximate) tokens
# beside its summary (codex-rs compact.rs, COMPACT_USER_MESSAGE_MAX_TOKENS), so only a
# context well above that and its own 9,000 holds a compacted session: four turns of 6,000
# tokens outgrow 32,768.
SHORT = Limits(16_384, output=2048, compact_at=12_000)
OUTGROWING = {
    "claude": Outgrowing(SHORT, turns=3, words=285),
    "codex": Outgrowing(Limits(32_768, output=2048, compact_at=24_000), turns=4, words=680),
    "opencode": Outgrowing(SHORT, turns=2, words=570),
}


def model(cli: str, short: bool = False) -> str:
    """The name a CLI's model is served under (none names a model the CLI knows)."""
    return f"{'short' if short else 'tiny'}-{DIALECT[cli]}"


def serve(models: dict[str, Path], *args: str) -> Server:
    named = [arg for name, path in models.items() for arg in ("--model", f"{name}={path}")]
    server = Server([*named, "--queue-timeout", QUEUE_TIMEOUT, *args])
    server.wait()
    return server


@pytest.fixture(scope="module", params=list(AGENTS))
def cli(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def healthy(agent_model: Callable[..., Path]) -> Iterator[Server]:
    """Every CLI's model, and its short-context one, with no spare workers (nothing fails)."""
    models = {model(cli): agent_model(cli) for cli in AGENTS}
    for cli, session in OUTGROWING.items():
        models[model(cli, short=True)] = agent_model(cli, session.limits.window)
    server = serve(models, "--standby", "none")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def crashing(agent_model: Callable[..., Path]) -> Iterator[Server]:
    """Every CLI's model, each one's worker crashing at its first decode step."""
    server = serve({model(cli): agent_model(cli) for cli in AGENTS}, "--inject-fault", FAULT)
    yield server
    server.stop()


def agent(
    cli: str,
    commands: dict[str, Path],
    tmp_path: Path,
    server: Server,
    *,
    short: bool = False,
) -> Agent:
    limits = OUTGROWING[cli].limits if short else Limits(LONG_CONTEXT)
    made = AGENTS[cli](commands[cli], tmp_path, server.url, model(cli, short), limits)
    (made.work / "note.txt").write_text(NOTE + "\n")
    return made


def answered(server: Server, runner: Agent, since: int) -> list[Request]:
    """The CLI's requests from the `since`-th: there were some, and each was answered 200."""
    made = requests(server, runner.model)[since:]
    assert made, "the CLI made no request"
    assert all(r.status == 200 for r in made), made
    return made


def test_a_turn_and_the_next_with_its_history(
    cli: str, agent_commands: dict[str, Path], healthy: Server, tmp_path: Path
) -> None:
    runner = agent(cli, agent_commands, tmp_path, healthy)
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
    runner = agent(cli, agent_commands, tmp_path, crashing)
    turn = runner.turn("Say hi")
    assert turn.code == 0, turn
    assert ANSWER.strip() in turn.out, turn
    answered(crashing, runner, 0)
    faults = crashing.health().json()["models"][runner.model]["faults"]
    assert faults["total"] >= 1  # the crash did happen


def test_a_tool_round_trip(
    cli: str, agent_commands: dict[str, Path], healthy: Server, tmp_path: Path
) -> None:
    runner = agent(cli, agent_commands, tmp_path, healthy)
    since = len(requests(healthy, runner.model))
    turn = runner.turn(f"{ASK} Show me note.txt")
    assert turn.code == 0, turn
    assert ANSWER.strip() in turn.out, turn  # the model answers so only with a tool result
    made = answered(healthy, runner, since)
    assert len([r for r in made if r.prompt_tokens]) >= 2  # the call, then its result's answer
    # The CLI ran the call and kept its output as the tool's result in its session.
    assert runner.holds(NOTE.encode()), f"{NOTE} is in none of {cli}'s files"


def test_a_session_that_outgrows_the_context(
    cli: str, agent_commands: dict[str, Path], healthy: Server, tmp_path: Path
) -> None:
    """The session's turns outgrow the context: the CLI compacts it (in time, or on the 400
    that says the prompt is too long) and every turn is answered."""
    session = OUTGROWING[cli]
    runner = agent(cli, agent_commands, tmp_path, healthy, short=True)
    for i in range(session.turns):
        turn = runner.turn(session.turn(i), again=i > 0)
        assert turn.code == 0, turn
        assert ANSWER.strip() in turn.out, turn
    made = requests(healthy, runner.model)
    refused = [r for r in made if r.status != 200]
    assert all(r.status == 400 and r.error == "context_length_exceeded" for r in refused), made
    assert runner.holds(runner.compacted), f"{cli} never compacted its session: {made}"
    assert made[-1].status == 200

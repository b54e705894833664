"""A session of each real agent's CLI that outgrows the model's context: the CLI compacts it
(in time, or on the 400 that says the prompt is too long) and every turn is answered.

A file of its own, so that pytest's workers run it beside test_sessions.py; its server
serves each CLI's model with a short context (tests/agents/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.agents.clis import AGENTS, Limits
from tests.agents.conftest import agent, model, requests, serve
from tests.agents.model import ANSWER
from tests.conftest import Server

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
# tokens outgrow 32,768. docs/agents.md shows each.
SHORT = Limits(16_384, output=2048, compact_at=12_000)
OUTGROWING = {
    "claude": Outgrowing(SHORT, turns=3, words=285),
    "codex": Outgrowing(Limits(32_768, output=2048, compact_at=24_000), turns=4, words=680),
    "opencode": Outgrowing(SHORT, turns=2, words=570),
}


@pytest.fixture(scope="module")
def server(agent_model: Callable[..., Path]) -> Iterator[Server]:
    """Every CLI's model with its short context, with no spare workers."""
    models = {
        model(cli, short=True): agent_model(cli, OUTGROWING[cli].limits.window) for cli in AGENTS
    }
    made = serve(models, "--standby", "none")
    yield made
    made.stop()


def test_a_session_that_outgrows_the_context(
    cli: str, agent_commands: dict[str, Path], server: Server, tmp_path: Path
) -> None:
    session = OUTGROWING[cli]
    runner = agent(cli, agent_commands, tmp_path, server, session.limits)
    for i in range(session.turns):
        turn = runner.turn(session.turn(i), again=i > 0)
        assert turn.code == 0, turn
        assert ANSWER.strip() in turn.out, turn
    made = requests(server, runner.model)
    refused = [r for r in made if r.status != 200]
    assert all(r.status == 400 and r.error == "context_length_exceeded" for r in refused), made
    assert runner.holds(runner.compacted), f"{cli} never compacted its session: {made}"
    assert made[-1].status == 200

"""The seam every dialect implements: its request translated into an `Ask`, and an
`Answer` that writes the jobs' events (one job per choice) in its wire shapes. The rest is
the engine's (exchange.py, delivery.py), once for every dialect."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from steward.errors import ApiError
from steward.supervisor.jobs import Job
from steward.wire.protocol import Done, Generate, Token


@dataclass(frozen=True)
class Ask:
    """A dialect's request, translated: what the supervisor runs, once per choice."""

    payload: Generate  # id, seq and attempt 0: the supervisor numbers it
    prompt_chars: int  # characters of the prompt's text (a cheap context bound)
    stream: bool = False
    choices: int = 1  # OpenAI's `n`: that many jobs, batch members sharing the prompt
    # The context may end the answer before `max_tokens` (Anthropic's
    # `model_context_window_exceeded`): a prompt that leaves less room than `max_tokens`
    # gets the room there is, instead of a 400.
    fit_context: bool = False

    @classmethod
    def of(
        cls,
        params: dict[str, Any],
        prompt_chars: int,
        stream: bool,
        choices: int = 1,
        fit_context: bool = False,
    ) -> Ask:
        """From `Generate`'s fields (`max_tokens` at least: None for the default cap)."""
        payload = Generate(id=0, seq=0, attempt=0, **params)
        return cls(payload, prompt_chars, stream, choices, fit_context)


class Answer(ABC):
    """A dialect's answer translation: the jobs' events (one job per choice) into its
    response body, or into its stream's SSE frames (each method returns whole frames)."""

    # A started stream silent this long (a resume waiting for a new worker and its prefill)
    # writes `idle()`'s frames, and again after each such silence; None: never.
    idle_seconds: float | None = None

    @abstractmethod
    def full(self, jobs: list[Job], dones: list[Done]) -> dict[str, Any]:
        """The whole answer, once every choice is done."""

    def opening(self) -> list[str]:
        """Frames before the first token's (once it exists: the stream starts then)."""
        return []

    @abstractmethod
    def delta(self, index: int, token: Token, first: bool) -> list[str]:
        """A token of choice `index` (`first`: its first); a resumed stream just goes on."""

    @abstractmethod
    def finished(self, index: int, done: Done, first: bool) -> list[str]:
        """Choice `index` ended (`first`: it sent no token before)."""

    @abstractmethod
    def closing(self, dones: list[Done]) -> list[str]:
        """Every choice ended: the stream's last frames."""

    @abstractmethod
    def failed(self, error: ApiError, request_id: str) -> list[str]:
        """A started stream that cannot go on (quarantine, deadline, recovery spent)."""

    def idle(self) -> list[str]:
        """Frames for a started stream's silence (`idle_seconds`): a dialect's keep-alive."""
        return []


def sse(body: dict[str, Any], event: str | None = None) -> str:
    """One server-sent event; `event:` named for dialects that name theirs."""
    named = f"event: {event}\n" if event else ""
    return f"{named}data: {json.dumps(body, ensure_ascii=False)}\n\n"

"""A poison request joining a full batch (issue 20, "Done when"): real servers, real workers,
real MLX on the tiny model, the official OpenAI SDK as the clients.

Seven clients each stream a question twice (all the same question, as clients often ask,
or one question each) while an eighth sends one request carrying the poison marker once
all seven are observably decoding (`/health` `in_flight`). `decode:poison:marker=M` poisons
the worker at that request's second token: every later backend call in that worker raises,
so the whole batch faults and every member is a suspect. Whatever the spare (`--standby
hot|warm|none`), and with the machine idle or busy: every innocent answer is whole and
equal to the answer the same server gave alone before, the poison ends quarantined, at most
2 workers are replaced, and the server still serves. Nothing here waits for a time.
"""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import openai
import pytest

from tests.conftest import Server
from tests.load import busy_cpu  # noqa: F401  (a fixture)

MARKER = "X-POISON-20"
MAX_TOKENS = 16
CLIENTS = 7
# Every member's decode step a little longer, so that seven streams of MAX_TOKENS are still
# decoding when /health is next read, however fast the machine (the poison's own spec comes
# first: once it fires, a poisoned worker raises before it sleeps).
SLOW = "decode:slow=0.005:every"
SAME = "What does a lighthouse keeper do all night?"
DISTINCT = [f"Question {i}: what does a lighthouse keeper do all night?" for i in range(CLIENTS)]
POISON = f"Tell me about lighthouses. {MARKER}"


@dataclass
class Answer:
    """One streamed chat completion as its client saw it."""

    text: str = ""
    finish: str | None = None
    arrivals: list[float] = field(default_factory=list)  # each content delta's, monotonic
    error: str | None = None  # "422 request_quarantined", "stream request_quarantined", ...

    def whole(self, reference: Answer) -> bool:
        return (
            self.error is None
            and self.finish in ("stop", "length")
            and self.text != ""
            and (self.text, self.finish) == (reference.text, reference.finish)
        )

    def spans(self, moment: float) -> bool:
        """Content arrived both before and after `moment`."""
        return bool(self.arrivals) and self.arrivals[0] < moment < self.arrivals[-1]


def error_type(body: object) -> str:
    return str(body.get("type")) if isinstance(body, dict) else repr(body)


def ask(server: Server, question: str) -> Answer:
    """Stream one greedy answer; what went wrong is recorded, never retried."""
    answer = Answer()
    with server.client(max_retries=0, timeout=120) as client:
        try:
            stream = client.chat.completions.create(
                model="default",
                messages=[{"role": "user", "content": question}],
                max_tokens=MAX_TOKENS,
                temperature=0,
                stream=True,
            )
            for chunk in stream:
                for choice in chunk.choices:
                    if choice.delta.content:
                        answer.arrivals.append(time.monotonic())
                        answer.text += choice.delta.content
                    answer.finish = choice.finish_reason or answer.finish
        except openai.APIStatusError as exc:  # refused before the stream started
            answer.error = f"{exc.status_code} {error_type(exc.body)}"
        except openai.APIConnectionError as exc:
            answer.error = f"connection {type(exc).__name__}"
        except openai.APIError as exc:  # an SSE error event ended the stream
            answer.error = f"stream {error_type(exc.body)}"
    return answer


def storm(server: Server, questions: list[str]) -> tuple[list[Answer], Answer]:
    """Each question asked twice in a row by its own client; the poison sent once all of
    them are decoding. The innocent answers (in question order, twice each) and the poison's."""
    with ThreadPoolExecutor(len(questions)) as pool:
        clients = [pool.submit(lambda q=q: [ask(server, q), ask(server, q)]) for q in questions]
        server.until(lambda health: health["in_flight"] >= len(questions), within=120)
        poison = ask(server, POISON)
        return [answer for client in clients for answer in client.result()], poison


def story(server: Server) -> str:
    """The server log's state changes and faults, for a failure message."""
    lines = server.output().splitlines()
    kept = [line for line in lines if re.search(r"state |fault|quarantin|promot|worker \d", line)]
    return "\n".join(kept[-40:]) + f"\n(whole log: {server.log})"


def poison_in_a_batch(serve, tiny_model, standby: str, questions: list[str]) -> None:
    faults = f"decode:poison:marker={MARKER};{SLOW}"
    server = serve("--model", str(tiny_model), "--standby", standby, "--inject-fault", faults)
    server.wait()
    if standby != "none":  # the spare that recovery will use is there before the storm
        server.until(lambda health: health["standby"]["state"] == "ready", within=120)
    reference = {q: ask(server, q) for q in set(questions)}  # alone, before anything faulted
    assert all(r.whole(r) for r in reference.values()), reference
    assert server.health().json()["faults"]["total"] == 0

    innocents, poison = storm(server, questions)

    health = server.health().json()
    context = f"health after the storm: {health}\n{story(server)}"
    asked = [q for q in questions for _ in range(2)]
    broken = [
        f"{q!r}: {a.error or (a.finish, a.text)} (alone: {reference[q].text!r})"
        for q, a in zip(asked, innocents, strict=True)
        if not a.whole(reference[q])
    ]
    assert not broken, (
        f"{len(broken)} of {len(innocents)} innocent answers broken:\n"
        + "\n".join(broken)
        + f"\n{context}"
    )
    assert poison.error in ("422 request_quarantined", "stream request_quarantined"), (
        f"the poison ended {poison.error or (poison.finish, poison.text)}\n{context}"
    )
    # Not a trivial pass: the poison did fault, with innocents decoding beside it.
    assert poison.arrivals, f"the poison never started decoding\n{context}"
    beside = sum(a.spans(poison.arrivals[0]) for a in innocents)
    assert beside >= 1, f"no innocent stream was decoding beside the poison\n{context}"
    assert health["faults"]["total"] >= 1, context
    assert health["restarts_in_window"] <= 2, f"more than 2 replacements\n{context}"

    # Still serving; no innocent payload quarantined; the poison's never reaches the backend.
    server.until(lambda health: health["status"] in ("ready", "degraded"), within=120)
    assert server.http.get("/health/ready").status_code == 200
    assert server.proc.poll() is None
    again = {q: ask(server, q) for q in set(questions)}
    assert all(again[q].whole(reference[q]) for q in again), f"{again}\n{story(server)}"
    faults = server.health().json()["faults"]["total"]
    retried = ask(server, POISON)
    assert retried.error == "422 request_quarantined", retried
    assert server.health().json()["faults"]["total"] == faults


@pytest.mark.parametrize("standby", ["hot", "warm", "none"])
@pytest.mark.parametrize("questions", [[SAME] * CLIENTS, DISTINCT], ids=["same", "distinct"])
def test_a_poison_joining_a_batch_harms_no_innocent(serve, tiny_model, standby, questions):
    poison_in_a_batch(serve, tiny_model, standby, questions)


@pytest.mark.usefixtures("busy_cpu")
def test_a_poison_joining_a_batch_on_a_busy_machine(serve, tiny_model) -> None:
    """The issue's field case: the same question, a hot spare, two busy loops beside."""
    poison_in_a_batch(serve, tiny_model, "hot", [SAME] * CLIENTS)

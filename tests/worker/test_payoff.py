"""Whether verify steps pay (worker/payoff.py): decisions on the step clock, each branch, and
an engine on the tiny model whose verify steps are made to cost more than they give (SPEC §6's
`verify` point) stops drafting, its answer unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest

from steward.wire.faultspec import parse
from steward.wire.protocol import Generate
from steward.worker.payoff import FIRST_PAUSE, FRESH, TRIAL, Payoff, kind_of

BATCH = kind_of(False, 8)
DECODE = 0.010  # seconds of a decode step of BATCH (a token a row)


def decode(payoff: Payoff, steps: int = 1, seconds: float = DECODE, of=BATCH) -> None:
    for _ in range(steps):
        payoff.measured(of, seconds, 8, 8, verified=False, steady=True)


def verify(payoff: Payoff, tokens: int, steps: int = 1, seconds: float = 0.020) -> None:
    """Verify steps of the 8 rows that gave `tokens` in all, in `seconds` each."""
    for _ in range(steps):
        payoff.measured(BATCH, seconds, 8, tokens, verified=True, steady=True)


def known(seconds: float = DECODE) -> Payoff:
    """A ledger whose decode step is measured: two steady decode steps in a row."""
    payoff = Payoff()
    decode(payoff, 2, seconds)
    return payoff


def test_kinds_are_alone_or_the_rows_rounded_up_to_a_power_of_two() -> None:
    assert kind_of(True, 1) == (True, 1)
    assert [kind_of(False, n)[1] for n in (1, 2, 3, 4, 5, 8, 9, 33)] == [1, 2, 4, 4, 8, 8, 16, 64]


def test_a_kind_decodes_until_its_decode_step_is_measured_steady() -> None:
    payoff = Payoff()
    assert not payoff.allows(BATCH)  # never met
    decode(payoff)
    assert not payoff.allows(BATCH)  # its first decode step may follow anything: not counted
    payoff.measured(BATCH, 0.5, 8, 8, verified=False, steady=False)  # a prefill or a new shape
    decode(payoff)
    assert not payoff.allows(BATCH)  # the step before was not steady
    decode(payoff)
    assert payoff.allows(BATCH)
    assert not payoff.allows(kind_of(False, 16))  # each kind is measured on its own


def test_verify_steps_that_give_more_than_they_cost_go_on() -> None:
    payoff = known()
    verify(payoff, tokens=24, steps=3 * TRIAL)  # 3 tokens a row for 2 decode steps' time
    assert payoff.allows(BATCH) and not payoff.paused()


def test_verify_steps_that_cost_more_a_token_pause_their_kind_twice_as_long_each_time() -> None:
    payoff = known()
    verify(payoff, tokens=12, steps=TRIAL)  # 1.5 tokens a row for 2 decode steps' time
    assert payoff.allows(BATCH)  # not judged before TRIAL verify steps after the first
    verify(payoff, tokens=12)
    assert not payoff.allows(BATCH) and payoff.paused() == [BATCH]
    decode(payoff, FIRST_PAUSE - 1)
    assert not payoff.allows(BATCH)
    decode(payoff)
    assert payoff.allows(BATCH)  # tried afresh after the pause
    verify(payoff, tokens=12, steps=TRIAL + 1)
    decode(payoff, 2 * FIRST_PAUSE - 1)
    assert not payoff.allows(BATCH)  # the second pause is twice as long
    decode(payoff)
    assert payoff.allows(BATCH)


def test_a_kind_that_pays_again_starts_its_pauses_short() -> None:
    payoff = known()
    verify(payoff, tokens=12, steps=TRIAL + 1)
    decode(payoff, FIRST_PAUSE)
    verify(payoff, tokens=40, steps=TRIAL + 1)  # its members copy now: 5 tokens a row
    assert payoff.allows(BATCH)
    verify(payoff, tokens=8, seconds=0.05, steps=TRIAL)  # and then they do not
    assert not payoff.allows(BATCH)
    decode(payoff, FIRST_PAUSE)
    assert payoff.allows(BATCH)  # the first pause's length again


def test_the_decode_step_is_measured_again_every_so_many_verify_steps() -> None:
    payoff = known()
    verify(payoff, tokens=24, steps=FRESH)
    assert not payoff.allows(BATCH)  # two plain steps first
    decode(payoff)
    assert not payoff.allows(BATCH)  # the one after a verify step does not count
    decode(payoff, seconds=0.030)
    assert payoff.allows(BATCH)
    verify(payoff, tokens=12, steps=TRIAL + 1)  # 1.5 tokens a row for 2 decode steps of 10 ms
    assert payoff.allows(BATCH)  # judged against the decode step's mean, longer now: it pays


def test_the_first_step_after_one_of_the_other_sort_is_not_counted() -> None:
    """The first verify step after decoding waits for the last decode step's work too; the
    first decode step after verifying waits for nothing."""
    payoff = known()
    verify(payoff, tokens=24, seconds=1.0)  # as if it waited for a long decode step
    verify(payoff, tokens=24, steps=TRIAL)  # 3 tokens a row for 2 decode steps' time
    assert payoff.allows(BATCH)
    decode(payoff, seconds=0.0001)
    assert payoff.ledgers[BATCH].decode == DECODE


def test_steps_that_are_not_steady_are_not_judged() -> None:
    payoff = known()
    for _ in range(3 * TRIAL):  # slow verify steps, each a new shape or prefilling
        payoff.measured(BATCH, 1.0, 8, 8, verified=True, steady=False)
    assert payoff.allows(BATCH)


PROMPT = "def area(w, h):\n    return w * h\n\n" * 6  # the tiny model's answer copies it


@pytest.fixture(scope="module")
def backend(tiny_model: Path):
    from steward.worker.backend import Backend
    from steward.worker.injection import Injector

    return Backend(tiny_model, Injector([parse("verify:slow=0.2:every")], 1))


def run(engine, req: Generate) -> tuple[list[int], int]:
    tokens, accepted = [], 0
    engine.add(req)
    while engine.busy:
        step = engine.step()
        tokens += [t.token for t in step.tokens if t.token >= 0]
        accepted += sum(done.accepted_prediction_tokens for done in step.done)
    return tokens, accepted


def test_an_engine_whose_verify_steps_do_not_pay_stops_drafting_and_answers_the_same(
    backend,
) -> None:
    """Each verify step sleeps 200 ms, far more than the tokens it gives are worth on the
    tiny model: `auto` pauses after its trial, `always` verifies on, the answers match."""
    from steward.worker.engine import Engine

    def ask() -> Generate:
        return Generate(id=1, seq=1, attempt=1, max_tokens=96, prompt=PROMPT)

    engines = {mode: Engine(backend, 8, 0, speculate=mode) for mode in ("auto", "always", "none")}
    answers = {mode: run(engine, ask()) for mode, engine in engines.items()}
    assert answers["auto"][0] == answers["none"][0] == answers["always"][0]
    payoff = engines["auto"].speculation.payoff
    assert payoff is not None and payoff.ledgers[kind_of(True, 1)].paused_until > 0
    assert 0 < answers["auto"][1] < answers["always"][1]  # lookup drafted, then paused

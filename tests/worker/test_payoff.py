"""Whether drafting pays (worker/payoff.py): decisions on the step clock, each branch, and
an engine on the tiny model whose verify steps are made to cost more than they give (SPEC §6's
`verify` point) stops drafting, its answer unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest

from steward.wire.faultspec import parse
from steward.wire.protocol import Generate
from steward.worker.payoff import (
    AFTER,
    FIRST_PAUSE,
    FRESH,
    OVERRUN,
    WINDOW,
    Payoff,
    Taken,
    kind_of,
)

BATCH = kind_of(False, 8)
DECODE = 0.010  # seconds of a decode step of BATCH (a token a row)


def decode(payoff: Payoff, steps: int = 1, seconds: float = DECODE, **flags: bool) -> None:
    for _ in range(steps):
        payoff.measured(BATCH, Taken(seconds, 8, 8, drafting=False, verified=False, **flags))


def verify(payoff: Payoff, tokens: int, steps: int = 1, seconds: float = 0.020, **flags) -> None:
    """Verify steps of the 8 rows that gave `tokens` in all, in `seconds` each."""
    for _ in range(steps):
        payoff.measured(BATCH, Taken(seconds, 8, tokens, drafting=True, verified=True, **flags))


def known(seconds: float = DECODE) -> Payoff:
    """A ledger whose decode steps are measured: a window of them."""
    payoff = Payoff()
    decode(payoff, WINDOW, seconds)
    return payoff


def test_kinds_are_alone_or_the_rows_rounded_up_to_a_power_of_two() -> None:
    assert kind_of(True, 1) == (True, 1)
    assert [kind_of(False, n)[1] for n in (1, 2, 3, 4, 5, 8, 9, 33)] == [1, 2, 4, 4, 8, 8, 16, 64]


def test_a_kind_decodes_until_a_window_of_its_decode_steps_is_measured() -> None:
    payoff = Payoff()
    assert not payoff.allows(BATCH)  # never met
    decode(payoff, WINDOW - 1)
    decode(payoff, 3, prefilled=True)  # steps that prefill, or of a new shape: not counted
    decode(payoff, 3, new=True)
    assert not payoff.allows(BATCH)
    decode(payoff)
    assert payoff.allows(BATCH)
    assert payoff.ledgers[BATCH].decode == pytest.approx(DECODE)
    assert not payoff.allows(kind_of(False, 16))  # each kind is measured on its own


def test_verify_steps_that_give_more_than_they_cost_go_on() -> None:
    payoff = known()
    verify(payoff, tokens=24, steps=3 * WINDOW)  # 3 tokens a row for 2 decode steps' time
    assert payoff.allows(BATCH) and not payoff.paused()


def test_verify_steps_that_cost_more_a_token_pause_their_kind_twice_as_long_each_time() -> None:
    payoff = known()
    verify(payoff, tokens=12, steps=WINDOW - 1)  # 1.5 tokens a row for 2 decode steps' time
    assert payoff.allows(BATCH)  # not judged before a window of verify steps
    verify(payoff, tokens=12)
    assert not payoff.allows(BATCH) and payoff.paused() == [BATCH]
    decode(payoff, FIRST_PAUSE - 1)
    assert not payoff.allows(BATCH)
    decode(payoff)
    assert payoff.allows(BATCH)  # tried afresh after the pause
    verify(payoff, tokens=12, steps=WINDOW)
    decode(payoff, 2 * FIRST_PAUSE - 1)
    assert not payoff.allows(BATCH)  # the second pause is twice as long
    decode(payoff)
    assert payoff.allows(BATCH)


def test_verify_steps_that_cost_tens_of_decode_steps_are_judged_in_a_few() -> None:
    """A window of verify steps is judged once it has taken OVERRUN windows of decode
    steps' time, on the steps it has: a trial of dear steps costs that, not sixteen steps."""
    payoff = known()
    dear = 12 * DECODE  # 3 tokens a row for twelve decode steps' time
    steps = -(-OVERRUN * WINDOW // 12)  # steps until the trial's time is spent
    verify(payoff, tokens=24, steps=steps - 1, seconds=dear)
    assert payoff.allows(BATCH)
    verify(payoff, tokens=24, seconds=dear)
    assert not payoff.allows(BATCH) and steps < WINDOW
    cheap = known()
    verify(cheap, tokens=64, steps=WINDOW, seconds=dear / 2)  # 8 tokens a row: it pays
    assert cheap.allows(BATCH) and not cheap.paused()


def test_drafting_is_judged_with_the_plain_steps_it_slows() -> None:
    """On the H200 at 32 members, a drafting engine's plain steps cost 2.6 times a plain
    engine's: each carries the roll-back of the verify step before it. A window of drafting
    steps counts them, though its verify steps alone would pay; and the plain step after a
    drafting one is no measure of plain decoding."""
    payoff = known()
    for _ in range(WINDOW // 2):
        verify(payoff, tokens=16, seconds=0.015)  # 2 tokens a row for 1.5 decode steps
        payoff.measured(BATCH, Taken(0.030, 8, 8, True, False))  # nothing drafted
    assert not payoff.allows(BATCH)
    decode(payoff, seconds=0.030)  # the last verify step's roll-back (a plain step between)
    decode(payoff, WINDOW)
    assert payoff.ledgers[BATCH].decode == pytest.approx(DECODE)


def test_the_plain_steps_that_carry_a_verify_steps_roll_back_are_no_measure() -> None:
    """The first plain step after a verify step only queues its forward (its input came
    from the host); the second waits for it and the roll-back: neither measures plain
    decoding, of whatever kind it is (the roll-back follows the engine, not the kind)."""
    payoff = known()
    verify(payoff, tokens=24, steps=FRESH)
    decode(payoff, seconds=0.001)  # queued
    decode(payoff, seconds=1.0)  # waited
    decode(payoff, WINDOW)
    assert payoff.ledgers[BATCH].decode == pytest.approx(DECODE)
    other = kind_of(False, 16)
    verify(payoff, tokens=24)
    for seconds in (0.001, 1.0, *[DECODE] * WINDOW):
        payoff.measured(other, Taken(seconds, 16, 16, drafting=False, verified=False))
    assert payoff.ledgers[other].decode == pytest.approx(DECODE)


def test_a_plain_step_of_a_new_shape_is_no_measure_while_drafting() -> None:
    """Members leaving meet row counts not seen yet; a step of one where no member drafted
    builds kernels that plain decoding builds too: it is no trial's cost."""
    payoff = known()
    verify(payoff, tokens=24, steps=WINDOW - 1)
    payoff.measured(BATCH, Taken(0.5, 8, 8, drafting=True, verified=False, new=True))
    verify(payoff, tokens=24)
    assert payoff.allows(BATCH) and not payoff.paused()


def test_a_kind_that_pays_again_starts_its_pauses_short() -> None:
    payoff = known()
    verify(payoff, tokens=12, steps=WINDOW)
    decode(payoff, FIRST_PAUSE)
    verify(payoff, tokens=40, steps=WINDOW)  # its members copy now: 5 tokens a row
    assert payoff.allows(BATCH)
    trial = -(-OVERRUN * WINDOW * DECODE // 0.05)  # steps until the trial's time is spent
    verify(payoff, tokens=8, seconds=0.05, steps=int(trial))  # and then they do not
    assert not payoff.allows(BATCH)
    decode(payoff, FIRST_PAUSE)
    assert payoff.allows(BATCH)  # the first pause's length again


def test_the_decode_steps_are_measured_again_every_so_many_verify_steps() -> None:
    payoff = known()
    verify(payoff, tokens=24, steps=FRESH)
    assert not payoff.allows(BATCH)  # a window of plain steps first
    decode(payoff, AFTER, seconds=1.0)  # the last verify step's roll-back: no measure
    decode(payoff, WINDOW - 1, seconds=0.030)
    assert not payoff.allows(BATCH)
    decode(payoff, seconds=0.030)
    assert payoff.allows(BATCH)
    verify(payoff, tokens=12, steps=WINDOW)  # 1.5 tokens a row for 2 decode steps of 10 ms
    assert payoff.allows(BATCH)  # judged against the decode steps measured anew: it pays


def test_the_decode_steps_measured_anew_are_all_new() -> None:
    """Decode steps taken while verifying (members that drafted nothing) that did not fill
    a window are no part of the measure taken anew."""
    payoff = known()
    decode(payoff, WINDOW - 1, seconds=1.0)
    verify(payoff, tokens=24, steps=FRESH)
    decode(payoff, AFTER, seconds=1.0)  # after a verify step: no measure
    decode(payoff)
    assert not payoff.allows(BATCH)
    decode(payoff, WINDOW - 1)
    assert payoff.allows(BATCH)
    assert payoff.ledgers[BATCH].decode == pytest.approx(DECODE)


def test_a_verify_window_counts_its_slow_steps_its_new_shapes_too() -> None:
    """One verify step in a window that builds its kernels for a second outweighs the
    tokens the others gave: the window does not pay; a window that prefills is no measure."""
    payoff = known()
    verify(payoff, tokens=40, steps=WINDOW, seconds=1.0, prefilled=True)
    assert payoff.allows(BATCH)
    verify(payoff, tokens=40, seconds=1.0, new=True)
    verify(payoff, tokens=40, steps=WINDOW - 1)
    assert not payoff.allows(BATCH)


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


def test_an_idle_engine_counts_no_wait_into_a_step(backend) -> None:
    """A request whose prompt is all cached decodes at once on an idle engine: the seconds
    it waited idle before are no part of that step's."""
    import time

    from steward.worker.engine import ALONE, Engine

    engine = Engine(backend, 8, 1 << 24, speculate="auto")
    first = Generate(id=1, seq=1, attempt=1, max_tokens=4, prompt=PROMPT)
    run(engine, first)
    time.sleep(2.0)
    run(engine, Generate(id=2, seq=1, attempt=1, max_tokens=4, prompt=PROMPT))
    payoff = engine.speculation.payoff
    assert payoff is not None and payoff.ledgers[ALONE].decoding.steps >= 6
    assert payoff.ledgers[ALONE].decoding.seconds < 1.5  # its steps, not the 2 s idle


def test_an_engine_whose_verify_steps_do_not_pay_stops_drafting_and_answers_the_same(
    backend,
) -> None:
    """Each verify step sleeps 200 ms, far more than the tokens it gives are worth on the
    tiny model: `auto` pauses after a window of them, `always` verifies on, the answers
    match."""
    from steward.worker.engine import Engine

    def ask() -> Generate:
        return Generate(id=1, seq=1, attempt=1, max_tokens=96, prompt=PROMPT)

    engines = {mode: Engine(backend, 8, 0, speculate=mode) for mode in ("auto", "always", "none")}
    answers = {mode: run(engine, ask()) for mode, engine in engines.items()}
    assert answers["auto"][0] == answers["none"][0] == answers["always"][0]
    payoff = engines["auto"].speculation.payoff
    assert payoff is not None and payoff.ledgers[kind_of(True, 1)].paused_until > 0
    assert 0 < answers["auto"][1] < answers["always"][1]  # lookup drafted, then paused

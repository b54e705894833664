"""Speculative decoding in the batch (SPEC §11), on the tiny model: a verify step keeps, for
each row, the drafts its own samples agree with and rolls that row's cache back by its own
amount; answers are token for token those without speculation, whatever the drafts (a
prediction right, wrong or partly right, lookup, a grammar), and usage counts the drafts."""

from __future__ import annotations

import time
from pathlib import Path

import llguidance
import mlx.core as mx
import pytest

from steward.front.structured import grammar as compile_schema
from steward.wire.protocol import Done, Generate
from steward.worker.speculation import BETS, DRAFTING, Drafter, Source, shaped

COPYING = "def area(w, h):\n    return w * h\n\n" * 6  # the tiny model's answer copies it


@pytest.fixture(scope="module")
def backend(tiny_model: Path):
    from steward.worker.backend import Backend
    from steward.worker.injection import Injector

    return Backend(tiny_model, Injector([], 1))


@pytest.fixture(scope="module")
def engines(backend):
    """An engine that speculates wherever its members copy and one that does not."""
    from steward.worker.engine import Engine

    return {spec: Engine(backend, 8, 0, speculate=spec) for spec in ("always", "none")}


def answers(engine, reqs: list[Generate]) -> tuple[dict[int, list], dict[int, Done]]:
    """Each request's tokens (id, logprob) and its `Done`, all in one batch."""
    tokens: dict[int, list] = {req.id: [] for req in reqs}
    dones: dict[int, Done] = {}
    for req in reqs:
        engine.add(req)
    while engine.busy:
        step = engine.step()
        for token in step.tokens:
            if token.token >= 0:
                tokens[token.id].append((token.token, token.logprob))
        dones |= {done.id: done for done in step.done}
    return tokens, dones


def same_answers(engines, reqs: list[Generate]) -> dict[int, Done]:
    """The requests answered with and without speculation: the same tokens, log-probs and
    ends. The speculating engine's `Done`s."""
    (fast, fast_done), (slow, slow_done) = (answers(engines[s], reqs) for s in ("always", "none"))
    for req in reqs:
        assert [t for t, _ in fast[req.id]] == [t for t, _ in slow[req.id]], req.id
        for (_, a), (_, b) in zip(fast[req.id], slow[req.id], strict=True):
            assert (a is None) == (b is None)
            if a is not None:
                assert a.token == b.token and a.logprob == pytest.approx(b.logprob, abs=1e-4)
                assert [t.token for t in a.top] == [t.token for t in b.top]
        ends = fast_done[req.id], slow_done[req.id]
        assert [(d.finish_reason, d.completion_tokens, d.stop_sequence) for d in ends] == [
            (ends[1].finish_reason, ends[1].completion_tokens, ends[1].stop_sequence)
        ] * 2
    return fast_done


def ask(id: int, prompt: str = COPYING, max_tokens: int = 48, **extra) -> Generate:
    return Generate(id=id, seq=id, attempt=1, max_tokens=max_tokens, prompt=prompt, **extra)


def test_rows_keep_different_numbers_of_drafts_each_rolled_back_by_its_own(backend) -> None:
    """One verify step over three rows: all drafts right, two of three right, none. Each
    row gives its fed token and the drafts kept, holds exactly those in its cache (as a
    row that decoded them one by one does), and decodes on as that row does."""
    from mlx_lm.sample_utils import greedy_sampler

    from steward.worker.batch import Batch

    prompts = ["Once upon a time", "In the beginning", "def f(x):"]

    def decoding() -> tuple[Batch, list[int]]:
        batch = Batch(backend.model, set(backend.tokenizer.eos_token_ids), 8)
        uids = [
            batch.insert(
                rest=backend.tokenizer.encode(p),
                held=[],
                cache=None,
                sampler=greedy_sampler,
                processors=[],
                max_tokens=100,
            )
            for p in prompts
        ]
        while batch.decoding < len(prompts):
            batch.next()
        return batch, uids

    plain, uids = decoding()
    made: dict[int, list[int]] = {uid: [] for uid in uids}
    held = []  # each step's rows: (tokens held, cache)
    for _ in range(8):
        for out in plain.next()[1]:
            made[out.uid].append(out.token)
        held.append({uid: plain.cache(uid) for uid in uids})
    right, partly, none = uids
    drafts = {right: made[right][1:5], partly: [*made[partly][1:3], made[partly][3] + 1]}

    spec, _ = decoding()
    spec.speculate(drafts, None)
    given: dict[int, list[int]] = {uid: [] for uid in uids}
    for out in spec.next()[1]:
        given[out.uid].append(out.token)
    assert given == {right: made[right][:5], partly: made[partly][:3], none: made[none][:1]}
    assert spec.verified == {right: (4, 4), partly: (3, 2), none: (0, 0)}
    for uid, kept in given.items():
        cache, tokens = spec.cache(uid)
        reference, reference_tokens = held[len(kept) - 1][uid]
        assert tokens == reference_tokens and spec.length(uid) == len(tokens)
        for ours, theirs in zip(cache, reference, strict=True):
            assert ours.offset == theirs.offset
            assert mx.allclose(
                ours.keys[..., : ours.offset, :], theirs.keys[..., : theirs.offset, :], atol=1e-4
            )
    for _ in range(3):  # each row decodes on as the plain one did
        for out in spec.next()[1]:
            given[out.uid].append(out.token)
    assert all(given[uid] == made[uid][: len(given[uid])] for uid in uids)


def test_greedy_seeded_logprobs_and_stops_answer_as_without_speculation(engines) -> None:
    """A batch of a copying answer that drafts, one that asks for log-probabilities, a
    seeded one and one cut by a stop string: each answers as without speculation."""
    dones = same_answers(
        engines,
        [
            ask(1),
            ask(2, logprobs=2),
            ask(3, temperature=1.0, seed=11),
            ask(4, prompt=COPYING + "def volume(", stop=["):"]),
            ask(5, prompt="Once upon a time", max_tokens=7),
        ],
    )
    assert dones[1].accepted_prediction_tokens > 0  # lookup found what it copies
    assert dones[2].accepted_prediction_tokens > 0  # and so with log-probabilities


def test_a_request_alone_verifies_its_drafts_on_the_single_sequence_loop(engines) -> None:
    """Alone it stays on the single-sequence loop (a batch of one decodes at half its speed
    on a GPU) and verifies its drafts there once its answer copies: a step gives it
    several tokens, the next verify step queued before they are read back (a step kept
    whole leaves that one in flight), and the answer is the one without speculation."""
    engine = engines["always"]
    engine.add(ask(6, max_tokens=64))
    most, ahead = 0, 0
    while engine.busy:
        assert not engine.members  # never a row of the batch
        most = max(most, sum(token.token >= 0 for token in engine.step().tokens))
        ahead += engine.solo is not None and engine.solo[1].flight is not None
    assert most > 1 and ahead > 0
    (done,) = same_answers(engines, [ask(6, max_tokens=64)]).values()
    assert done.accepted_prediction_tokens > 0


@pytest.mark.parametrize("then", ["joins", "cancelled"])
def test_a_verify_step_in_flight_is_dropped_when_the_request_leaves_the_loop(
    engines, backend, then: str
) -> None:
    """A request alone with a verify step in flight, when another arrives (it goes on in
    the batch) or when it is cancelled (its cache is kept for the next turn): the step
    queued ahead is dropped with its cache. The answers, and the next request's that finds
    the kept cache, are those without speculation."""
    from steward.worker.engine import Engine

    engine, plain = Engine(backend, 8, 1 << 24, speculate="always"), engines["none"]
    first, second = ask(40, max_tokens=64), ask(41, prompt="Once upon a time", max_tokens=24)
    expected = {i: [t for t, _ in got] for i, got in answers(plain, [first, second])[0].items()}
    engine.add(first)
    got: dict[int, list[int]] = {40: [], 41: []}

    def step() -> None:
        for token in engine.step().tokens:
            if token.token >= 0:
                got[token.id].append(token.token)

    while engine.busy and (engine.solo is None or engine.solo[1].flight is None):
        step()
    assert engine.solo is not None and engine.solo[1].flight is not None
    if then == "joins":
        engine.add(second)
        while engine.busy:
            step()
        assert got == expected
        return
    engine.cancel(first.id)
    while engine.busy:
        step()
    assert got[40] == expected[40][: len(got[40])]
    text = engine.backend.tokenizer.decode(got[40])
    again = ask(42, prompt=COPYING + text, max_tokens=16)  # its prefix is the cache kept
    tokens, dones = answers(engine, [again])
    assert tokens[42] == answers(plain, [again])[0][42]
    assert dones[42].cached_tokens >= len(engine.backend.tokenizer.encode(COPYING)) // 2


def test_a_verify_step_of_a_shape_not_run_yet_is_announced_once(backend) -> None:
    """Before a verify step whose shape (alone or batched, rows, positions a row) the
    worker has not run, the engine says so (the worker sends `Shaping`: MLX builds the
    shape's kernels first); a shape run before is not announced again."""
    from steward.worker.engine import Engine

    engine = Engine(backend, 8, 0, speculate="always")
    said: list[int] = []
    engine.shaping = lambda: said.append(len(engine.verify_shapes))
    answers(engine, [ask(30, max_tokens=48)])
    alone = len(said)
    assert alone and said == list(range(1, alone + 1))  # each shape once, as it came
    answers(engine, [ask(31, max_tokens=48)])  # the same answer: its shapes are known
    assert len(said) == alone
    answers(engine, [ask(32, max_tokens=48), ask(33, max_tokens=48)])  # rows of a batch
    assert len(said) > alone


@pytest.mark.parametrize("how", ["right", "wrong", "partly"])
def test_a_prediction_right_wrong_or_partly_right(engines, backend, how: str) -> None:
    """Usage counts the draft tokens the answer kept and those refused; the answer is the
    one without a prediction."""
    prompt = "Once upon a time"
    tokens, _ = answers(engines["none"], [ask(7, prompt, max_tokens=40)])
    text = backend.tokenizer.decode([t for t, _ in tokens[7]])
    half = len(text) // 2
    prediction = {
        "right": text,
        "wrong": "A completely different text, nothing like the answer at all. " * 3,
        "partly": text[:half] + " something else entirely " + text[half:],
    }[how]
    done = same_answers(engines, [ask(8, prompt, max_tokens=40, prediction=prediction)])[8]
    accepted, rejected = done.accepted_prediction_tokens, done.rejected_prediction_tokens
    if how == "right":
        assert accepted >= 20 and rejected <= 2  # a CPU verifies two drafts at most a step
    elif how == "wrong":
        assert accepted < 10 and rejected > 0
    else:
        assert accepted >= 15 and rejected > 0


def test_a_prediction_longer_than_any_answer_is_cut_and_encoded_off_the_loop(
    engines, backend
) -> None:
    """A prediction is tokenised where the prompt is (`Engine.prepare`, on an encoder
    thread), and no more of it than could hold the context's worth of tokens: a client's
    20 MB prediction drafts as the answer's own text does, not after seconds of the loop."""
    prompt = "Once upon a time"
    tokens, _ = answers(engines["none"], [ask(17, prompt, max_tokens=40)])
    text = backend.tokenizer.decode([t for t, _ in tokens[17]])
    huge = text + " and then" * 2_500_000  # the whole text: 15 s to tokenise on this CPU
    engine = engines["always"]
    started = time.perf_counter()
    ready = engine.prepare(ask(18, prompt, max_tokens=40, prediction=huge))
    prepared = time.perf_counter()
    engine.add(ready)  # on the loop: every other member waits for it
    assert prepared - started < 5.0 and time.perf_counter() - prepared < 1.0
    _, predicted = ready.value()
    assert 0 < len(predicted) <= backend.context_length
    made, dones = [], {}
    while engine.busy:
        step = engine.step()
        made += [token.token for token in step.tokens if token.token >= 0]
        dones |= {done.id: done for done in step.done}
    assert made == [t for t, _ in tokens[17]]
    assert dones[18].accepted_prediction_tokens >= 20


def test_a_seeded_answer_verified_with_drafts_repeats(engines, backend) -> None:
    """Each position is drawn with its own key, and the keys of the positions a verify step
    did not keep are drawn again: the seeded answer is the one without speculation."""
    sampling = {"temperature": 1.0, "seed": 21}
    tokens, _ = answers(engines["none"], [ask(14, "Once", max_tokens=30, **sampling)])
    text = backend.tokenizer.decode([t for t, _ in tokens[14]])
    cut = text[: len(text) // 2] + " and then" + text[len(text) // 2 :]  # refused in the middle
    for id, prediction in ((15, text), (16, cut)):
        reqs = [ask(id, "Once", max_tokens=30, prediction=prediction, **sampling)]
        assert same_answers(engines, reqs)[id].accepted_prediction_tokens > 0


def test_drafts_under_a_grammar_keep_it(engines, backend) -> None:
    """A member under a grammar verifies its drafts with each position masked as the
    grammar allows there: a draft the grammar forbids is never kept, the answer is the
    one without speculation and matches the grammar."""
    schema = {"type": "object", "properties": {"w": {"type": "array", "items": {"type": "string"}}}}
    grammar = compile_schema(schema, "test")
    sampling = {"grammar": grammar, "temperature": 1.0, "seed": 3}
    tokens, _ = answers(engines["none"], [ask(9, "words", max_tokens=32, **sampling)])
    text = backend.tokenizer.decode([t for t, _ in tokens[9]])
    forbidden = text.replace('"', "'")  # single quotes: no JSON string allows them here
    reqs = [
        ask(10, "words", max_tokens=32, prediction=text, **sampling),
        ask(11, "words", max_tokens=32, prediction=forbidden, **sampling),
    ]
    dones = same_answers(engines, reqs)
    assert dones[10].accepted_prediction_tokens > 0
    matcher = llguidance.LLMatcher(backend.grammars.tokenizer, grammar)
    assert matcher.consume_tokens([t for t, _ in tokens[9]])


def test_a_draft_model_drafts_what_does_not_copy(backend) -> None:
    """The model as its own draft model: its greedy continuation is the answer, so its
    drafts are kept, and the answer is the one without speculation."""
    from steward.worker.draft_model import DraftModel
    from steward.worker.engine import Engine

    engines = {
        "always": Engine(backend, 8, 0, speculate="always", draft=DraftModel(backend.model)),
        "none": Engine(backend, 8, 0, speculate="none"),
    }
    reqs = [ask(12, "Once upon a time", max_tokens=24), ask(13, "In the beginning", max_tokens=9)]
    dones = same_answers(engines, reqs)
    assert dones[12].accepted_prediction_tokens >= 12


def test_a_draft_models_reads_padded_to_a_power_of_two_draft_its_greedy_tokens(backend) -> None:
    """Reads of any length (a prompt in parts, then the tokens an answer kept) are fed
    padded to a power of two and the padding trimmed: the drafts are the model's greedy
    continuation all the same, and the cache holds the tokens read, nothing more; warming
    every shape first (as a worker on a GPU does) leaves nothing behind."""
    from mlx_lm.generate import generate_step

    from steward.worker.draft_model import DraftModel

    tokens = backend.tokenizer.encode("Once upon a time, in a land far away, there")
    greedy = [
        int(t)
        for (t, _), _ in zip(
            generate_step(mx.array(tokens), backend.model), range(12), strict=False
        )
    ]
    draft = DraftModel(backend.model)
    draft.warm()
    reader = draft.reader(lambda: 5)  # a prompt read 5 tokens at a time
    while not (drafts := reader.continuation(tokens, 6)):
        pass
    assert drafts == greedy[:6]
    answer = tokens + greedy[:3]  # three kept: read again from there
    assert reader.continuation(answer, 6) == greedy[3:9]
    assert reader.held == answer and reader.cache[0].offset == len(answer)


def test_lookup_drafts_only_while_the_answer_copies() -> None:
    """Three guessed tokens in a row turn drafting on; guesses that fail turn it off."""
    drafter = Drafter([1, 2, 3, 4, 5, 6, 7, 8], [], resumed=False)
    assert not drafter.drafting and drafter.propose(8) == []
    for token in (1, 2, 3):  # the prompt again: the first three are no guess yet
        drafter.extend(token)
    for token in (4, 5, 6):
        drafter.extend(token)
    assert drafter.drafting
    assert drafter.propose(3) == [8, 1, 2]  # 7 stands for the token fed next
    for token in (9, 10, 11, 12):
        drafter.extend(token)
    assert drafter.hits < DRAFTING and not drafter.drafting


def test_a_member_whose_drafts_keep_being_refused_rests_each_time_longer() -> None:
    drafter = Drafter([1, 2, 3, 4], [9] * 8, resumed=False)
    for _ in range(6):
        drafter.observe(4, 0)
    assert not drafter.drafting and drafter.resting == 16 and drafter.rejected == 24
    for _ in range(16):
        drafter.extend(9)  # the prediction's guesses hit meanwhile
    assert drafter.drafting
    for _ in range(6):
        drafter.observe(2, 0)
    assert drafter.resting == 32


def test_a_prediction_is_followed_and_found_again_after_the_answer_leaves_it() -> None:
    prediction = list(range(100, 140))
    drafter = Drafter([1, 2], prediction, resumed=False)
    assert drafter.drafting and drafter.propose(4) == [101, 102, 103, 104]  # 100: the fed one
    for token in [100, 101, 102, 7, 8]:  # leaves the prediction
        drafter.extend(token)
    assert drafter.propose(4) == []  # 102 7 8 is nowhere
    for token in range(110, 120):  # back in it, further on
        drafter.extend(token)
    assert drafter.drafting and drafter.propose(4) == [121, 122, 123, 124]
    drafter.observe(4, 4)
    assert drafter.k == 8 and drafter.accepted == 4
    drafter.observe(8, 2)
    assert drafter.k == 3 and (drafter.accepted, drafter.rejected) == (6, 6)


def test_on_a_gpu_a_verify_step_feeds_few_positions_a_row() -> None:
    """Few shapes, each built once: 2 or 3 positions a row (what MLX's CUDA attention
    computes as it decodes), else the longest row's drafts cut to one less than a power of
    two; every row to that."""
    assert shaped({}) == {}
    assert shaped({1: [5], 2: [6, 7]}) == {1: [5], 2: [6, 7]}
    assert shaped({1: [5, 6, 7], 2: [1]}) == {1: [5, 6], 2: [1]}
    drafts = {1: list(range(6)), 2: list(range(12)), 3: list(range(16))}
    assert {uid: len(d) for uid, d in shaped(drafts).items()} == {1: 6, 2: 12, 3: 15}
    assert {len(shaped({1: [0] * m})[1]) + 1 for m in range(1, 17)} == {2, 3, 8, 16}


def test_a_copy_is_followed_in_order_past_text_of_the_same_shape() -> None:
    """Three functions of one shape: the answer copying the second is drafted the second's
    tokens, and once it leaves it (a renamed name), it is found again past that place,
    not at the latest occurrence (the third)."""
    text = [token for i in (1, 2, 3) for token in (1, 2, 3, 10 * i, 4, 5, 6)]
    source = Source(text, following=False, grows=False)
    assert source.continuation((4, 5, 6), 4) == [1, 2, 3, 20]  # after the first
    for token in (1, 2, 3):
        source.advance(token)
    assert source.continuation((4, 5, 6), 3) == [20, 4, 5]
    source.advance(99)  # the answer writes its own name
    assert not source.following
    assert source.continuation((99, 4, 5), 2) == []  # nowhere: lost
    assert source.continuation((4, 5, 6), 2) == [1, 2]  # the third function's
    assert source.place == 14


def test_an_answer_repeating_its_last_tokens_is_drafted_a_whole_continuation() -> None:
    """Text that repeats itself closely (one token over and over) is copied from an earlier
    occurrence that goes on for the drafts wanted, not from just behind the answer."""
    drafter = Drafter([1, 2, 3], [], resumed=False)
    for token in [7] * 8:
        drafter.extend(token)
    assert drafter.drafting and drafter.propose(4) == [7, 7, 7, 7]


def test_a_prompt_the_answer_copies_stands_before_a_prediction_found_again() -> None:
    """The answer leaves the prediction for a line of the prompt: the prompt, which it keeps
    to, drafts; not the prediction found again at a like line further on."""
    prediction = [1, 2, 3, 10, 4, 5, 6, 1, 2, 3, 20, 4, 5, 6]
    drafter = Drafter([1, 2, 3, 30, 4, 5, 6, 8, 9, 11, 12, 13], prediction, resumed=False)
    for token in (1, 2, 3, 30, 4, 5, 6):
        drafter.extend(token)
    assert drafter.propose(3) == [9, 11, 12]  # 8 stands for the token fed next


def test_a_member_bets_ahead_only_while_its_drafts_are_all_kept() -> None:
    """A verify step queued before the last is read back (`skip`) is thrown away when a
    draft is refused: a member proposes one only after BETS steps that kept every draft."""
    drafter = Drafter([1, 2], list(range(100, 160)), resumed=False)
    assert drafter.propose(4) and drafter.propose(4, skip=5) == []
    for offered in range(1, BETS + 1):
        assert drafter.propose(4, skip=5) == []
        drafter.observe(offered, offered)
    assert drafter.propose(4, skip=5) == [106, 107, 108, 109]
    drafter.observe(8, 3)
    assert drafter.propose(4, skip=5) == []

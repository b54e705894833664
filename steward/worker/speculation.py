"""Where a member's draft tokens come from, and whether it drafts at all.

What an agent writes is mostly text it has seen: a file returned whole with one change, a
path quoted from a tool's output. A member's `Drafter` proposes the tokens that followed
the answer's last `ORDER` tokens where they occurred before: in the request's `prediction`
(OpenAI's Predicted Outputs), from the place the answer has reached in it, else in its own
prompt and answer (prompt lookup). The batch verifies every member's drafts in one forward
(batch.py), so a draft is never wrong, only wasted: the cost of a refused draft is the
compute of verifying it, which a host-bound GPU step barely notices and a CPU does.

So a member drafts only while drafting pays. Before each token is counted, the drafter
checks whether the token it would have guessed is the one that came (`hits`, a running
mean): text that copies turns drafting on within a few tokens, text that does not keeps
it off (it costs one dictionary lookup a token), and a member whose guesses start failing
turns it off again. A prediction starts trusted. How many tokens it drafts (`k`) follows
what its last verify kept: all of them doubles it, fewer makes it one more than kept. A
member whose drafts keep being refused though its guesses hit (`kept`, a running mean of
the share kept) rests from drafting, each rest twice as long as the last.

With `--draft-model`, a member whose text does not copy drafts the draft model's greedy
continuation instead (draft_model.py): always, but for its rests.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import mlx.core as mx
from mlx_lm.models.cache import KVCache, make_prompt_cache

from steward.worker.chunks import BUDGET
from steward.worker.draft_model import MOST
from steward.worker.payoff import Kind, Payoff, Taken

if TYPE_CHECKING:
    from steward.wire.protocol import Generate
    from steward.worker.chunks import Chunks
    from steward.worker.draft_model import DraftModel, Reader

ORDER = 3  # tokens a lookup matches on: fewer finds too many places that do not continue
LOOKBACK = 32768  # a prompt's last tokens indexed for lookup (indexing runs on the step thread)
HIT_WEIGHT = 0.25  # of the latest token in `hits`: three hits in a row turn drafting on
DRAFTING = 0.5  # `hits` at or above which a member drafts
FIRST_K = 4  # drafts a member starts with
MOST_K = {True: 16, False: 8}  # the most it drafts, with a prediction or by lookup
KEPT_WEIGHT = 0.25  # of the latest verify's share kept, in `kept`
KEPT_FLOOR = 0.2  # `kept` below which a member rests from drafting
FIRST_REST = 16  # tokens of a member's first rest; each next one is twice as long
LONGEST_REST = 1024
POSITIONS = 256  # on a GPU, a verify step's rows times its width, at most (padded work)
# A CPU computes every position it verifies, at nearly a step's cost each: few drafts, so a
# refused one costs little (docs/speculation.md has the measure).
MOST_ON_CPU = 2
FEW = 3  # positions a row that MLX's CUDA attention computes as it decodes (`shaped`)
FIRST_READ = 16  # prompt tokens a draft model reads a step before prefill speed is measured
BETS = 4  # verify steps in a row that kept every draft, before a member bets on the next


class Ngrams:
    """A growing token list and where each of its `ORDER`-grams ends."""

    def __init__(self, tokens: Sequence[int]) -> None:
        self.tokens: list[int] = []
        self.ends: dict[tuple[int, ...], list[int]] = {}
        for token in tokens:
            self.append(token)

    def append(self, token: int) -> None:
        self.tokens.append(token)
        if len(self.tokens) >= ORDER:
            self.ends.setdefault(tuple(self.tokens[-ORDER:]), []).append(len(self.tokens))

    def after(self, key: tuple[int, ...], before: int, near: int = 0) -> int | None:
        """Where what followed `key` starts, of its occurrences ending before `before`: the
        first at or past `near` (a prediction's place), else the latest."""
        ends = self.ends.get(key, [])  # in order
        last = bisect_left(ends, before)
        if not last:
            return None
        first = bisect_left(ends, near, 0, last)
        return ends[first] if first < last else ends[last - 1]


class Source:
    """A text the answer may copy (the prediction, or the prompt and answer so far), and
    the place the answer is copying it from: while each token is the one there, the drafts
    go on from there; where one is not, the place is found again by the answer's last
    `ORDER` tokens, first at or past the old place (a file returned whole meets its lines
    in order, though their like recur: twelve functions of one shape), else at their
    latest occurrence (the latest text an agent has seen of a file)."""

    def __init__(self, tokens: Sequence[int], following: bool, grows: bool) -> None:
        """`grows`: the answer's own tokens are appended to it (the context)."""
        self.text = Ngrams(tokens)
        self.grows = grows
        self.place = len(tokens) if grows else 0  # the text's token the answer is at
        self.following = following  # the answer's last tokens were the text's before `place`

    def advance(self, token: int) -> None:
        """The answer's next token, before the text (if it is the answer's own) grows."""
        if self.following:
            tokens = self.text.tokens
            self.following = self.place < len(tokens) and tokens[self.place] == token
            self.place += self.following

    def continuation(self, key: tuple[int, ...], count: int) -> list[int]:
        """Up to `count` tokens from the answer's place, found again by `key` where it is
        lost; in a text that grows, also where the answer copies its own last tokens too
        closely for `count` (a line repeated): an earlier occurrence that continues `count`
        tokens is then taken. (A text that grows ends with `key` itself: not a place.)"""
        tokens = self.text.tokens
        before = len(tokens) + (not self.grows)  # of the occurrences ending before this
        short = self.grows and len(tokens) - self.place < count
        if self.following and not short:
            return tokens[self.place : self.place + count]
        found = self.text.after(key, before - count + 1, near=self.place) if short else None
        if found is None:
            found = self.text.after(key, before, near=self.place)
        self.place, self.following = found or self.place, found is not None
        return tokens[self.place : self.place + count] if self.following else []


class Drafter:
    """One member's drafts: from its prediction while the answer follows it, else by lookup
    in its prompt and answer, else from the draft model. Counts what its drafts kept, for
    usage."""

    def __init__(
        self,
        tokens: Sequence[int],
        prediction: Sequence[int],
        resumed: bool,
        model: Reader | None = None,
    ) -> None:
        """`tokens`: the prompt and any answer resumed after a fault (`resumed`); `model`:
        the member's view of the draft model, if there is one."""
        self.model = model
        self.context = Source(tokens[-LOOKBACK:], following=False, grows=True)
        self.prediction = Source(prediction, not resumed, grows=False) if prediction else None
        self.hits = 1.0 if prediction else 0.0
        self.k = FIRST_K
        self.kept = 1.0
        self.streak = 0  # verify steps in a row that kept every draft
        self.resting = 0  # tokens to go before it drafts again
        self.rest = FIRST_REST  # how long its next rest is
        self.accepted = 0  # drafts the answer kept
        self.rejected = 0  # drafts verified and refused

    @property
    def copying(self) -> bool:
        """Its guesses from the prediction and lookup hit."""
        return self.hits >= DRAFTING

    @property
    def drafting(self) -> bool:
        return (self.copying or self.model is not None) and not self.resting

    def extend(self, token: int) -> None:
        """The answer's next token: was it the one guessed?"""
        guess = self._continuation(1)
        self.hits += HIT_WEIGHT * ((guess == [token]) - self.hits)
        self.resting = max(self.resting - 1, 0)
        if self.prediction is not None:
            self.prediction.advance(token)
        self.context.advance(token)
        self.context.text.append(token)

    def propose(self, room: int, skip: int = 0) -> list[int]:
        """Up to `room` tokens to follow the token the member feeds next, and `skip` more
        positions queued before them (a verify step in flight: its fed token and drafts,
        on the bet that it keeps them all). The token fed next is not known yet (the step
        that draws it may still run), so the continuation's first token stands for it,
        and the continuation's next `skip` for those positions: the drafts are what
        followed them. It bets so only while its verify steps keep every draft (`BETS` in
        a row): a step queued on a lost bet is a step's work thrown away, which on a GPU
        whose steps are bound by the host costs as much as the step it hid."""
        if not self.drafting or (skip and self.streak < BETS):
            return []
        count = 1 + skip + min(self.k, room)
        if self.copying or self.model is None:
            return self._continuation(count)[1 + skip :]
        return self.model.continuation(self.context.text.tokens, count)[1 + skip :]

    def observe(self, offered: int, kept: int) -> None:
        """What a verify step kept of the drafts it was offered."""
        self.accepted += kept
        self.rejected += offered - kept
        most = MOST_K[self.prediction is not None]
        self.k = min(2 * self.k, most) if kept == offered else max(1, kept + 1)
        self.streak = self.streak + 1 if kept == offered else 0
        self.kept += KEPT_WEIGHT * (kept / offered - self.kept) if offered else 0.0
        if self.kept < KEPT_FLOOR:
            self.resting, self.rest = self.rest, min(2 * self.rest, LONGEST_REST)
            self.kept = 1.0  # judged afresh after the rest

    def _continuation(self, count: int) -> list[int]:
        """The `count` tokens that follow the answer's place in a text it copies: the one it
        is still copying first (the prediction before the prompt and answer where both
        are), else the first found again by the answer's last tokens. A place found again
        is a guess; a place the answer kept to is evidence: a prediction found again at a
        like line must not stand before a prompt the answer is copying."""
        tokens = self.context.text.tokens
        key = tuple(tokens[-ORDER:])
        sources = [self.context] if self.prediction is None else [self.prediction, self.context]
        for source in sorted(sources, key=lambda source: not source.following):
            if found := source.continuation(key, count):
                return found
        return []


class Speculation:
    """An engine's speculative decoding: whether it drafts at all (`--speculate`, and a
    model whose cache a verify step can trim: plain KV layers), each member's `Drafter`, and
    each step's drafts: under `auto` only where verify steps of that kind pay (payoff.py),
    under `always` wherever members copy (the benches' and tests' raw mechanism)."""

    def __init__(
        self, model: Any, speculate: str, draft: DraftModel | None, chunks: Chunks
    ) -> None:
        self.on = speculate != "none" and rolls_back(model)
        self.payoff = Payoff() if speculate == "auto" else None
        self.draft = draft
        self.chunks = chunks  # the engine's prefill chunks: how fast a prompt is read
        self.gpu = mx.default_device().type == mx.DeviceType.gpu  # a position costs little

    def drafter(self, req: Generate, tokens: list[int], predicted: list[int]) -> Drafter | None:
        """A member's drafter, from `tokens` (its prompt and resumed answer) and its
        prediction's (`Backend.predicted`); none for the worker's own requests (the canary,
        a warm-up)."""
        if not self.serves(req):
            return None
        reader = None if self.draft is None else self.draft.reader(self.readable)
        return Drafter(tokens, predicted, resumed=bool(req.resume), model=reader)

    def serves(self, req: Generate) -> bool:
        """Whether the request's member drafts at all: never the worker's own requests (the
        canary, a warm-up)."""
        return self.on and not req.internal

    def readable(self) -> int:
        """Prompt tokens the draft model may read in a step: what the target prefills in a
        prefill chunk's time budget (the draft model is the smaller), once measured; never
        more than the shapes it warmed."""
        rate = self.chunks.rate
        return min(max(1, int(rate * BUDGET)), MOST) if rate else FIRST_READ

    def allows(self, of: Kind) -> bool:
        """Whether a step of this kind may verify drafts at all."""
        return self.on and (self.payoff is None or self.payoff.allows(of))

    def measured(self, of: Kind, step: Taken) -> None:
        """A step taken, for the judgement of its kind (payoff.py)."""
        if self.on and self.payoff is not None:
            self.payoff.measured(of, step)

    def drafts(
        self, rows: list[tuple[int, Drafter, int]], width: int, skip: int = 0
    ) -> dict[int, list[int]]:
        """The drafts of a verify step over `width` rows, by uid, of the `rows` that may
        draft: (uid, its drafter, the tokens its answer has room for after the one it
        feeds), each after `skip` positions in flight (`Drafter.propose`). A row carries no
        more than `room` allows; on a GPU, the step's positions a row are a power of two
        (`shaped`)."""
        most = room(width, self.gpu)
        drafts = {}
        for uid, drafter, left in rows:
            if (allowed := min(most, left)) > 0 and (drafted := drafter.propose(allowed, skip)):
                drafts[uid] = drafted
        return shaped(drafts) if self.gpu else drafts


def rolls_back(model: Any) -> bool:
    """Whether a model's cache can be trimmed of the positions a verify step (or a draft
    model's padding) did not keep: plain KV layers, no sliding window nor state."""
    return all(type(layer) is KVCache for layer in make_prompt_cache(model))


def shaped(drafts: dict[int, list[int]]) -> dict[int, list[int]]:
    """`drafts` cut so that the verify step's positions a row (1 + its most drafts) are 2
    or 3, else a power of two: a GPU builds kernels for each new shape on its first step
    (seconds on the H200, where each of 2 to 17 positions at each width was a new shape),
    and few shapes are built few times. MLX's CUDA attention kernel for decoding takes up
    to 3 positions; from 4 on, attention is computed by a few more operations a layer,
    each launched by the host: a verify step of 4 positions cost 10.9 ms against 6.6 ms
    for 3 and 5.0 ms for decoding, on the H200 (bf16 SmolLM2-135M, docs/speculation.md),
    so 4 to 7 positions are cut to 3. Drafts cut cost a step's tokens, not its answer."""
    if not drafts:
        return drafts
    positions = 1 + max(map(len, drafts.values()))
    keep = (min(positions, FEW) if positions < 8 else 1 << positions.bit_length() - 1) - 1
    return {uid: drafted[:keep] for uid, drafted in drafts.items()}


def room(rows: int, gpu: bool) -> int:
    """The most drafts a row of a verify step over `rows` rows may carry. On a GPU, whose
    decode step is bound by the host, every row is padded to the longest, so a wide batch
    verifies fewer each; on a CPU, a few."""
    return max(1, POSITIONS // max(rows, 1) - 1) if gpu else MOST_ON_CPU

"""Continuous batching on mlx-lm's `BatchGenerator`: requests join and leave between steps.

`draw()` runs one decode step for every member (mlx-lm interleaves one prefill chunk of the
prompts that are joining, so a long prompt never freezes the others) and returns what it
drew (`Drawn`): every member's new token, the members that finished, and the step's own
clock (`StepClock`: what it was and how long it kept the link silent, which the supervisor
bounds a silence by). Their text, stop strings and tool calls are worked out apart from the
step (outputs.py), on the worker's output thread; `step()` does both at once (the warm-up,
the benches). mlx-lm's batch is reached through its adapter (batch.py) alone.

A request that arrives at an idle engine runs alone at bare mlx-lm speed (solo.py) until a
second one arrives and it moves into the batch. Anything raised while a
request joins or during a step is a fault of the whole batch: `drop_all()` forgets every
member, whose KV state is now suspect, and the supervisor decides what each request gets.

A member may draft tokens (speculation.py: from its `prediction`, or by lookup in its own
prompt and answer, while that pays): a step where any member drafts is a verify step, which
gives a row its fed token and every draft its own samples agree with (batch.py), each
counted, checked and sent as a token of its own. A request alone moves into the batch once
it drafts.

Each member keeps its own sampler (sampling.py), stop strings, `max_tokens`, usage and
timings. Finished members leave their KV cache to an LRU prompt cache (prompt_cache.py),
bounded in bytes, so a request that shares a prefix with an earlier one (a multi-turn chat, a
common system prompt) prefills only what is new. With `--prompt-cache-dir`, long prefixes
also go to a disk tier that outlives the worker (diskcache.py), so a stream resumed after a
crash loads its context instead of computing it again.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

from steward.wire.protocol import (
    Admitted,
    Calibration,
    Generate,
    Logprob,
    Rejected,
    Step,
    StepClock,
    prompt_text,
)
from steward.worker.answer import Answer
from steward.worker.backend import PREPARE_ERRORS, Backend, over_context, unpreparable
from steward.worker.batch import Batch
from steward.worker.chunks import Chunks
from steward.worker.grammar import RESIDENT, Drafted, Masked
from steward.worker.logits import Processor
from steward.worker.logprobs import Wanted
from steward.worker.outputs import Drawn, Outputs, Row
from steward.worker.payoff import Taken, kind_of
from steward.worker.prepared import Prepared, prepared
from steward.worker.prompt_cache import PromptCache
from steward.worker.sampling import sampler
from steward.worker.solo import Drafts, Solo
from steward.worker.speculation import Drafter, Speculation

if TYPE_CHECKING:
    from steward.worker.diskcache import DiskCache
    from steward.worker.draft_model import DraftModel

CACHE_ENTRIES = 256  # the byte bound is the one that matters; this keeps lookups short

# What a step computes, as far as the kernels MLX builds for it go: (alone, members decoding,
# the positions each feeds (a verify step's: 1 + its most drafts), prompts prefilling, their
# chunk). Its first step is `new_shape` (StepClock).
Shape = tuple[bool, int, int, int, int]
ALONE = kind_of(True, 1)  # a request alone, for the judgement of its verify steps (payoff.py)


class Out(NamedTuple):
    """A solo step's token, shaped as the batch's responses are."""

    token: int
    finish_reason: str | None
    logprobs: Any


@dataclass(eq=False)
class Waiting:
    """A request on its way into the batch; it may wait for an identical prompt (the `n`
    choices of one request) that another member is prefilling."""

    member: Member
    tokens: list[int]  # prompt and resumed answer
    sampler: Any
    processors: list[Any]
    max_tokens: int


@dataclass(eq=False, kw_only=True)
class Member:
    """A request in the engine. The step thread counts its tokens (`count`, `first`); the
    output thread (outputs.py) feeds its `answer` and alone writes `batch` and `ended`."""

    req: Generate
    prompt_tokens: int
    cached_tokens: int
    answer: Answer
    processor: Processor | None
    admitted: float
    marked: str  # what fault-injection markers are looked for in ("" without injection)
    first: float = 0.0
    count: int = 0  # real tokens generated, resumed ones included
    resumed: int = 0  # tokens an earlier attempt generated and the client has
    batch: int = 1  # the largest batch it decoded in
    disk: int | None = None  # prompt tokens loaded from the disk tier (None: not asked)
    drafter: Drafter | None = None  # its draft tokens (None: it does not speculate)
    ended: bool = False  # its Done is made: nothing more of it is sent

    @property
    def new(self) -> int:
        """Tokens this attempt generated."""
        return self.count - self.resumed


class Engine:
    def __init__(
        self,
        backend: Backend,
        max_batch: int,
        cache_bytes: int,
        disk: DiskCache | None = None,
        chunks: Chunks | None = None,  # how prefill chunks are sized (a group's agree)
        speculate: str = "auto",  # "always" or "none": members draft tokens (speculation.py)
        draft: DraftModel | None = None,  # `--draft-model`: a source of drafts
    ) -> None:
        self.backend = backend
        self.max_batch = max_batch
        self.cache = PromptCache(CACHE_ENTRIES, cache_bytes) if cache_bytes > 0 else None
        self.disk = disk  # the prompt cache's tier that outlives the worker (diskcache.py)
        self.outputs = Outputs(disk)  # each member's text, on the output thread in a worker
        self.members: dict[int, Member] = {}  # by the batch's uid
        self.uids: dict[int, int] = {}  # request id -> uid
        self.ends: list[tuple[Member, str]] = []  # ended between steps, with the next
        self.solo: tuple[Member, Solo] | None = None  # the one request running alone
        self.prefilling: dict[tuple[int, ...], int] = {}  # a prompt being prefilled -> uid
        self.waiting: dict[int, list[Waiting]] = {}  # uid -> requests that wait for its prompt
        self.eos = set(backend.tokenizer.eos_token_ids)
        self.chunks = chunks or Chunks()  # prefill chunks sized by measured speed
        self.shapes: set[Shape] = set()  # met by a step so far (a warm-up's included)
        self.verify_shapes: set[tuple[bool, int, int]] = set()  # (alone, rows, positions) run
        self.shaping: Callable[[], None] = lambda: None  # told before a verify step of a new
        # shape, which builds kernels first (the worker says `Shaping` then)
        self.width = 1  # the positions the coming step feeds each decoding row
        self.speculation = Speculation(backend.model, speculate, draft, self.chunks)
        self.stepped = time.perf_counter()  # when the last step ended: a step's wall clock
        self.batch = self._batch()

    def _batch(self) -> Batch:
        batch = Batch(Masked(self.backend.model, self.backend.batch_step), self.eos, self.max_batch)
        self.chunks.reset(batch)
        return batch

    @property
    def busy(self) -> bool:
        return bool(self.members or self.ends or self.solo or self.waiting)

    def prepare(self, req: Generate) -> Prepared:
        """Its prompt's tokens, and its prediction's where it drafts (on an encoder thread:
        inbox.py)."""
        return prepared(req, self._encode)

    def _encode(self, req: Generate) -> tuple[list[int], list[int]]:
        drafts = req.prediction and self.speculation.serves(req)
        return self.backend.encode(req), self.backend.predicted(req) if drafts else []

    def add(self, req: Generate | Prepared) -> Admitted | Rejected:
        """Join the batch (and how many tokens it prefills: its prompt and resumed answer,
        less what the prompt cache holds), or the request's own 400 (it cannot be prepared
        or fit)."""
        if not self.busy:  # what it waited idle is no step's (a prompt all cached decodes at once)
            self.stepped = time.perf_counter()
        ready = req if isinstance(req, Prepared) else self.prepare(req)
        req, backend = ready.req, self.backend
        try:
            prompt, predicted = ready.value()
        except PREPARE_ERRORS as exc:
            return unpreparable(req, exc)
        if not prompt:
            return Rejected(req.id, "validation_error", "The prompt is empty.")
        if rejected := over_context(req, backend.context_length, len(prompt)):
            return rejected
        marked = prompt_text(req) if backend.injector.specs else ""
        backend.injector.hit("prefill", req.seq, req.attempt, marked, req.armed)
        tokens = prompt + list(req.resume)  # a resumed answer continues after its tokens
        # The canary always computes afresh: after a fault, it checks the whole path.
        cache, rest, disk = (None, tokens, None) if req.internal else self._cached(tokens)
        held = len(tokens) - len(rest)  # tokens whose KV came from the prompt cache
        try:
            processor = backend.logits_processor(req)
        except ValueError as exc:
            return Rejected(req.id, "validation_error", str(exc))
        member = Member(
            drafter=self.speculation.drafter(req, tokens, predicted),
            req=req,
            prompt_tokens=len(prompt),
            cached_tokens=min(held, len(prompt)),  # what usage reports: of the prompt
            answer=backend.answer(req, prompt),
            processor=processor,
            admitted=time.perf_counter(),
            marked=marked,
            count=len(req.resume),
            resumed=len(req.resume),
            disk=None if disk is None else min(disk, len(prompt)),
        )
        max_tokens = (req.max_tokens or backend.context_length - len(prompt)) - member.count
        if max_tokens < 1:  # the fault struck after the last token: nothing is left to do
            self.ends.append((member, "length"))
            return Admitted(req.id, 0)
        admitted = Admitted(req.id, len(rest))
        draw = sampler(req, position=len(req.resume))
        processors = [processor] if processor is not None else []
        # A member that drafts under a processor does so in the batch (grammar.Drafted).
        alone = not processors or member.drafter is None or not member.drafter.drafting
        if self.solo is None and not self.members and alone:
            solo = Solo(
                backend.model, tokens, cache, held, draw, processors, max_tokens, self.chunks.size
            )
            self.solo = (member, solo)
            return admitted
        self._handover()
        joining = Waiting(member, tokens, draw, processors, max_tokens)
        if (leader := self.prefilling.get(tuple(tokens))) is not None:
            self.waiting.setdefault(leader, []).append(joining)  # `n` choices, for one
            return admitted  # silent while the one it waits for prefills
        self._join(joining, cache, rest)
        return admitted

    def widen(self, width: int) -> None:
        """Decode up to `width` members together from the next step (`--max-batch auto`)."""
        self.max_batch = width
        self.batch.widen(width)

    def calibrate(self, calibration: Calibration) -> None:
        """Take what the model's first worker measured on this device as if measured here:
        the width, and the prefill speed the chunks are sized by."""
        self.widen(calibration.max_batch)
        if calibration.prefill_tps:
            self.chunks.rate, self.chunks.timed = calibration.prefill_tps, True
        self.chunks.resize(self.batch)

    def cancel(self, req_id: int) -> None:
        if self.solo is not None and self.solo[0].req.id == req_id:
            self.ends.append((self._solo_leave(), "cancelled"))
        elif (uid := self.uids.get(req_id)) is not None:
            self.ends.append((self._leave(uid), "cancelled"))
        for queue in self.waiting.values():
            for joining in [w for w in queue if w.member.req.id == req_id]:
                queue.remove(joining)
                self.ends.append((joining.member, "cancelled"))

    def step(self) -> Step:
        """A step and its text at once (the warm-up, the benches, tests); the worker has
        the text worked out on its output thread instead (outputs.py)."""
        return self.outputs.process(self.draw())

    def draw(self) -> Drawn:
        """One step: every member's next token, or a prefill chunk; the members whose text
        ended at the step before leave once it is processed (outputs.py says why that is
        exact)."""
        started = time.perf_counter()
        if self.solo is not None:
            return self._solo_draw(started)
        of = kind_of(False, len(self.batch.uids))
        drafting = self.speculation.allows(of)
        self._plan(drafting)
        if self.width > 1:
            self._verifying(False, len(self.batch.uids), self.width)
        self.batch.want_rows(any(member.req.logprobs >= 0 for member in self.members.values()))
        self.chunks.resize(self.batch)
        prompts, outputs, prefill = self.batch.next() if self.members else ([], [], 0)
        waited = self.settle()
        prompting = sum(not response.end_of_prompt for response in prompts)
        decoded = len({out.uid for out in outputs})  # a verify step gives a row several
        chunk = self.chunks.size if prefill else 0
        new = self._met((False, decoded, self.width if decoded else 0, prompting, chunk))
        self.chunks.measured(self.batch, timed=not new)
        for response in prompts:
            if response.end_of_prompt and response.uid in self.members:
                self._prefilled(response.uid)
        drawn = Drawn(ends=self.ends, size=len(self.members))
        self.ends = []
        drawn.prefilled = [self.members[r.uid].req.id for r in prompts if r.uid in self.members]
        for uid, (offered, kept) in self.batch.verified.items():
            if (drafted := self.members.get(uid)) is not None and drafted.drafter is not None:
                drafted.drafter.observe(offered, kept)
        members = [self.members.get(out.uid) for out in outputs]
        logprobs = self._logprobs(members, outputs)
        now = time.perf_counter()
        for member, out, logprob in zip(members, outputs, logprobs, strict=True):
            if member is None:
                continue  # its text ended at the step before: it left the batch
            drawn.rows.append(self._row(member, out, now, logprob))
            if out.finish_reason is not None:  # the batch let it go: keep its cache
                self._remember(out.all_tokens, out.prompt_cache, member.req)
                self._forget(out.uid)
        seconds = time.perf_counter() - started - waited
        verified = self.width > 1
        taken = Taken(self._wall(), decoded, len(outputs), drafting, verified, prefill > 0, new)
        self.speculation.measured(of, taken)
        planned = self.chunks.planned(self.batch)
        drawn.clock = StepClock(decoded, prefill, seconds, new, planned)
        return drawn

    def settle(self) -> float:
        """Once the steps drawn are processed (outputs.py), the members whose text ended
        there leave the batch; the seconds that waited, which are no part of a step. Raises
        what processing raised: a fault of the batch, as if the step had."""
        stopped, waited = self.outputs.settled()
        for member in stopped:
            if self.solo is not None and self.solo[0] is member:
                self._solo_leave()
            elif self.members.get(self.uids.get(member.req.id, -1)) is member:
                self._leave(self.uids[member.req.id])
        return waited

    def _verifying(self, alone: bool, rows: int, positions: int) -> None:
        """Before a verify step: `shaping` is told when its shape is new to this worker.
        Its number of positions a row changes with the drafts, and MLX builds a new shape's
        kernels on its first step: on a GPU seconds, which the stall bound, expecting a
        decode step of that width, would take for a hang. (Fault injection's `verify`
        point: a device where verifying costs more.)"""
        self.backend.injector.hit("verify")
        if (shape := (alone, rows, positions)) not in self.verify_shapes:
            self.verify_shapes.add(shape)
            self.shaping()

    def _met(self, shape: Shape) -> bool:
        """Whether `shape` is new to this worker (and from now on, met)."""
        new = shape not in self.shapes
        self.shapes.add(shape)
        return new

    def drop_all(self) -> list[int]:
        """After a fault: every member's state is suspect; start over with an empty batch.
        The ids of those whose answer had not ended."""
        with contextlib.suppress(Exception):  # what processing raised is part of the fault
            self.outputs.settled()
        lost, self.outputs.lost = self.outputs.lost, []
        members = list(self.members.values())
        members += [w.member for queue in self.waiting.values() for w in queue]
        if self.solo is not None:
            members.append(self.solo[0])
            self.solo = None
        self.waiting.clear()
        self.prefilling.clear()
        self.members.clear()
        self.uids.clear()
        self.ends.clear()
        self.backend.batch_step.disarm()
        RESIDENT.clear()
        with contextlib.suppress(Exception):  # a broken device may fail this too
            self.batch.close()
        self.batch = self._batch()
        if self.cache is not None:  # KV computed around a fault is not to be trusted
            self.cache = PromptCache(CACHE_ENTRIES, self.cache.max_bytes)
        if self.disk is not None:  # nor what is not on disk yet (diskcache.py)
            self.disk.fault()
        ids = [member.req.id for member in lost]
        return list(dict.fromkeys(ids + [m.req.id for m in members if not m.ended]))

    def _plan(self, drafting: bool) -> None:
        """The coming step: a verify step when a member drafts (its grammar rows masked by
        `Drafted`), else a plain one whose grammar rows `BatchStep` is armed for, with the
        tokens it feeds, still on the device. A row whose processor only masks (its first
        token drawn) leaves mlx-lm's per-row processor loop, which runs for every row while
        any row has one (and keeps the step plain)."""
        uids = self.batch.uids
        rows = []
        for i, uid in enumerate(uids):
            member = self.members.get(uid)
            if member is None or member.processor is None or member.processor.grammar is None:
                continue
            rows.append((i, member.processor))
            if member.processor.masks_only:
                self.batch.unprocess(i)
        drafts = self._drafts(drafting)
        self.width = 1 + max(map(len, drafts.values()), default=0)
        if drafts:
            self.batch.speculate(drafts, Drafted(rows) if rows else None)
            self.backend.batch_step.disarm()
        elif rows and (fed := self.batch.fed) is not None:
            self.backend.batch_step.arm(fed, rows, len(uids))
        else:
            self.backend.batch_step.disarm()

    def _drafts(self, drafting: bool) -> dict[int, list[int]]:
        """Each decoding member's drafts, by uid, no more than its answer has room for after
        the token it feeds; none while a row is in mlx-lm's per-row processor loop (its
        step is mlx-lm's own), nor where this kind of step does not draft (payoff.py)."""
        if not drafting or self.batch.processing():
            return {}
        rows = []
        for uid in self.batch.uids:
            member = self.members.get(uid)
            if member is None or member.ended or member.drafter is None:
                continue
            limit = member.req.max_tokens or self.backend.context_length - member.prompt_tokens
            rows.append((uid, member.drafter, limit - member.count - 1))
        return self.speculation.drafts(rows, len(self.batch.uids))

    def _logprobs(self, members: list[Member | None], outputs: list[Any]) -> list[Logprob | None]:
        """Each output's log-probabilities, for the members that asked (not for the EOS
        that ends a sequence: it is no token)."""
        asked: list[tuple[int, Wanted]] = [
            (i, (int(out.token), member.req.logprobs, out.logprobs))
            for i, (member, out) in enumerate(zip(members, outputs, strict=True))
            if member is not None and member.req.logprobs >= 0 and out.finish_reason != "stop"
        ]
        found: list[Logprob | None] = [None] * len(outputs)
        if asked:
            rows = self.backend.logprobs.rows([wanted for _, wanted in asked])
            for (i, _), logprob in zip(asked, rows, strict=True):
                found[i] = logprob
        return found

    def _row(self, member: Member, out: Any, now: float, logprob: Logprob | None) -> Row:
        """One generated token (or, at EOS, none), counted: its text comes later."""
        req = member.req
        real = out.finish_reason != "stop"  # the EOS that ends a sequence is no token
        if real:
            member.count += 1
            if member.drafter is not None:
                member.drafter.extend(int(out.token))
            member.first = member.first or now
            if member.count > 1:  # not its first token
                injector = self.backend.injector
                injector.hit("decode", req.seq, req.attempt, member.marked, req.armed, member.count)
        return Row(member, int(out.token) if real else -1, out.finish_reason, logprob, member.count)

    def _solo_draw(self, started: float) -> Drawn:
        """The request alone: a chunk of its prompt, or its next token."""
        assert self.solo is not None
        member, solo = self.solo
        drawn = Drawn(ends=self.ends, size=1)
        self.ends = []
        before = solo.prefilled
        drafting = self.speculation.allows(ALONE)
        token_drawn = solo.next(self._solo_drafts(member, solo, drafting))
        waited = self.settle()
        if token_drawn is None:
            if len(solo.held()) == len(solo.prompt) - 1:  # the prompt is in
                self._save(solo.held(), solo.cache, member.req)
            prefill = solo.prefilled - before
            new = self._met((True, 0, 0, 1, solo.prefill_step))
            seconds = time.perf_counter() - started - waited
            self.chunks.observe(prefill, seconds, timed=not new)
            taken = Taken(self._wall(), 1, 0, drafting, False, prefilled=True)
            self.speculation.measured(ALONE, taken)
            drawn.prefilled = [member.req.id]
            drawn.clock = StepClock(0, prefill, seconds, new, solo.prefill_step)
            return drawn
        new = self._met((True, 1, len(token_drawn), 0, 0))
        if solo.landed is not None and member.drafter is not None:
            member.drafter.observe(*solo.landed)
        for token, row in token_drawn if self.solo is not None else ():  # its text went on
            finish = "stop" if token in self.eos else None
            if finish is None and member.new + 1 >= solo.max_tokens:
                finish = "length"
            out = Out(token, finish, row)
            (logprob,) = self._logprobs([member], [out])
            drawn.rows.append(self._row(member, out, time.perf_counter(), logprob))
            if finish is not None:
                self._solo_leave()
                break
        else:
            if solo.processors and member.drafter is not None and member.drafter.drafting:
                self._handover()  # its text copies: it drafts in the batch, grammar and all
        seconds = time.perf_counter() - started - waited
        verified = solo.landed is not None
        taken = Taken(self._wall(), 1, len(token_drawn), drafting, verified, new=new)
        self.speculation.measured(ALONE, taken)
        drawn.clock = StepClock(1, 0, seconds, new, solo.prefill_step)
        return drawn

    def _wall(self) -> float:
        """Seconds since the step before ended, or since a request came to an idle engine:
        a step's cost as the requests see it, its waits and the worker's work between
        steps too (payoff.py)."""
        before, self.stepped = self.stepped, time.perf_counter()
        return self.stepped - before

    def _solo_drafts(self, member: Member, solo: Solo, drafting: bool) -> Drafts | None:
        """What gives the request alone its drafts, a verify step at a time (none while it
        prefills, or where a processor shapes its logits: it drafts once in the batch,
        where a grammar masks a verify step's rows; nor where drafting does not pay)."""
        drafter = member.drafter
        if not drafting or solo.pending is None or solo.processors or drafter is None:
            return None

        def drafts(skip: int) -> list[int]:
            left = solo.max_tokens - member.new - 1 - skip  # after what it feeds before
            drafted = self.speculation.drafts([(0, drafter, left)], 1, skip).get(0, [])
            if drafted:
                self._verifying(True, 1, 1 + len(drafted))
            return drafted

        return drafts

    def _solo_leave(self) -> Member:
        """The request alone leaves; its cache is kept."""
        assert self.solo is not None
        member, solo = self.solo
        self.solo = None
        solo.settle()
        self._remember(solo.held(), solo.cache, member.req)
        return member

    def _handover(self) -> None:
        """The request running alone joins the batch: its cache and the rest of its work."""
        if self.solo is None:
            return
        member, solo = self.solo
        self.solo = None
        cache, held, rest = solo.handover()
        joining = Waiting(
            member, held + rest, solo.sampler, solo.processors, solo.max_tokens - member.new
        )
        self._join(joining, cache, rest)

    def _join(self, joining: Waiting, cache: list[Any] | None, rest: list[int]) -> None:
        """Into the batch, with `cache` holding what comes before `rest`; a prompt left to
        prefill is one that identical requests can wait for."""
        tokens = joining.tokens
        held = len(tokens) - len(rest)
        uid = self.batch.insert(
            rest=rest,
            held=tokens[:held],
            cache=cache,
            sampler=joining.sampler,
            processors=joining.processors,
            max_tokens=joining.max_tokens,
        )
        self.members[uid] = joining.member
        self.uids[joining.member.req.id] = uid
        if len(rest) > 1:
            self.prefilling[tuple(tokens)] = uid

    def _prefilled(self, uid: int) -> None:
        """A member's prompt is in its cache: the requests waiting for it join with a copy
        (its last token fed again, for their own first token)."""
        if self.disk is not None and (found := self.batch.cache(uid)) is not None:
            cache, held = found
            self._save(held, cache, self.members[uid].req)
        self._unshare(uid)
        for joining in self.waiting.pop(uid, []):
            cache, held = self.batch.cache(uid) or (None, [])
            shared = len(joining.tokens) - 1
            usable = cache is not None and can_trim_prompt_cache(cache)
            if not usable or held[:shared] != joining.tokens[:shared]:
                self._join(joining, None, joining.tokens)  # prefilled for itself
            else:
                trim_prompt_cache(cache, len(held) - shared)
                joining.member.cached_tokens = min(shared, joining.member.prompt_tokens)
                self._join(joining, cache, joining.tokens[shared:])

    def _unshare(self, uid: int) -> None:
        """The member's prompt is no longer one to wait for."""
        for key in [key for key, owner in self.prefilling.items() if owner == uid]:
            del self.prefilling[key]

    def _leave(self, uid: int) -> Member:
        """The member leaves the batch, its cache kept."""
        kept = self.batch.remove(uid, keep=self._caching)
        if kept is not None:
            cache, tokens = kept
            self._remember(tokens, cache, self.members[uid].req)
        return self._forget(uid)

    def _forget(self, uid: int) -> Member:
        """The member is no longer the engine's (the batch has let its row go)."""
        member = self.members.pop(uid)
        del self.uids[member.req.id]
        self._unshare(uid)
        for joining in self.waiting.pop(uid, []):  # left before its prompt was in: alone
            self._join(joining, None, joining.tokens)
        return member

    def _cached(self, tokens: list[int]) -> tuple[list[Any] | None, list[int], int | None]:
        """The longest cached prefix's KV (a copy), the tokens still to prefill, and how
        many came from disk (None: the disk tier was not asked; it loads only what is
        sooner read than prefilled at the speed measured)."""
        cache, rest = self._in_memory(tokens)
        if self.disk is None or len(rest) <= 1:
            return cache, rest, None
        found = self.disk.fetch(tokens, len(tokens) - len(rest), self.chunks.rate)
        if found is None:
            return cache, rest, 0
        cache, held = found
        return cache, tokens[held:], held

    def _in_memory(self, tokens: list[int]) -> tuple[list[Any] | None, list[int]]:
        if self.cache is None:
            return None, tokens
        cache, rest = self.cache.fetch(tokens)
        if cache is not None and not rest:  # all cached: recompute the last token's logits
            if not can_trim_prompt_cache(cache):
                return None, tokens
            trim_prompt_cache(cache, 1)
            rest = tokens[-1:]
        return cache, rest

    @property
    def _caching(self) -> bool:
        return self.cache is not None or self.disk is not None

    def _remember(self, tokens: list[int] | None, cache: list[Any] | None, req: Generate) -> None:
        """A finished member's KV, for the next request that shares its prefix: never the
        canary's or a warm-up's, whose prompts no client sends (and would evict theirs)."""
        if req.internal:
            return
        if self.cache is not None and tokens and cache:
            self.cache.insert(list(tokens), cache)
        self._save(tokens, cache, req)

    def _save(self, tokens: list[int] | None, cache: list[Any] | None, req: Generate) -> None:
        """To the disk tier, off the token path; never the canary's or the warm-up's."""
        if self.disk is not None and tokens and not req.internal:
            self.disk.save(list(tokens), cache, self.chunks.rate)

"""Continuous batching on mlx-lm's `BatchGenerator`: requests join and leave between steps.

`step()` runs one decode step for every member (mlx-lm interleaves one prefill chunk of the
prompts that are joining, so a long prompt never freezes the others) and returns one
`Step`: every member's new token, the members that finished, and the step's own clock
(`StepClock`: what it was and how long it kept the link silent, which the supervisor bounds
a silence by). A request that arrives at an idle engine runs alone at bare mlx-lm speed
(solo.py) until a second one arrives and it moves into the batch. Anything raised while a
request joins or during a step is a fault of the whole batch: `drop_all()` forgets every
member, whose KV state is now suspect, and the supervisor decides what each request gets.

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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from mlx_lm.generate import BatchGenerator
from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

from steward.wire.protocol import (
    Admitted,
    Calibration,
    Done,
    Generate,
    Logprob,
    Rejected,
    Step,
    StepClock,
    Token,
    prompt_text,
)
from steward.worker.answer import Answer
from steward.worker.backend import PREPARE_ERRORS, Backend, over_context, unpreparable
from steward.worker.chunks import Chunks
from steward.worker.decode import Lean
from steward.worker.grammar import RESIDENT, Masked
from steward.worker.logits import Processor
from steward.worker.logprobs import Wanted
from steward.worker.prepared import Prepared, prepared
from steward.worker.prompt_cache import PromptCache
from steward.worker.sampling import sampler
from steward.worker.solo import Solo

if TYPE_CHECKING:
    from steward.worker.diskcache import DiskCache

PREFILL_BATCH = 8  # prompts prefilled together
CACHE_ENTRIES = 256  # the byte bound is the one that matters; this keeps lookups short

# What a step computes, as far as the kernels MLX builds for it go: (alone, members decoding,
# prompts prefilling, their chunk). Its first step is `new_shape` (StepClock).
Shape = tuple[bool, int, int, int]


class Out(NamedTuple):
    """A solo step's token, shaped as the batch's responses are."""

    token: int
    finish_reason: str | None
    logprobs: Any


@dataclass(eq=False)
class Waiting:
    """A request on its way into the generator; it may wait for an identical prompt (the
    `n` choices of one request) that another member is prefilling."""

    member: Member
    tokens: list[int]  # prompt and resumed answer
    sampler: Any
    processors: list[Any]
    max_tokens: int


@dataclass(eq=False)
class Member:
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
    ) -> None:
        self.backend = backend
        self.max_batch = max_batch
        self.cache = PromptCache(CACHE_ENTRIES, cache_bytes) if cache_bytes > 0 else None
        self.disk = disk  # the prompt cache's tier that outlives the worker (diskcache.py)
        self.members: dict[int, Member] = {}  # by the generator's uid
        self.uids: dict[int, int] = {}  # request id -> uid
        self.finished: list[Done] = []  # cancelled between steps, reported with the next
        self.solo: tuple[Member, Solo] | None = None  # the one request running alone
        self.prefilling: dict[tuple[int, ...], int] = {}  # a prompt being prefilled -> uid
        self.waiting: dict[int, list[Waiting]] = {}  # uid -> requests that wait for its prompt
        self.eos = set(backend.tokenizer.eos_token_ids)
        self.chunks = chunks or Chunks()  # prefill chunks sized by measured speed
        self.shapes: set[Shape] = set()  # met by a step so far (a warm-up's included)
        self.generator = self._generator()

    def _generator(self) -> BatchGenerator:
        generator = BatchGenerator(
            Masked(self.backend.model, self.backend.batch_step),
            stop_tokens=[[t] for t in self.eos],
            completion_batch_size=self.max_batch,
            prefill_batch_size=min(PREFILL_BATCH, self.max_batch),
        )
        generator._generation_batch = Lean.empty(generator.model, generator.sampler)
        self.chunks.reset(generator)
        return generator

    @property
    def busy(self) -> bool:
        return bool(self.members or self.finished or self.solo or self.waiting)

    def prepare(self, req: Generate) -> Prepared:
        """Its prompt's tokens (on an encoder thread: inbox.py)."""
        return prepared(req, self.backend.encode)

    def add(self, req: Generate | Prepared) -> Admitted | Rejected:
        """Join the batch (and how many tokens it prefills: its prompt and resumed answer,
        less what the prompt cache holds), or the request's own 400 (it cannot be prepared
        or fit)."""
        ready = req if isinstance(req, Prepared) else self.prepare(req)
        req, backend = ready.req, self.backend
        try:
            prompt = ready.value()
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
        cache, rest, disk = self._cached(tokens) if req.id >= 0 else (None, tokens, None)
        held = len(tokens) - len(rest)  # tokens whose KV came from the prompt cache
        try:
            processor = backend.logits_processor(req)
        except ValueError as exc:
            return Rejected(req.id, "validation_error", str(exc))
        member = Member(
            req,
            len(prompt),
            min(held, len(prompt)),  # what usage reports: of the prompt
            backend.answer(req, prompt),
            processor,
            time.perf_counter(),
            marked,
            count=len(req.resume),
            resumed=len(req.resume),
            disk=None if disk is None else min(disk, len(prompt)),
        )
        max_tokens = (req.max_tokens or backend.context_length - len(prompt)) - member.count
        if max_tokens < 1:  # the fault struck after the last token: nothing is left to do
            self.finished.append(self._done(member, "length"))
            return Admitted(req.id, 0)
        admitted = Admitted(req.id, len(rest))
        draw = sampler(req, position=len(req.resume))
        processors = [processor] if processor is not None else []
        if self.solo is None and not self.members:
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
        self.generator.prefill_batch_size = min(PREFILL_BATCH, width)
        self.generator.completion_batch_size = width

    def calibrate(self, calibration: Calibration) -> None:
        """Take what the model's first worker measured on this device as if measured here:
        the width, and the prefill speed the chunks are sized by."""
        self.widen(calibration.max_batch)
        if calibration.prefill_tps:
            self.chunks.rate, self.chunks.timed = calibration.prefill_tps, True
        self.chunks.resize(self.generator)

    def cancel(self, req_id: int) -> None:
        if self.solo is not None and self.solo[0].req.id == req_id:
            self.finished.append(self._solo_done("cancelled"))
        elif (uid := self.uids.get(req_id)) is not None:
            self.finished.append(self._leave(uid, "cancelled"))
        for queue in self.waiting.values():
            for joining in [w for w in queue if w.member.req.id == req_id]:
                queue.remove(joining)
                self.finished.append(self._done(joining.member, "cancelled"))

    def step(self) -> Step:
        started = time.perf_counter()
        if self.solo is not None:
            return self._solo_step(started)
        self._arm_grammars()
        wanted = any(member.req.logprobs >= 0 for member in self.members.values())
        self.generator._generation_batch.rows_wanted = wanted
        self.chunks.resize(self.generator)
        counted = self.generator._counters.prompt_tokens
        prompts, outputs = self.generator.next() if self.members else ([], [])
        prefill = self.generator._counters.prompt_tokens - counted
        prompting = sum(not response.end_of_prompt for response in prompts)
        new = self._met((False, len(outputs), prompting, self.chunks.size if prefill else 0))
        self.chunks.measured(self.generator, timed=not new)
        for response in prompts:
            if response.end_of_prompt:
                self._prefilled(response.uid)
        tokens: list[Token] = []
        done, self.finished = self.finished, []
        prefilled = [self.members[r.uid].req.id for r in prompts if r.uid in self.members]
        size = len(self.members)
        now = time.perf_counter()
        members = [self.members.get(out.uid) for out in outputs]
        logprobs = self._logprobs(members, outputs)
        for member, out, logprob in zip(members, outputs, logprobs, strict=True):
            if member is None:
                continue
            member.batch = max(member.batch, size)
            finish = self._advance(member, out, now, tokens, logprob)
            if finish is not None:
                self._remember(out.all_tokens, out.prompt_cache, member.req)
                done.append(self._leave(out.uid, finish, generator_done=out.finish_reason))
        seconds = time.perf_counter() - started
        clock = StepClock(len(outputs), prefill, seconds, new, self.chunks.planned(self.generator))
        return Step(tokens=tokens, done=done, prefilled=prefilled, clock=clock)

    def _met(self, shape: Shape) -> bool:
        """Whether `shape` is new to this worker (and from now on, met)."""
        new = shape not in self.shapes
        self.shapes.add(shape)
        return new

    def drop_all(self) -> list[int]:
        """After a fault: every member's state is suspect; start over with an empty batch."""
        ids = [member.req.id for member in self.members.values()]
        ids += [w.member.req.id for queue in self.waiting.values() for w in queue]
        self.waiting.clear()
        self.prefilling.clear()
        if self.solo is not None:
            ids.append(self.solo[0].req.id)
            self.solo = None
        self.members.clear()
        self.uids.clear()
        self.finished.clear()
        self.backend.batch_step.disarm()
        RESIDENT.clear()
        with contextlib.suppress(Exception):  # a broken device may fail this too
            self.generator.close()
        self.generator = self._generator()
        if self.cache is not None:  # KV computed around a fault is not to be trusted
            self.cache = PromptCache(CACHE_ENTRIES, self.cache.max_bytes)
        if self.disk is not None:  # nor what is not on disk yet (diskcache.py)
            self.disk.fault()
        return ids

    def _arm_grammars(self) -> None:
        """Arm the coming step's grammar rows (`BatchStep`) with the tokens it feeds, still
        on the device. A row whose processor only masks (its first token drawn) leaves
        mlx-lm's per-row processor loop, which runs for every row while any row has one.
        (mlx-lm's generation batch is read and edited directly: its `uids`, the tokens it
        sampled last, `_next_tokens`, and each row's `logits_processors`.)"""
        batch = self.generator._generation_batch
        rows = []
        for i, uid in enumerate(batch.uids):
            member = self.members.get(uid)
            if member is None or member.processor is None or member.processor.grammar is None:
                continue
            rows.append((i, member.processor))
            if member.processor.masks_only:
                batch.logits_processors[i] = ()
        if rows and batch._next_tokens is not None:
            self.backend.batch_step.arm(batch._next_tokens, rows, len(batch.uids))
        else:
            self.backend.batch_step.disarm()

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

    def _advance(
        self, member: Member, out: Any, now: float, tokens: list[Token], logprob: Logprob | None
    ) -> str | None:
        """One generated token (or, at EOS, none): its text, past stop strings and tool
        calls; the finish reason if the member is done."""
        req = member.req
        real = out.finish_reason != "stop"  # the EOS that ends a sequence is no token
        if real:
            member.count += 1
            member.first = member.first or now
            if member.count > 1:  # not its first token
                injector = self.backend.injector
                injector.hit("decode", req.seq, req.attempt, member.marked, req.armed, member.count)
        piece = member.answer.feed(int(out.token) if real else None, out.finish_reason)
        if real or not piece.empty:
            tokens.append(piece.token(req.id, int(out.token) if real else -1, logprob))
        return piece.finish

    def _solo_step(self, started: float) -> Step:
        """The request alone: a chunk of its prompt, or its next token."""
        assert self.solo is not None
        member, solo = self.solo
        tokens: list[Token] = []
        done, self.finished = self.finished, []
        before = solo.prefilled
        drawn = solo.next()
        if drawn is None:
            if len(solo.held()) == len(solo.prompt) - 1:  # the prompt is in
                self._save(solo.held(), solo.cache, member.req)
            prefill = solo.prefilled - before
            new = self._met((True, 0, 1, solo.prefill_step))
            seconds = time.perf_counter() - started
            self.chunks.observe(prefill, seconds, timed=not new)
            clock = StepClock(0, prefill, seconds, new, solo.prefill_step)
            return Step(tokens=tokens, done=done, prefilled=[member.req.id], clock=clock)
        token, row = drawn
        finish = "stop" if token in self.eos else None
        if finish is None and member.new + 1 >= solo.max_tokens:
            finish = "length"
        out = Out(token, finish, row)
        (logprob,) = self._logprobs([member], [out])
        finish = self._advance(member, out, time.perf_counter(), tokens, logprob)
        if finish is not None:
            done.append(self._solo_done(finish))
        new = self._met((True, 1, 0, 0))
        clock = StepClock(1, 0, time.perf_counter() - started, new, solo.prefill_step)
        return Step(tokens=tokens, done=done, prefilled=[], clock=clock)

    def _solo_done(self, finish: str) -> Done:
        assert self.solo is not None
        member, solo = self.solo
        self.solo = None
        self._remember(solo.held(), solo.cache, member.req)
        return self._done(member, finish)

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
        """Into the generator, with `cache` holding what comes before `rest`; a prompt left
        to prefill is one that identical requests can wait for."""
        tokens = joining.tokens
        held = len(tokens) - len(rest)
        (uid,) = self.generator.insert(
            [rest],
            max_tokens=[joining.max_tokens],
            caches=[cache],
            all_tokens=[tokens[:held]],
            samplers=[joining.sampler],
            logits_processors=[joining.processors],
        )
        self.members[uid] = joining.member
        self.uids[joining.member.req.id] = uid
        if len(rest) > 1:
            self.prefilling[tuple(tokens)] = uid

    def _prefilled(self, uid: int) -> None:
        """A member's prompt is in its cache: the requests waiting for it join with a copy
        (its last token fed again, for their own first token)."""
        if self.disk is not None and (member := self.members.get(uid)) is not None:
            cache, held = self.generator.extract_cache([uid])[uid]
            self._save(held, cache, member.req)
        self._unshare(uid)
        for joining in self.waiting.pop(uid, []):
            cache, held = self.generator.extract_cache([uid]).get(uid, (None, []))
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

    def _leave(self, uid: int, finish: str, generator_done: str | None = None) -> Done:
        member = self.members.pop(uid)
        del self.uids[member.req.id]
        self._unshare(uid)
        for joining in self.waiting.pop(uid, []):  # left before its prompt was in: alone
            self._join(joining, None, joining.tokens)
        if generator_done is None:  # still in the generator: take it out, keep its cache
            kept = self.generator.remove([uid], return_prompt_caches=self._caching)
            for cache, tokens in kept.values():
                self._remember(tokens, cache, member.req)
        return self._done(member, finish)

    def _done(self, member: Member, finish: str) -> Done:
        """Usage counts the whole answer once; speeds, this attempt's own tokens."""
        now = time.perf_counter()
        new = member.new
        return Done(
            member.req.id,
            finish,
            prompt_tokens=member.prompt_tokens,
            completion_tokens=member.count,
            ttft=(member.first or now) - member.admitted,
            decode_tps=(new - 1) / (now - member.first) if new > 1 else 0.0,
            cached_tokens=member.cached_tokens,
            batch=member.batch,
            reasoning_tokens=member.answer.reasoning_tokens,
            stop_sequence=member.answer.stop_sequence,
            disk=self.disk.use(member.disk) if self.disk and member.req.id >= 0 else None,
        )

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
        if self.cache is not None and tokens and cache:
            self.cache.insert(list(tokens), cache)
        self._save(tokens, cache, req)

    def _save(self, tokens: list[int] | None, cache: list[Any] | None, req: Generate) -> None:
        """To the disk tier, off the token path; never the canary's or the warm-up's."""
        if self.disk is not None and tokens and req.id >= 0:
            self.disk.save(list(tokens), cache, self.chunks.rate)

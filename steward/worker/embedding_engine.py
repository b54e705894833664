"""Batching embeddings: the inputs of every waiting request, in forwards of similar length.

The batch engine's interface (`add`, `cancel`, `step`, `drop_all`, `busy`), so the worker's
loop serves an embedding model as it serves a generating one: requests join between steps,
a fault in a step fails every request in flight (`drop_all`), and the supervisor decides.

Each step is one forward, chosen by length bucket: the oldest waiting input's bucket (its
length rounded up to a power of two), filled with every waiting input of that bucket, from
any request, oldest first, up to `FORWARD_TOKENS` padded tokens. Bucketing keeps padding
under half of any forward (one forward of all lengths padded to the longest wastes most of
it on a mixed batch), and starting from the oldest input keeps it fair: no request waits
behind later ones. A request is done when its last input is.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from steward.wire.protocol import Admitted, Done, Embed, Rejected, Step, Vectors, prompt_text
from steward.worker.embedder import Embedder
from steward.worker.prepared import Prepared, prepared

FORWARD_TOKENS = 8192  # padded tokens in one forward (an input longer than that runs alone)


@dataclass(eq=False)
class Pending:
    req: Embed
    inputs: list[list[int]]
    admitted: float
    marked: str  # what fault-injection markers are looked for in ("" without injection)
    vectors: dict[int, np.ndarray] = field(default_factory=dict)  # by input index
    batch: int = 1  # the most requests in one of its forwards

    @property
    def waiting(self) -> list[int]:
        return [i for i in range(len(self.inputs)) if i not in self.vectors]


def bucket(length: int) -> int:
    return 1 << (length - 1).bit_length()


class EmbeddingEngine:
    def __init__(self, embedder: Embedder, max_batch: int) -> None:
        self.embedder = embedder
        self.max_batch = max_batch  # requests taken at once (their inputs share forwards)
        self.pending: dict[int, Pending] = {}  # by request id, oldest first
        self.finished: list[Done] = []

    @property
    def busy(self) -> bool:
        return bool(self.pending or self.finished)

    def prepare(self, req: Embed) -> Prepared:
        """Its inputs' tokens, or its 400 (on an encoder thread: inbox.py)."""
        return prepared(req, self.embedder.prepare)

    def add(self, req: Embed | Prepared) -> Admitted | Rejected:
        ready = req if isinstance(req, Prepared) else self.prepare(req)
        req, inputs = ready.req, ready.value()
        if isinstance(inputs, Rejected):
            return inputs
        marked = prompt_text(req) if self.embedder.injector.specs else ""
        self.pending[req.id] = Pending(req, inputs, time.perf_counter(), marked)
        return Admitted(req.id, sum(map(len, inputs)))

    def cancel(self, req_id: int) -> None:
        if (gone := self.pending.pop(req_id, None)) is not None:
            self.finished.append(self._done(gone, "cancelled", b""))

    def step(self) -> Step:
        step = Step(done=self.finished)
        self.finished = []
        chosen = self._choose()
        if not chosen:
            return step
        members = list(dict.fromkeys(pending for pending, _ in chosen))
        for pending in members:
            req = pending.req
            self.embedder.injector.hit("prefill", req.seq, req.attempt, pending.marked, req.armed)
        vectors = self.embedder.forward([pending.inputs[i] for pending, i in chosen])
        for (pending, i), vector in zip(chosen, vectors, strict=True):
            pending.vectors[i] = vector
        for pending in members:
            pending.batch = max(pending.batch, len(members))
            if pending.waiting:
                step.prefilled.append(pending.req.id)
                continue
            del self.pending[pending.req.id]
            ordered = np.stack([pending.vectors[i] for i in range(len(pending.inputs))])
            data = self.embedder.finish(ordered, pending.req.dimensions)
            step.done.append(self._done(pending, "stop", data))
        return step

    def drop_all(self) -> list[int]:
        """After a fault: every request in flight fails with it, to be replayed or not."""
        ids = list(self.pending)
        self.pending.clear()
        self.finished.clear()
        return ids

    def _choose(self) -> list[tuple[Pending, int]]:
        """The next forward's inputs: the oldest waiting input's length bucket, filled."""
        waiting = [(p, i) for p in self.pending.values() for i in p.waiting]
        if not waiting:
            return []
        head, first = waiting[0]
        width = bucket(len(head.inputs[first]))
        rows = max(1, FORWARD_TOKENS // width)
        same = [(p, i) for p, i in waiting if bucket(len(p.inputs[i])) == width]
        return same[:rows]

    def _done(self, pending: Pending, finish: str, data: bytes) -> Done:
        dimensions = pending.req.dimensions or self.embedder.dimensions
        return Done(
            pending.req.id,
            finish,
            prompt_tokens=sum(map(len, pending.inputs)),
            completion_tokens=0,
            ttft=time.perf_counter() - pending.admitted,
            decode_tps=0.0,
            batch=pending.batch,
            embedding=Vectors(dimensions, data) if data else None,
        )

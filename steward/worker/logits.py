"""What shapes one request's distribution before it is sampled: `logit_bias`, the end
tokens suppressed (`ignore_eos`), the presence, frequency and repetition penalties, and the
grammar's mask.

An end token is suppressed by a bias of -inf: it is never sampled, so every path (the batch,
a request alone, mlx-vlm's loop) generates `max_tokens` tokens without a stop rule of its own.

mlx-lm calls a processor as `processor(tokens, logits)` before each sampling, with the
token just fed last. The processor counts the answer's tokens itself, on the device, so
the penalties never wait for a token to reach the CPU and are the same whether the request
runs alone, in a batch, or resumes after a fault: they count the answer's tokens (the
prompt's do not count, as in vLLM's presence and frequency penalties).

Only a grammar needs each token on the CPU. In a batch, `BatchStep` feeds every grammar
the step's tokens at once and masks the batch's logits together (`given`); alone, and for
an answer's first token, the processor reads the token and the grammar masks the logits
itself. The token was queued a step earlier, so reading it rarely waits. Either way the
grammar is fed and the mask computed on a thread while the model call is launched
(`grammar.launched`).
"""

from __future__ import annotations

from collections.abc import Collection

import mlx.core as mx

from steward.wire.protocol import Generate
from steward.worker.grammar import Grammar


class Processor:
    def __init__(
        self, req: Generate, grammar: Grammar | None, suppressed: Collection[int] = ()
    ) -> None:
        """`suppressed`: the tokens never to sample (the end tokens, for `ignore_eos`)."""
        bias = req.logit_bias | dict.fromkeys(suppressed, -mx.inf)
        self.bias = (mx.array(list(bias)), mx.array(list(bias.values()))) if bias else None
        self.presence = req.presence_penalty
        self.frequency = req.frequency_penalty
        self.repetition = req.repetition_penalty
        self.penalised = req.penalised
        self.grammar = grammar
        self.shapes = bool(self.bias or self.penalised or grammar)  # else: no need to call it
        self.masks_only = not (self.bias or self.penalised)  # in a batch, `BatchStep` does it
        self.counts: mx.array | None = None  # each token's count in the answer, once sized
        self.resumed = list(req.resume)  # tokens counted before the first call
        self.fed = False  # the last token fed is the answer's (not the prompt's)
        self.given = False  # the engine fed the grammar and filled its mask for this step

    def give(self, token: int) -> bool:
        """In a batch (`BatchStep`): the token this step feeds; the grammar's mask is then
        applied with the whole batch's. False: the grammar refused it."""
        self.given = True
        return not (self.fed and self.grammar is not None) or self.grammar.accept(token)

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        grammar, given = self.grammar, self.given
        if self.fed:
            self._count(tokens[-1:])
        fed, self.fed = self.fed, True
        self.given = False
        if given and self.masks_only:
            return logits  # masked with the batch's
        dtype = logits.dtype
        if self.bias is not None:
            logits = logits.at[:, self.bias[0]].add(self.bias[1])
        if self.penalised:
            logits = self._penalise(logits)
        if grammar is not None and not given:  # alone, or the answer's first token
            logits = grammar.mask(logits, _last(tokens) if fed else None)
        return logits if logits.dtype == dtype else logits.astype(dtype)

    def rewind(self) -> None:
        """The next call feeds the last token again (a solo request handed to the batch):
        it is counted already."""
        self.fed = False

    def _count(self, token: mx.array) -> None:
        if self.penalised and self.counts is not None:
            self.counts = self.counts.at[token].add(1)

    def _penalise(self, logits: mx.array) -> mx.array:
        if self.counts is None:
            self.counts = mx.zeros((logits.shape[-1],), mx.float32)
            if self.resumed:
                self.counts = self.counts.at[mx.array(self.resumed)].add(1)
        seen = self.counts > 0
        if self.repetition != 1.0:
            penalised = mx.where(logits < 0, logits * self.repetition, logits / self.repetition)
            logits = mx.where(seen, penalised, logits)
        return logits - self.presence * seen - self.frequency * self.counts


def _last(tokens: mx.array) -> int:
    """The token just fed. Alone, `tokens` is that token's own array, already on its way
    (queued before the forward pass): reading it waits for nothing else."""
    return int(tokens.item() if tokens.size == 1 else tokens[-1].item())

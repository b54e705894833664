"""Whether the backend decodes slowly: `degraded`, from answers like the canary's.

Only a request decoded alone, whole (not resumed), with nothing shaping its logits or read
per token, says how fast the backend decodes, like the canary that set the baseline; when
the median of the last few such answers is below `SLOW` of that baseline, the backend is
`degraded` (one answer alone is noise on a busy machine). How long a silence may last is
another matter, judged from the worker's own step clock (bounds.py).
"""

from __future__ import annotations

import statistics
from collections import deque

from steward.wire.protocol import Done, Embed, Generate

SLOW = 0.5  # decode below half the baseline: degraded
LIKE = 5  # requests like the canary whose median is the recent decode speed (one is noise)
JUDGED = 3  # of them, the fewest that judge the backend slow


def plain(req: Generate) -> bool:
    """Decoded as the canary is: nothing shapes its logits (a grammar, penalties,
    `logit_bias`) or truncates them (top_p, top_k, min_p: top_p sorts the vocabulary every
    token, which halves a small model's speed on a CPU), and nothing more is read per token
    (logprobs). Its speed says how fast the backend is, not what the request asked of it."""
    return (
        req.grammar is None
        and req.logprobs < 0
        and not req.logit_bias
        and not req.penalised
        and req.top_p == 1.0
        and req.top_k <= 0
        and req.min_p == 0.0
    )


class Speeds:
    def __init__(self) -> None:
        self.baseline_tps = 0.0  # the first canary's decode speed
        self.recent_tps = 0.0  # the median of the last requests that measure the backend
        self._like: deque[float] = deque(maxlen=LIKE)

    def canary(self, done: Done) -> None:
        """The canary's answer: the baseline, from the first one."""
        if not self.baseline_tps:
            self.baseline_tps = done.decode_tps

    def finished(self, req: Generate | Embed, done: Done, whole: bool) -> None:
        """A client's answer: the recent speed, if it is like the canary's (an embedding
        decodes nothing)."""
        if not isinstance(req, Generate):
            return
        if whole and done.batch == 1 and plain(req) and done.completion_tokens >= 8:
            self._like.append(done.decode_tps)
            self.recent_tps = statistics.median(self._like)

    def slow(self) -> str | None:
        """Why decode counts as slow now, if it does."""
        if len(self._like) >= JUDGED and self.recent_tps < SLOW * self.baseline_tps:
            return f"decode {self.recent_tps:.1f} tok/s, under half of {self.baseline_tps:.1f}"
        return None

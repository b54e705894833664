"""Log-probabilities in OpenAI's shape: the chosen token's and the top alternatives', from
the distribution the sampler drew from: after `logit_bias`, the penalties and the grammar's
mask; before temperature and the top_p, top_k and min_p filters (so the numbers do not
depend on how the token was then drawn, as with OpenAI's). One device call per step for
the whole batch."""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx

from steward.wire.protocol import Logprob, TopLogprob

Wanted = tuple[int, int, mx.array]  # (token, how many top entries, the step's logprobs row)


class Logprobs:
    def __init__(self, decode_bytes: Callable[[list[int]], bytes]) -> None:
        self.decode_bytes = decode_bytes
        self.parts: dict[int, tuple[str, bytes]] = {}

    def part(self, token: int) -> tuple[str, bytes]:
        """A token's text and bytes; a token that is part of a character shows its bytes."""
        if (known := self.parts.get(token)) is None:
            raw = self.decode_bytes([token])
            try:
                text = raw.decode()
            except UnicodeDecodeError:
                text = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
            known = self.parts[token] = (text, raw)
        return known

    def rows(self, wanted: list[Wanted]) -> list[Logprob]:
        rows = mx.stack([row.reshape(-1) for _, _, row in wanted]).astype(mx.float32)
        chosen = mx.array([token for token, _, _ in wanted])
        values = mx.take_along_axis(rows, chosen[:, None], axis=-1)[:, 0]
        k = max(count for _, count, _ in wanted)
        if k > 0:
            top = mx.argpartition(-rows, kth=k - 1, axis=-1)[:, :k]
            top_values = mx.take_along_axis(rows, top, axis=-1)
            mx.eval(values, top, top_values)
            tops = zip(top.tolist(), top_values.tolist(), strict=True)
        else:
            mx.eval(values)
            tops = iter(lambda: ([], []), None)
        out = []
        for (token, count, _), value, (ids, logprobs) in zip(
            wanted, values.tolist(), tops, strict=False
        ):
            best = sorted(zip(logprobs, ids, strict=True), reverse=True)[:count]
            out.append(
                Logprob(
                    *self.part(token),
                    value,
                    [TopLogprob(*self.part(i), lp) for lp, i in best],
                )
            )
        return out

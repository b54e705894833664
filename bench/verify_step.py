"""What a verify step costs against a decode step, on this device (SPEC §11).

Speculative decoding pays when a step that verifies `k` drafts a row costs little more
than a step that decodes one token. This prints milliseconds per step, the model called
in this process, no server:

- alone: one sequence, mlx-lm's pipelined decode step (solo.py's) against a verify of
  1 + k positions on the same cache, which waits for its samples and trims what it did
  not keep;
- batched, at each width: steward's batch step (batch.py's `Lean`) against its verify
  steps of k drafts a row, every row keeping all, none, or a different number (`mixed`:
  rows then roll their caches by different amounts). How many a row keeps is set here,
  not by its samples: the work is the same whatever the tokens.

MLX is set up as a worker sets it up (runtime.py's `environment`: on CUDA, no cuDNN
attention, which builds a graph for every new shape and so for every verify step).

    python -m bench.verify_step --model DIR [--widths 1,8,32] [--k 2,4,8] [--steps 32]
"""

from __future__ import annotations

import argparse
import itertools
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from steward.worker.runtime import environment

environment(os.environ)  # before MLX is imported: it reads its settings once

import mlx.core as mx  # noqa: E402
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache  # noqa: E402
from mlx_lm.sample_utils import make_sampler  # noqa: E402

from steward.worker import batch as batch_module  # noqa: E402
from steward.worker.batch import Batch  # noqa: E402

PROMPT = 512  # tokens of each row's prompt


def timed(step: Callable[[], Any], steps: int) -> float:
    """Milliseconds per call of `step`, after four untimed calls, everything evaluated."""
    for _ in range(4):
        step()
    mx.synchronize()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    mx.synchronize()
    return 1000 * (time.perf_counter() - started) / steps


def prompt(row: int) -> list[int]:
    return [(row * 7919 + i * 104729) % 30_000 + 100 for i in range(PROMPT)]


def alone(model: Any, k: int, steps: int) -> tuple[float, float]:
    """(decode step, verify step of 1 + k positions) alone, milliseconds."""
    greedy = make_sampler(0.0)
    cache = make_prompt_cache(model)
    mx.eval(model(mx.array(prompt(0))[None], cache=cache))
    fed = [mx.array([5])]

    def decode() -> None:  # solo.py's step: the next is queued before a token is read
        logits = model(fed[0][None], cache=cache)[:, -1, :]
        token = greedy(logits - mx.logsumexp(logits, keepdims=True))
        mx.async_eval(token)
        fed[0] = token

    def verify() -> None:
        logits = model(mx.array([[5] * (1 + k)]), cache=cache)
        drawn = greedy((logits - mx.logsumexp(logits, axis=-1, keepdims=True))[0])
        drawn.tolist()
        trim_prompt_cache(cache, k)  # keeps one, as a decode step does

    return timed(decode, steps), timed(verify, steps)


def batched(model: Any, width: int, k: int, steps: int) -> dict[str, float]:
    """Milliseconds per step of `width` rows: decode, and verify with rows keeping all of
    `k` drafts, none, or each a different number."""
    batch = Batch(model, set(), width)
    greedy = make_sampler(0.0)
    uids = [
        batch.insert(
            rest=prompt(i), held=[], cache=None, sampler=greedy, processors=[], max_tokens=10**6
        )
        for i in range(width)
    ]
    while batch.decoding < width:
        batch.next()
    real = batch_module.agreed
    found = {"decode": timed(batch.next, steps)}
    for name, kept in (
        ("all", lambda i: k),
        ("none", lambda i: 0),
        ("mixed", lambda i: i % (k + 1)),
    ):
        rows = itertools.cycle(range(width))
        batch_module.agreed = lambda draft, drawn, kept=kept, rows=rows: kept(next(rows))

        def verify() -> None:
            batch.speculate({uid: [7] * k for uid in uids}, None)
            batch.next()

        found[name] = timed(verify, steps)
    batch_module.agreed = real
    batch.close()
    return found


def main() -> None:
    from mlx_lm.utils import load

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--widths", default="1,8,32")
    parser.add_argument("--k", default="2,4,8")
    parser.add_argument("--steps", type=int, default=32)
    args = parser.parse_args()
    model, _ = load(str(args.model))
    ks = [int(k) for k in args.k.split(",")]
    print(f"{mx.default_device()}; {args.model}; prompts of {PROMPT} tokens; ms per step")
    widths, steps = [int(w) for w in args.widths.split(",")], args.steps
    for k in ks:
        decode, verify = alone(model, k, steps)
        print(f"alone  k={k}: decode {decode:7.2f}  verify {verify:7.2f}  ({verify / decode:.2f}x)")
    for width, k in itertools.product(widths, ks):
        found = batched(model, width, k, steps)
        rest = "  ".join(f"{name} {ms:7.2f} ({ms / found['decode']:.2f}x)"
                         for name, ms in found.items() if name != "decode")  # fmt: skip
        print(f"batch {width:3} k={k}: decode {found['decode']:7.2f}  {rest}", flush=True)


if __name__ == "__main__":
    main()

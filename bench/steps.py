"""Where a step's time goes with and without speculation: the steps by sort, alone or in a
batch.

The worker's engine in this process (MLX set up as a worker sets it up), no server: the
code edit of bench/speculation.py (each of `c` members its own file, asked together),
plainly (lookup) and with its file as the prediction, and a chat story, on an engine that
never drafts (`none`), one that drafts wherever its text copies (`always`) and one that
drafts where drafting pays (`auto`, payoff.py), `--rounds` times in turn. Printed for
each: tokens a second (a request alone: after its first; a batch: all its tokens over the
whole time), and the steps by sort (decode, verify, prefill, and a batch's steps that
prefill while they decode or verify; a step of a shape new to its engine apart, as `new`:
MLX builds kernels then) with their milliseconds a step, tokens a step, and the drafts kept
of those offered.

    python -m bench.steps --model DIR [--concurrency 1,32] [--tokens 400] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from steward.worker.runtime import environment

environment(os.environ)  # before MLX is imported: it reads its settings once

from bench.speculation import EDIT, STORY, source  # noqa: E402
from steward.wire.protocol import Generate  # noqa: E402
from steward.worker.backend import Backend  # noqa: E402
from steward.worker.engine import Engine  # noqa: E402
from steward.worker.injection import Injector  # noqa: E402
from steward.worker.runtime import bound_cache  # noqa: E402

MODES = ("none", "always", "auto")


def sort_of(alone: bool, width: int, step_tokens: int, prefilled: int, landed: object) -> str:
    """What a step was: a request alone's by what its drafter saw, a batch's by the
    positions it fed a row (`width`) and whether it prefilled too."""
    if alone:
        return "verify" if landed is not None else "decode" if step_tokens else "prefill"
    sort = "verify" if width > 1 else "decode" if step_tokens else ""
    return "+".join(filter(None, ["prefill" if prefilled else "", sort])) or "idle"


def run(engine: Engine, reqs: list[Generate]) -> str:
    """The requests answered together, the steps sorted."""
    for req in reqs:
        engine.add(req)
    sorts: dict[str, list[float]] = {}  # sort: [steps, seconds, tokens]
    count, began, first = 0, time.perf_counter(), None
    kept = offered = 0
    while engine.busy:
        solo = engine.solo
        started = time.perf_counter()
        step = engine.step()
        tokens = sum(token.token >= 0 for token in step.tokens)
        landed = solo[1].landed if solo is not None else None
        clock = step.clock
        prefilled = clock.prefill if clock is not None else 0
        sort = sort_of(solo is not None, engine.width, tokens, prefilled, landed)
        if sort.endswith("verify"):  # the batch's verified counts stand until it verifies again
            verified = [landed] if solo is not None else engine.batch.verified.values()
            for drafts, took in verified:
                offered, kept = offered + drafts, kept + took
        if clock is not None and clock.new_shape:  # kernels built: apart from steady steps
            sort = "new " + sort
        figures = sorts.setdefault(sort, [0, 0.0, 0])
        figures[0] += 1
        figures[1] += time.perf_counter() - started
        figures[2] += tokens
        if tokens and first is None:
            first = time.perf_counter()
        count += tokens
    since = first if len(reqs) == 1 else began
    speed = count / (time.perf_counter() - since) if since else 0.0
    parts = [f"{speed:7.1f} tok/s"]
    for sort, (steps, seconds, tokens) in sorted(sorts.items()):
        each = f"{1000 * seconds / steps:6.2f} ms {tokens / steps:5.2f} tok"
        parts.append(f"{sort} {steps:4} x {each}")
    return "  ".join([*parts, f"kept {kept}/{offered}"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--concurrency", default="1", help="members asked together, e.g. 1,32")
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--functions", type=int, default=12, help="in the edited file")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    bound_cache()
    backend = Backend(args.model, Injector([], 1))
    ids = iter(range(1, 1 << 30))

    def asks(sort: str, c: int, most: int = args.tokens) -> list[Generate]:
        reqs = []
        for client in range(c):
            file, function = source(args.functions, client)
            edit = EDIT.format(file=file, function=function, old="scale", new="factor")
            text, prediction = {
                "edit": (edit, ""),
                "edit+prediction": (edit, f"```python\n{file}```"),
                "story": (STORY, ""),
            }[sort]
            n = next(ids)
            chat = [{"role": "user", "content": text}]
            reqs.append(
                Generate(
                    id=n,
                    seq=n,
                    attempt=1,
                    max_tokens=most,
                    messages=chat,
                    prediction=prediction,
                )
            )
        return reqs

    width = max(levels)
    engines = {mode: Engine(backend, width, 0, speculate=mode) for mode in MODES}
    for c in levels:
        for engine in engines.values():  # the first shapes built
            run(engine, asks("story", c, 16))
        for round_ in range(args.rounds):
            for mode, engine in engines.items():
                for sort in ("edit", "edit+prediction", "story"):
                    figures = run(engine, asks(sort, c))
                    print(f"c={c:<3} round {round_}  {mode:7}{sort:16}{figures}", flush=True)


if __name__ == "__main__":
    main()

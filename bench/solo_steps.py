"""Where a request alone's time goes with and without speculation: its steps, by sort.

The worker's engine in this process (MLX set up as a worker sets it up), no server: the
code edit of bench/speculation.py asked alone, plainly (lookup) and with its file as the
prediction, and a chat story, on an engine that never drafts (`none`) and one that drafts
wherever its text copies (`always`), `--rounds` times in turn. Printed for each: tokens a
second after the first, and the steps by sort (decode, verify, prefill) with their
milliseconds a step, tokens a step, and the drafts kept of those offered.

    python -m bench.solo_steps --model DIR [--tokens 400] [--rounds 3]
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


def run(engine: Engine, req: Generate) -> str:
    """The request answered alone, its steps sorted by what the engine's drafter saw."""
    engine.add(req)
    sorts: dict[str, list[float]] = {}  # sort: [steps, seconds, tokens]
    count, first = 0, None
    kept = offered = 0
    while engine.busy:
        solo = engine.solo
        started = time.perf_counter()
        tokens = sum(token.token >= 0 for token in engine.step().tokens)
        landed = solo[1].landed if solo is not None else None
        sort = "verify" if landed is not None else "decode" if tokens else "prefill"
        if landed is not None:
            offered, kept = offered + landed[0], kept + landed[1]
        figures = sorts.setdefault(sort, [0, 0.0, 0])
        figures[0] += 1
        figures[1] += time.perf_counter() - started
        figures[2] += tokens
        if tokens and first is None:
            first = time.perf_counter()
        count += tokens
    speed = count / (time.perf_counter() - first) if first else 0.0
    parts = [f"{speed:7.1f} tok/s"]
    for sort, (steps, seconds, tokens) in sorted(sorts.items()):
        each = f"{1000 * seconds / steps:6.2f} ms {tokens / steps:5.2f} tok"
        parts.append(f"{sort} {steps:4} x {each}")
    return "  ".join([*parts, f"kept {kept}/{offered}"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--functions", type=int, default=12, help="in the edited file")
    args = parser.parse_args()
    bound_cache()
    backend = Backend(args.model, Injector([], 1))
    ids = iter(range(1, 1 << 30))
    file, function = source(args.functions, 0)
    edit = EDIT.format(file=file, function=function, old="scale", new="factor")
    predicted = f"```python\n{file}```"
    asks = {"edit": (edit, ""), "edit+prediction": (edit, predicted), "story": (STORY, "")}

    def ask(text: str, prediction: str, most: int) -> Generate:
        n = next(ids)
        chat = [{"role": "user", "content": text}]
        return Generate(
            id=n, seq=n, attempt=1, max_tokens=most, messages=chat, prediction=prediction
        )

    engines = {mode: Engine(backend, 8, 0, speculate=mode) for mode in ("none", "always")}
    for engine in engines.values():
        run(engine, ask(STORY, "", 64))  # the first shapes built
    for round_ in range(args.rounds):
        for mode, engine in engines.items():
            for name, (text, prediction) in asks.items():
                figures = run(engine, ask(text, prediction, args.tokens))
                print(f"round {round_}  {mode:7}{name:16}{figures}", flush=True)


if __name__ == "__main__":
    main()

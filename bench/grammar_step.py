"""A constrained batch step against an unconstrained one, in one process, rounds alternating.

The engine in process (no HTTP, no IPC), `--members` requests decoding at once, each
`--tokens` long: unconstrained, then under a JSON schema with the masks on each of
`BatchStep`'s paths: `auto` (its own choice), `thread` (masks computed on a thread while the
model call is built, every step) and `late` (masks computed after the build, every step).
Prints each mode's median step time and plain / mode (target >= 0.90), and for the grammar
modes how many steps took the thread. The schema is `bench.constrained`'s: an array of
strings that cannot close within the budget, so every mode runs to length.

    python -m bench.grammar_step [--model DIR] [--members 32] [--tokens 128] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

MODES = {"plain": None, "auto": None, "thread": True, "late": False}  # mode -> `BatchStep.fixed`


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="MLX model dir (default: the default model)")
    parser.add_argument("--members", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    from bench.constrained import schema
    from bench.overhead import bench_model
    from steward.front import structured
    from steward.worker import grammar
    from steward.worker.backend import Backend
    from steward.worker.engine import Engine
    from steward.worker.injection import Injector
    from steward.worker.protocol import Generate

    compiled = structured.grammar(schema(args.tokens), "bench")
    engine = Engine(Backend(bench_model(args.model), Injector([], 1)), args.members, 0)
    step = engine.backend.batch_step
    paths: list[bool] = []  # each step's: on the thread or not
    start = step._start

    def counted(armed: grammar.Armed, threaded: bool) -> None:
        paths.append(threaded)
        start(armed, threaded)

    step._start = counted

    def run(mode: str) -> float:
        """The median step, past the members' first tokens and before the last few."""
        step.fixed = MODES[mode]
        for i in range(args.members):
            engine.add(
                Generate(
                    id=i,
                    seq=i,
                    attempt=0,
                    max_tokens=args.tokens,
                    prompt=f"Client {i}: list short words for what a lighthouse keeper sees.",
                    grammar=None if mode == "plain" else compiled,
                )
            )
        times = []
        while engine.busy:
            started = time.perf_counter()
            engine.step()
            times.append(time.perf_counter() - started)
        return statistics.median(times[args.members // 4 + 4 : -4])

    steps: dict[str, list[float]] = {mode: [] for mode in MODES}
    for mode in MODES:  # unmeasured: compiles, caches
        run(mode)
    for _ in range(args.rounds):
        for mode in MODES:
            paths.clear()
            steps[mode].append(run(mode))
            if mode != "plain":
                print(f"  {mode:7} thread steps {sum(paths)}/{len(paths)}", flush=True)
    plain = statistics.median(steps["plain"])
    print(f"\n{args.members} members, {args.tokens} tokens, {args.rounds} rounds")
    for mode, times in steps.items():
        median = statistics.median(times)
        print(f"{mode:7} step {median * 1e3:7.3f} ms   plain / {mode} {plain / median:.3f}")


if __name__ == "__main__":
    main()

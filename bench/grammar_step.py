"""A constrained batch step against an unconstrained one, in one process, rounds alternating.

The engine in process (no HTTP, no IPC), `--members` requests decoding at once, each
`--tokens` long: unconstrained, then under a JSON schema. Prints each mode's median step
time and plain / constrained (target >= 0.90). The schema is `bench.constrained`'s: an
array of strings that cannot close within the budget, so both modes run to length.

    python -m bench.grammar_step [--model DIR] [--members 32] [--tokens 128] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

MODES = ("plain", "constrained")


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
    from steward.wire.protocol import Generate
    from steward.worker.backend import Backend
    from steward.worker.engine import Engine
    from steward.worker.injection import Injector

    compiled = structured.grammar(schema(args.tokens), "bench")
    engine = Engine(Backend(bench_model(args.model), Injector([], 1)), args.members, 0)

    def run(mode: str) -> float:
        """The median step, past the members' first tokens and before the last few."""
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
    for r in range(args.rounds):
        for mode in MODES if r % 2 == 0 else MODES[::-1]:
            steps[mode].append(run(mode))
    plain, constrained = (statistics.median(steps[mode]) for mode in MODES)
    print(f"\n{args.members} members, {args.tokens} tokens, {args.rounds} rounds")
    print(f"plain        step {plain * 1e3:7.3f} ms")
    ratio = plain / constrained
    print(f"constrained  step {constrained * 1e3:7.3f} ms   plain / constrained {ratio:.3f}")
    rounds = [p / c for p, c in zip(steps["plain"], steps["constrained"], strict=True)]
    print(f"  median of the rounds' ratios {statistics.median(rounds):.3f}")


if __name__ == "__main__":
    main()

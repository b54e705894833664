"""A worker's decode speed under MLX's CUDA graph settings, and after verify steps.

The worker's engine in a process of its own for each setting of MLX's environment (MLX
reads it once), no HTTP: for an engine that never drafts (`--speculate none`) and then one
that drafts wherever its text copies (`always`), a chat story decoded alone, then the code
edit of bench/speculation.py alone, the story again, the edit at `--concurrency` requests
together, and the story after it, then after `mx.clear_cache()`. Printed: tokens per
second for each (aggregate for the edit together), and MLX's freed-buffer and peak memory,
so that a slower story after verify steps (a device left in a slower state) shows beside
the same story before them; then each figure's ratio to MLX's own settings.

The settings compared, each over what a worker sets itself (runtime.py's `environment`):
MLX's own graph cache (400 graphs, its lifetime check on), steward's (`GRAPHS`, check
off), and no CUDA graphs at all.

    python -m bench.graph_cache --model DIR [--tokens 400] [--concurrency 32] [--functions 12]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

SETTINGS = {
    "mlx default": {"MLX_CUDA_GRAPH_CACHE_SIZE": "400", "MLX_ENABLE_CACHE_THRASHING_CHECK": "1"},
    "steward": {},
    "no graphs": {"MLX_USE_CUDA_GRAPHS": "0"},
}


def measure(model: Path, tokens: int, concurrency: int, functions: int) -> dict[str, float]:
    """The sequence above, in this process (MLX set up as a worker sets it up): tokens per
    second by engine and case."""
    from steward.worker.runtime import environment

    environment(os.environ)
    import mlx.core as mx

    from bench.speculation import EDIT, STORY, source
    from steward.wire.protocol import Generate
    from steward.worker.backend import Backend
    from steward.worker.engine import Engine
    from steward.worker.injection import Injector
    from steward.worker.runtime import bound_cache

    bound_cache()
    backend = Backend(model, Injector([], 1))
    made = iter(range(1, 1 << 30))

    def ask(text: str, most: int = tokens) -> Generate:
        n = next(made)
        chat = [{"role": "user", "content": text}]
        return Generate(id=n, seq=n, attempt=1, max_tokens=most, messages=chat)

    def edits(count: int) -> list[Generate]:
        files = [source(functions, i) for i in range(count)]
        return [ask(EDIT.format(file=f, function=fn, old="scale", new="factor")) for f, fn in files]

    def run(engine: Engine, reqs: list[Generate]) -> float:
        for req in reqs:
            engine.add(req)
        count, started = 0, time.perf_counter()
        while engine.busy:
            count += sum(token.token >= 0 for token in engine.step().tokens)
        return count / (time.perf_counter() - started)

    speeds = {}
    for speculate in ("none", "always"):
        engine = Engine(backend, concurrency, 0, speculate=speculate)
        run(engine, [ask(STORY, 64)])  # the first shapes built
        for name, reqs in (
            ("story alone", lambda: [ask(STORY)]),
            ("edit alone", lambda: edits(1)),
            ("story after the edit", lambda: [ask(STORY)]),
            (f"edit c={concurrency} (aggregate)", lambda: edits(concurrency)),
            ("story after them", lambda: [ask(STORY)]),
            ("story after clear_cache", lambda: mx.clear_cache() or [ask(STORY)]),
        ):
            speed = speeds[f"{speculate:7}{name}"] = run(engine, reqs())
            memory = f"cache {mx.get_cache_memory() / 2**20:.0f} MiB"
            memory += f" peak {mx.get_peak_memory() / 2**20:.0f} MiB"
            print(f"  {speculate:7}{name:32}{speed:9.1f} tok/s   {memory}", flush=True)
        del engine
        mx.clear_cache()
    return speeds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--functions", type=int, default=12, help="in the edited file")
    parser.add_argument("--one", action="store_true", help="measure here, as the setting is")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.model, args.tokens, args.concurrency, args.functions)))
        return
    runs = {}
    for name, setting in SETTINGS.items():
        print(f"{name}: {setting or 'runtime.environment'}", flush=True)
        command = [sys.executable, "-m", "bench.graph_cache", "--one", "--model", str(args.model)]
        command += ["--tokens", str(args.tokens), "--concurrency", str(args.concurrency)]
        command += ["--functions", str(args.functions)]
        done = subprocess.run(command, env={**os.environ, **setting}, stdout=subprocess.PIPE)
        *lines, last = done.stdout.decode().splitlines() or [""]
        print("\n".join(lines), flush=True)
        runs[name] = json.loads(last) if done.returncode == 0 else {}
    base = runs["mlx default"]
    print("\nagainst MLX's own settings:")
    for case, speed in base.items():
        ratios = "  ".join(f"{n} {r.get(case, 0) / speed:5.2f}" for n, r in runs.items())
        print(f"  {case:40}{ratios}")


if __name__ == "__main__":
    main()

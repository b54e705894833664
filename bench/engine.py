"""The worker's generation loop against bare mlx-lm, in one process, runs alternating.

What steward's engine (engine.py: a request alone on `generate_step`, then the batch) costs
per token, with no HTTP or IPC in the way, measured against `mlx_lm.stream_generate` on the
same model and prompt. Alternating runs in one process keep a GPU whose speed drifts (a
shared H200 swung between 317 and 551 tok/s across minutes) from biasing the ratio.

    python -m bench.engine [--model DIR] [--tokens 256] [--runs 4]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="MLX model dir (default: the default model)")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--runs", type=int, default=4)
    args = parser.parse_args()

    from mlx_lm import stream_generate

    from bench.overhead import bench_model
    from steward.wire.protocol import Generate, encode
    from steward.worker.backend import Backend
    from steward.worker.engine import Engine
    from steward.worker.injection import Injector

    model_dir = bench_model(args.model)
    backend = Backend(model_dir, Injector([], 1))
    messages = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]
    prompt = backend.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    engine = Engine(backend, 32, 1 << 30)

    def rate(times: list[float]) -> float:
        return (len(times) - 1) / (times[-1] - times[0])

    def bare() -> float:
        steps = stream_generate(backend.model, backend.tokenizer, prompt, args.tokens)
        return rate([time.perf_counter() for _ in steps])

    def served(i: int) -> float:
        engine.add(Generate(id=i, seq=i, attempt=1, max_tokens=args.tokens, messages=messages))
        times = []
        while engine.busy:
            step = engine.step()
            encode(step)  # what the worker sends, per step
            if step.tokens:
                times.append(time.perf_counter())
        return rate(times)

    bare(), served(0)  # warm up
    runs = [(bare(), served(i + 1)) for i in range(args.runs)]
    b, e = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
    print(f"model {model_dir}, {args.tokens} tokens, {args.runs} alternating runs")
    print(f"bare mlx_lm.stream_generate: {b:.1f} tok/s   steward engine: {e:.1f} tok/s")
    print(f"ratio engine / bare: {e / b:.3f}")


if __name__ == "__main__":
    main()

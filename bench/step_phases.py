"""Where a batched decode step's time goes, at the widths agents load a server with.

The worker's engine (engine.py on mlx-lm's `BatchGenerator`) in this process, no HTTP or
IPC: `width` members decode together and each step is split into its phases, measured by
timing the calls the step makes:

- build: Python building the model's graph (the forward call returns before any kernel runs);
- launch: `mx.async_eval`, which encodes and launches the step's kernels;
- wait: `mx.eval` of the previous step's tokens (the device, when it is behind);
- generator: the rest of mlx-lm's step (its per-member bookkeeping);
- steward: the engine's own work on the step's thread after it (counting each member's
  token, the members that leave);
- outputs: each member's text, stop strings and tool calls (outputs.py), which the worker
  does on its output thread, apart from the step; `step` is the sum, one after the other.

Then the same width pipelined as the worker runs it (`Pipeline`, outputs on their thread):
the step thread's milliseconds per step and the tokens per second.

Then a prefill: `--long` prompts of `--long-tokens` tokens joining together beside
decoding members, against bare mlx-lm prefilling the same prompts one after another; it
prints the long prompts' time to their first token and the decoding members' longest gap.

    python -m bench.step_phases --model DIR [--widths 32,64,128] [--steps 64]
"""

from __future__ import annotations

import argparse
import importlib
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import mlx.core as mx


class Clock:
    """Seconds spent in each phase, summed over the steps measured."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = defaultdict(float)
        self.on = False

    def timed(self, phase: str, call: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            if not self.on:
                return call(*args, **kwargs)
            started = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                self.spent[phase] += time.perf_counter() - started

        return run


class TimedCore:
    """mlx.core as mlx-lm's generate module sees it, with eval and async_eval timed."""

    def __init__(self, clock: Clock) -> None:
        self.async_eval = clock.timed("launch", mx.async_eval)
        self.eval = clock.timed("wait", mx.eval)

    def __getattr__(self, name: str) -> Any:
        return getattr(mx, name)


class TimedModel:
    def __init__(self, model: Any, clock: Clock) -> None:
        self.model = model
        self.call = clock.timed("build", model.__call__)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.call(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


def request(i: int, prompt: str, tokens: int) -> Any:
    from steward.wire.protocol import Generate

    return Generate(id=i, seq=i, attempt=1, max_tokens=tokens, prompt=prompt, ignore_eos=True)


def long_text(tokenizer: Any, tokens: int, salt: int) -> str:
    """About `tokens` tokens of text, different for each `salt` from its first token on."""
    words = [f"w{(salt * 7919 + i * 104729) % 100_003}" for i in range(tokens)]
    ids = tokenizer.encode(" ".join(words))[:tokens]
    return tokenizer.decode(ids)


def phases(backend: Any, width: int, steps: int, lean: bool) -> dict[str, float]:
    """Milliseconds per step in each phase, `width` members decoding (with steward's lean
    step, batch.py, or mlx-lm's own)."""
    generate = importlib.import_module("mlx_lm.generate")  # the package names a function so

    clock = Clock()
    engine = decoding(backend, width, lean)
    generator = engine.batch.generator
    engine.batch.swap_model(TimedModel(generator.model, clock))
    real_core, generate.mx = generate.mx, TimedCore(clock)
    try:
        clock.on = True
        started = time.perf_counter()
        inner = text = 0.0
        generator.next = clock.timed("generator_total", generator.next)
        for _ in range(steps):
            before = time.perf_counter()
            drawn = engine.draw()
            drawing = time.perf_counter()
            engine.outputs.process(drawn)
            inner += drawing - before
            text += time.perf_counter() - drawing
        total = time.perf_counter() - started
    finally:
        generate.mx = real_core
        engine.drop_all()
    spent = dict(clock.spent)
    generated = spent.pop("generator_total")
    accounted = spent["build"] + spent["launch"] + spent["wait"]
    spent["generator"] = generated - accounted
    spent["steward"] = inner - generated
    spent["outputs"] = text
    spent["step"] = total
    return {phase: 1000 * seconds / steps for phase, seconds in spent.items()}


def pipelined(backend: Any, width: int, steps: int) -> float:
    """Milliseconds per step, `width` members decoding, the outputs on their own thread
    as the worker runs them (main.py), each step's message encoded as it would be sent."""
    from steward.wire.protocol import encode
    from steward.worker.outputs import Pipeline

    engine = decoding(backend, width, lean=True)
    pipeline = Pipeline(engine.outputs, encode)
    try:
        started = time.perf_counter()
        for _ in range(steps):
            pipeline.put(engine.draw())
        engine.settle()
        return 1000 * (time.perf_counter() - started) / steps
    finally:
        engine.drop_all()


def decoding(backend: Any, width: int, lean: bool) -> Any:
    """An engine whose `width` members all decode (steward's lean step, or mlx-lm's)."""
    from steward.worker.engine import Engine

    engine = Engine(backend, width, 0)
    if not lean:
        engine.batch.stock()
    for i in range(width):
        engine.add(request(i + 1, f"member {i} says", backend.context_length // 4))
    while engine.batch.decoding < width:
        engine.step()
    for _ in range(4):
        engine.step()
    return engine


def bare_prefill(model: Any, prompts: list[list[int]], chunk: int) -> float:
    """mlx-lm's own prefill of each prompt alone, one after another (its default chunk)."""
    from mlx_lm.models.cache import make_prompt_cache

    started = time.perf_counter()
    for prompt in prompts:
        cache = make_prompt_cache(model)
        tokens = mx.array(prompt)[None]
        while tokens.shape[1] > 0:
            model(tokens[:, :chunk], cache=cache)
            mx.eval([c.state for c in cache])
            tokens = tokens[:, chunk:]
    return time.perf_counter() - started


def prefill(backend: Any, prompts: list[str], members: int, chunk: int) -> dict[str, float]:
    """The long prompts joining `members` decoding: their TTFT and the members' worst gap
    (`chunk` 0: sized by measured speed, chunks.py; else that many tokens)."""
    from steward.worker.engine import Engine

    engine = Engine(backend, members + len(prompts), 0)
    if chunk:
        engine.chunks.measured = lambda batch, timed=True: None
        engine.chunks.size = chunk
        engine.chunks.resize = lambda batch: None
        engine.batch.chunk(chunk)
    for i in range(members):
        engine.add(request(i + 1, f"member {i} says", backend.context_length // 4))
    while engine.batch.decoding < members:
        engine.step()
    started = time.perf_counter()
    long_ids = set()
    for j, prompt in enumerate(prompts):
        long_ids.add(1000 + j)
        engine.add(request(1000 + j, prompt, 4))
    first: dict[int, float] = {}
    gaps: list[float] = []
    last = time.perf_counter()
    while len(first) < len(prompts):
        step = engine.step()
        now = time.perf_counter()
        if any(t.id not in long_ids for t in step.tokens):
            gaps.append(now - last)
            last = now
        for token in step.tokens:
            if token.id in long_ids and token.id not in first:
                first[token.id] = now - started
    engine.drop_all()
    return {"ttft": max(first.values()), "worst_gap": max(gaps, default=0.0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--widths", default="32,64,128")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--long", type=int, default=3)
    parser.add_argument("--long-tokens", type=int, default=13_000)
    parser.add_argument("--decoding", type=int, default=8, help="members decoding beside")
    parser.add_argument("--chunks", default="0,512", help="prefill chunks (0: measured)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    from steward.worker.backend import Backend
    from steward.worker.injection import Injector

    backend = Backend(args.model, Injector([], 1))
    for width in [int(w) for w in args.widths.split(",") if w]:
        for lean in (True, False):
            phases(backend, width, 8, lean)  # the shapes' kernels, compiled
        for lean in (True, False, True, False):
            ms = phases(backend, width, args.steps, lean)
            shown = " ".join(f"{k}={v:.2f}" for k, v in ms.items())
            rate = width / ms["step"] * 1000
            step = "lean" if lean else "mlx-lm"
            print(f"decode width={width} {step}: ms/step {shown}; {rate:,.0f} tok/s")
        for _ in range(2):
            ms = pipelined(backend, width, args.steps)
            rate = width / ms * 1000
            print(f"decode width={width} lean pipelined: ms/step {ms:.2f}; {rate:,.0f} tok/s")
    tokenizer = backend.tokenizer
    for round_ in range(args.rounds if args.long else 0):  # new prompts each round: new shapes
        salt = args.long * round_
        prompts = [
            long_text(tokenizer, args.long_tokens - 37 * j, salt + j) for j in range(args.long)
        ]
        bare = bare_prefill(backend.model, [tokenizer.encode(p) for p in prompts], 2048)
        shape = f"{args.long} x {args.long_tokens}"
        print(f"round {round_ + 1}: bare mlx-lm prefill of {shape}: {bare:.3f} s")
        for chunk in [int(c) for c in args.chunks.split(",")]:
            seen = prefill(backend, prompts, args.decoding, chunk)
            print(
                f"round {round_ + 1} chunk={chunk or 'measured'}: long TTFT {seen['ttft']:.3f} s "
                f"({seen['ttft'] / bare:.2f}x bare), decoding members' worst gap "
                f"{seen['worst_gap'] * 1000:.0f} ms"
            )


if __name__ == "__main__":
    main()

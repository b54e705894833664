"""Many models behind one front (SPEC §9): what a second model costs the first, and what a
load on demand costs a request.

1. Each model alone, then both at once, in one steward serving both (`--model a=A
   --model b=B`): C clients per model stream `--rounds` greedy chat completions of
   `--tokens` tokens. Printed: aggregate tokens/s alone and together, and each model's
   p50 time to first token together over alone (1.0: the other model costs it nothing).
2. A request for an unloaded model: the time to its first token, against the model's own
   bring-up (`load_s` in /health, spawn to canary passed) measured in the same server.

    python -m bench.models --model A --model B [--concurrency 16] [--tokens 32]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

import httpx

from bench.client import pooled, stream_chat
from bench.overhead import start_server

MESSAGES = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]


async def load(url: str, models: list[str], clients: int, rounds: int, tokens: int) -> dict:
    """`clients` streams per model at once: {model: (tokens, ttfts)}, and the wall time."""
    seen: dict[str, tuple[list[int], list[float]]] = {m: ([], []) for m in models}

    async def client(http: httpx.AsyncClient, model: str) -> None:
        body = {"model": model, "messages": MESSAGES, "max_tokens": tokens, "temperature": 0}
        for _ in range(rounds):
            answer = await stream_chat(http, body | {"stream": True})
            if isinstance(answer, str):
                raise RuntimeError(f"{model}: {answer}")
            seen[model][0].append(len(answer.times))
            seen[model][1].append(answer.times[0] - answer.started)

    async with pooled(url, clients * len(models)) as http:
        started = time.perf_counter()
        await asyncio.gather(*(client(http, m) for m in models for _ in range(clients)))
        wall = time.perf_counter() - started
    return {"wall": wall, **seen}


def summary(result: dict, models: list[str]) -> tuple[float, dict[str, float]]:
    """Aggregate tokens/s, and each model's p50 TTFT."""
    total = sum(sum(result[m][0]) for m in models)
    return total / result["wall"], {m: statistics.median(result[m][1]) for m in models}


async def first_token(url: str, model: str, tokens: int) -> float:
    """Seconds from a request for an unloaded `model` to its first token."""
    async with pooled(url, 1) as http:
        body = {"model": model, "messages": MESSAGES, "max_tokens": tokens, "stream": True}
        answer = await stream_chat(http, body)
        if isinstance(answer, str):
            raise RuntimeError(answer)
        return answer.times[0] - answer.started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, action="append", required=True, help="twice")
    parser.add_argument("--concurrency", type=int, default=16, help="clients per model")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    if len(args.model) != 2:
        parser.error("--model A --model B: two models")
    names = ["a", "b"]
    pairs = zip(names, args.model, strict=True)
    specs = [arg for name, path in pairs for arg in ("--model", f"{name}={path}")]
    proc, url = start_server(None, [*specs, "--standby", "none"])
    try:
        asyncio.run(load(url, names, 1, 1, 2))  # b loads; both warm
        c, rounds, tokens = args.concurrency, args.rounds, args.tokens
        alone = {m: summary(asyncio.run(load(url, [m], c, rounds, tokens)), [m]) for m in names}
        both_tps, both_ttft = summary(asyncio.run(load(url, names, c, rounds, tokens)), names)
        print(f"c={c} per model, {tokens} tokens, {rounds} rounds")
        for m in names:
            tps, ttft = alone[m]
            print(f"  {m} alone: {tps:8.1f} tok/s, p50 TTFT {ttft[m] * 1000:7.1f} ms")
        apart = sum(tps for tps, _ in alone.values())
        print(f"  both:    {both_tps:8.1f} tok/s aggregate (the two alone: {apart:.1f})")
        for m in names:
            ratio = both_ttft[m] / alone[m][1][m]
            print(f"  {m} p50 TTFT {both_ttft[m] * 1000:.1f} ms together, {ratio:.2f}x alone")
    finally:
        proc.terminate()
        proc.wait()
    # 2. on demand: b is unloaded until the request
    proc, url = start_server(None, [*specs, "--standby", "none"])
    try:
        waited = asyncio.run(first_token(url, "b", 2))
        load_s = httpx.get(url + "/health").json()["models"]["b"]["load_s"]
        extra = waited - load_s
        print(
            f"unloaded b: first token after {waited:.2f} s; "
            f"its bring-up {load_s:.2f} s (+{extra:.2f})"
        )
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()

"""Throughput under load: steward beside mlx_lm.server, the same model, client and prompts.

For each concurrency C, C clients each stream `--rounds` chat completions back to back
(greedy, `--tokens` tokens each). Printed per server and C: aggregate tokens/s (all tokens
the clients received over the wall time), p50/p95 time to first token, errors; for steward
also the worker's own clock (the median per-request decode speed it measured, times the
mean batch size) beside the clients' per-request speed. A bare `mlx_lm.stream_generate`
run in this process is the c=1 ceiling. Ratios are against mlx_lm.server and against bare.

    python -m bench.throughput [--model DIR] [--concurrency 1,8,32,64] [--tokens 128]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.client import pooled, stream_chat
from bench.overhead import bare_run, bench_model, start_server

MESSAGES = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]


@dataclass
class Level:
    """One server at one concurrency."""

    tokens: int = 0
    wall: float = 0.0
    ttfts: list[float] = field(default_factory=list)
    client_tps: list[float] = field(default_factory=list)  # per request, after the first token
    worker_tps: list[float] = field(default_factory=list)  # steward's own `timings`
    errors: dict[str, int] = field(default_factory=dict)

    def error(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1


async def one(client: httpx.AsyncClient, model: str, tokens: int, level: Level) -> None:
    body = {
        "model": model,
        "messages": MESSAGES,
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    seen = await stream_chat(client, body)
    if isinstance(seen, str):
        level.error(seen)
        return
    times, usage, timings = seen.times, seen.usage, seen.timings
    if not times:
        level.error("no tokens")
        return
    level.tokens += usage["completion_tokens"] if usage else len(times)
    level.ttfts.append(times[0] - seen.started)
    if len(times) > 1:
        level.client_tps.append((len(times) - 1) / (times[-1] - times[0]))
    if timings:
        level.worker_tps.append(timings["predicted_per_second"])


async def load(url: str, model: str, clients: int, rounds: int, tokens: int) -> Level:
    level = Level()
    async with pooled(url, clients) as client:

        async def user() -> None:
            for _ in range(rounds):
                await one(client, model, tokens, level)

        started = time.perf_counter()
        await asyncio.gather(*(user() for _ in range(clients)))
        level.wall = time.perf_counter() - started
    return level


def start_peer(
    model: Path, max_tokens: int, extra: list[str] | None = None
) -> tuple[subprocess.Popen, str]:
    """mlx_lm.server on a free port, once it answers (`extra`: more of its flags)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "mlx_lm.server", "--model", str(model)]
    command += ["--port", str(port), "--max-tokens", str(max_tokens), "--log-level", "WARNING"]
    command += extra or []
    proc = subprocess.Popen(command, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    for _ in range(6000):
        if proc.poll() is not None:
            raise SystemExit(f"mlx_lm.server exited {proc.returncode}")
        try:
            httpx.get(url + "/v1/models", timeout=2)
            return proc, url
        except httpx.TransportError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("mlx_lm.server did not start")


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run_server(
    name: str, proc: subprocess.Popen, url: str, model: str, args: argparse.Namespace
) -> dict[int, Level]:
    results = {}
    try:
        for c in args.concurrency:  # warm up alike: every batch shape once, unmeasured
            asyncio.run(load(url, model, c, 1, args.tokens))
        for c in args.concurrency:
            results[c] = asyncio.run(load(url, model, c, args.rounds, args.tokens))
            r = results[c]
            print(f"  {name} c={c}: {r.tokens / r.wall:.0f} tok/s, errors {r.errors}", flush=True)
    finally:
        proc.terminate()
        proc.wait(60)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="MLX model dir (default: the default model)")
    parser.add_argument("--concurrency", default="1,8,32,64")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2, help="requests per client")
    parser.add_argument("--no-peer", action="store_true", help="skip mlx_lm.server")
    args = parser.parse_args()
    args.concurrency = [int(c) for c in args.concurrency.split(",")]

    from mlx_lm import load as load_model

    model_dir = bench_model(args.model)
    model, tokenizer = load_model(str(model_dir))
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
    bare_run(model, tokenizer, prompt, 8)
    bare = statistics.median(bare_run(model, tokenizer, prompt, args.tokens)[1] for _ in range(3))
    del model
    print(f"model {model_dir}, prompt {len(prompt)} tokens, {args.tokens} tokens per answer")
    print(f"bare mlx_lm.stream_generate, in process: {bare:.0f} tok/s", flush=True)

    runs = {}
    proc, url = start_server(model_dir, ["--queue-size", "256"])
    runs["steward"] = run_server("steward", proc, url, "default", args)
    if not args.no_peer:
        proc, url = start_peer(model_dir, args.tokens)
        runs["mlx_lm.server"] = run_server("mlx_lm.server", proc, url, str(model_dir), args)

    print()
    head = f"{'server':15}{'c':>4}{'agg tok/s':>11}{'p50 TTFT s':>12}{'p95 TTFT s':>12}"
    print(head + f"{'client tok/s/req':>18}{'worker tok/s/req':>18}  errors")
    for name, levels in runs.items():
        for c, r in levels.items():
            worker = statistics.median(r.worker_tps) if r.worker_tps else float("nan")
            print(
                f"{name:15}{c:>4}{r.tokens / r.wall:>11.0f}{pct(r.ttfts, 0.5):>12.3f}"
                f"{pct(r.ttfts, 0.95):>12.3f}{statistics.median(r.client_tps or [0]):>18.1f}"
                f"{worker:>18.1f}  {sum(r.errors.values())} {r.errors or ''}"
            )
    steward = runs["steward"]
    print()
    if 1 in steward:
        ratio = statistics.median(steward[1].client_tps) / bare
        print(f"c=1 streamed decode, steward client / bare mlx_lm: {ratio:.3f} (target >= 0.97)")
    peer = runs.get("mlx_lm.server", {})
    for c in args.concurrency:
        if c in peer and peer[c].tokens:
            s, p = steward[c], peer[c]
            ratio = (s.tokens / s.wall) / (p.tokens / p.wall)
            print(
                f"c={c}: aggregate steward / mlx_lm.server {ratio:.2f}, "
                f"p95 TTFT {pct(s.ttfts, 0.95):.3f} s vs {pct(p.ttfts, 0.95):.3f} s"
            )


if __name__ == "__main__":
    main()

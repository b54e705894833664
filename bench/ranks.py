"""Two local ranks against one process, on this machine, for the record (docs/distributed.md):
no speed is claimed for a CPU, where two ranks share the cores one process had and every
layer pays two `all_sum`s over the loopback.

Each run is a fresh `steward serve` of the same float32 random llama (built here with the
default model's tokenizer; `--hidden`, `--layers`): one process and `--ranks 2`, neither
with a spare, then `--ranks 2 --standby hot` (a spare group):
- bring-up: process start to ready (the spare group's own bring-up is waited for after);
- one client: greedy tokens per second of one stream of `--tokens`;
- `--clients` streams together: their tokens per second in all;
- with two ranks, rank 1 SIGKILLed while idle: seconds until the next answer, the group
  re-formed, or the spare group promoted.

    python -m bench.ranks [--hidden 512 --layers 4 --tokens 64 --clients 4]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import tempfile
import time
from pathlib import Path

import httpx

from bench.client import Streamed, pooled, stream_chat
from bench.overhead import bench_model, start_server
from tests.tinymodel import build_tiny_model

CHAT = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]
RUNS = {
    "one process": ["--standby", "none"],
    "--ranks 2": ["--ranks", "2", "--standby", "none"],
    "--ranks 2 --standby hot": ["--ranks", "2", "--standby", "hot"],
}


async def streams(url: str, clients: int, tokens: int) -> float:
    """Tokens per second of `clients` greedy streams together."""
    body = {
        "messages": CHAT,
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with pooled(url, clients) as client:
        started = time.perf_counter()
        done = await asyncio.gather(*(stream_chat(client, body) for _ in range(clients)))
        seconds = time.perf_counter() - started
    answered = [d for d in done if isinstance(d, Streamed)]
    assert len(answered) == clients, done
    return sum((d.usage or {}).get("completion_tokens", 0) for d in answered) / seconds


def recovery(url: str) -> float:
    """Seconds from rank 1's SIGKILL until the next short answer."""
    http = httpx.Client(base_url=url, timeout=300)
    pid = http.get("/health").json()["worker"]["ranks"][1]["pid"]
    body = {"messages": CHAT, "max_tokens": 4, "temperature": 0}
    killed = time.perf_counter()
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)  # the group is seen faulted at once; the request waits for the new one
    assert http.post("/v1/chat/completions", json=body).status_code == 200
    return time.perf_counter() - killed


def spare_ready(url: str) -> None:
    """Wait for the spare, where one is kept: its bring-up would take the cores measured."""
    while httpx.get(url + "/health").json()["standby"]["state"] == "starting":
        time.sleep(0.5)


def run(model: Path, args: list[str], tokens: int, clients: int) -> dict[str, float]:
    started = time.perf_counter()
    proc, url = start_server(model, args)
    try:
        seen = {"bring_up_s": time.perf_counter() - started}
        spare_ready(url)
        asyncio.run(streams(url, 1, 8))  # the first shapes
        seen["one_tps"] = asyncio.run(streams(url, 1, tokens))
        seen["many_tps"] = asyncio.run(streams(url, clients, tokens))
        if "--ranks" in args:
            seen["rank_killed_s"] = recovery(url)
        return seen
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--clients", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        model = build_tiny_model(
            Path(folder) / "model",
            bench_model(None),
            hidden=args.hidden,
            layers=args.layers,
            heads=8,
            ffn=3 * args.hidden,
        )
        for name, flags in RUNS.items():
            seen = run(model, flags, args.tokens, args.clients)
            shown = ", ".join(f"{key} {value:.2f}" for key, value in seen.items())
            print(f"{name}: {shown}", flush=True)


if __name__ == "__main__":
    main()

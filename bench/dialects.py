"""What each dialect's translation costs: chat completions, Responses and Anthropic Messages
streamed against one steward, the same model, prompt and token count, in one run.

For each concurrency C, C clients each stream `--rounds` answers (greedy, `--tokens`
tokens), one dialect at a time, the dialects taking turns `--repeats` times, each repeat
led by another, so that neither a slow moment of the machine nor going first favours one.
Printed per dialect and C: aggregate tokens/s (all answers' tokens over the wall time),
the median per-request decode speed as the client saw it (tokens after the first over the
time from the first text event to the last) and the range of its repeats' medians, p50
TTFT, errors; then each dialect's ratios to chat completions (the cost of its translation:
1.00 is none). A dialect whose route answers 404 (Messages, before it exists) is skipped.

    python -m bench.dialects [--model DIR | --random 1b] [--concurrency 1,32] [--tokens 128]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.client import pooled
from bench.overhead import bench_model, start_server
from bench.throughput import pct

PROMPT = "Write a long story about a lighthouse keeper."


@dataclass
class Dialect:
    """A route, its streaming body, and how its events carry text and the token count."""

    name: str
    path: str
    body: Callable[[int], dict[str, Any]]
    text: Callable[[dict[str, Any]], str | None]  # an event's answer text, if any
    tokens: Callable[[dict[str, Any]], int | None]  # the answer's tokens, from its last events
    headers: dict[str, str] = field(default_factory=dict)


def _chat_text(event: dict[str, Any]) -> str | None:
    choices = event.get("choices") or [{}]
    return choices[0].get("delta", {}).get("content")


def _chat_tokens(event: dict[str, Any]) -> int | None:
    return (event.get("usage") or {}).get("completion_tokens")


def _responses_text(event: dict[str, Any]) -> str | None:
    return event.get("delta") if event.get("type") == "response.output_text.delta" else None


def _responses_tokens(event: dict[str, Any]) -> int | None:
    if event.get("type") in ("response.completed", "response.incomplete"):
        return event["response"]["usage"]["output_tokens"]
    return None


def _messages_text(event: dict[str, Any]) -> str | None:
    delta = event.get("delta") or {}
    return delta.get("text") if event.get("type") == "content_block_delta" else None


def _messages_tokens(event: dict[str, Any]) -> int | None:
    if event.get("type") == "message_delta":
        return (event.get("usage") or {}).get("output_tokens")
    return None


MESSAGES = [{"role": "user", "content": PROMPT}]
DIALECTS = (
    Dialect(
        "chat",
        "/v1/chat/completions",
        lambda n: {
            "messages": MESSAGES,
            "max_tokens": n,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        _chat_text,
        _chat_tokens,
    ),
    Dialect(
        "responses",
        "/v1/responses",
        lambda n: {
            "input": PROMPT,
            "max_output_tokens": n,
            "temperature": 0,
            "stream": True,
            "store": False,
        },
        _responses_text,
        _responses_tokens,
    ),
    Dialect(
        "messages",
        "/v1/messages",
        lambda n: {
            "model": "default",
            "messages": MESSAGES,
            "max_tokens": n,
            "temperature": 0,
            "stream": True,
        },
        _messages_text,
        _messages_tokens,
        {"anthropic-version": "2023-06-01"},
    ),
)


@dataclass
class Level:
    """One dialect at one concurrency, over every repeat."""

    tokens: int = 0
    wall: float = 0.0
    ttfts: list[float] = field(default_factory=list)
    decode: list[float] = field(default_factory=list)  # per-request tokens/s after the first
    errors: Counter[str] = field(default_factory=Counter)
    spread: list[float] = field(default_factory=list)  # each repeat's median decode speed


async def one(client: httpx.AsyncClient, dialect: Dialect, tokens: int, level: Level) -> None:
    started = time.perf_counter()
    times: list[float] = []
    count = None
    try:
        body = dialect.body(tokens)
        async with client.stream("POST", dialect.path, json=body, headers=dialect.headers) as r:
            if r.status_code != 200:
                level.errors[f"HTTP {r.status_code}"] += 1
                await r.aread()
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                event = json.loads(line[6:])
                if "error" in event or event.get("type") in ("error", "response.failed"):
                    level.errors["error event"] += 1
                    return
                if dialect.text(event):
                    times.append(time.perf_counter())
                count = dialect.tokens(event) or count
    except httpx.HTTPError as exc:
        level.errors[type(exc).__name__] += 1
        return
    if not times or not count:
        level.errors["no answer"] += 1
        return
    level.tokens += count
    level.ttfts.append(times[0] - started)
    if count > 1 and times[-1] > times[0]:
        level.decode.append((count - 1) / (times[-1] - times[0]))


async def load(url: str, dialect: Dialect, clients: int, rounds: int, tokens: int, level: Level):
    async with pooled(url, clients) as client:

        async def user() -> None:
            for _ in range(rounds):
                await one(client, dialect, tokens, level)

        started = time.perf_counter()
        await asyncio.gather(*(user() for _ in range(clients)))
        level.wall += time.perf_counter() - started


def served(url: str, dialect: Dialect) -> bool:
    """The route exists (a 404 means the dialect is not served yet)."""
    body = dialect.body(1) | {"stream": False}
    answer = httpx.post(url + dialect.path, json=body, headers=dialect.headers, timeout=600)
    return answer.status_code != 404


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", type=Path, help="model, or --random's tokenizer (default: the default model)"
    )
    parser.add_argument("--random", choices=["1b", "8b"], help="a random llama, built here")
    parser.add_argument("--concurrency", default="1,32")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2, help="answers per client per repeat")
    parser.add_argument("--repeats", type=int, default=3, help="turns each dialect takes")
    args = parser.parse_args()
    model = bench_model(args.model)
    if args.random:
        from bench.random_llama import build

        model = build(Path(tempfile.mkdtemp()), model, args.random, None)
    levels = [int(c) for c in args.concurrency.split(",")]
    batch = str(max(levels))
    proc, url = start_server(model, ["--max-batch", batch, "--queue-size", str(4 * max(levels))])
    try:
        dialects = [d for d in DIALECTS if served(url, d)]
        skipped = [d.name for d in DIALECTS if d not in dialects]
        print(f"model {model}, {args.tokens} tokens per answer, {args.rounds} per client")
        if skipped:
            print(f"not served (404), skipped: {', '.join(skipped)}")
        for dialect in dialects:  # warm-up: the first answers pay compilation, in any dialect
            asyncio.run(load(url, dialect, max(levels), 1, 8, Level()))
        runs = {(d.name, c): Level() for d in dialects for c in levels}
        for repeat in range(args.repeats):
            turn = dialects[repeat % len(dialects) :] + dialects[: repeat % len(dialects)]
            for c in levels:
                for d in turn:  # each repeat starts with another dialect: no order favours one
                    level = runs[d.name, c]
                    before = len(level.decode)
                    asyncio.run(load(url, d, c, args.rounds, args.tokens, level))
                    level.spread.append(statistics.median(level.decode[before:] or [0.0]))
    finally:
        proc.terminate()
        proc.wait(60)
    report(runs, [d.name for d in dialects], levels)


def report(runs: dict[tuple[str, int], Level], names: list[str], levels: list[int]) -> None:
    print()
    print(
        f"{'dialect':10}{'c':>4}{'agg tok/s':>11}{'decode tok/s/req':>18}{'repeats':>12}"
        f"{'p50 TTFT s':>12}  errors"
    )
    for c in levels:
        for name in names:
            r = runs[name, c]
            decode = statistics.median(r.decode) if r.decode else float("nan")
            spread = f"{min(r.spread):.0f}-{max(r.spread):.0f}" if r.spread else "-"
            print(
                f"{name:10}{c:>4}{r.tokens / r.wall:>11.0f}{decode:>18.1f}{spread:>12}"
                f"{pct(r.ttfts, 0.5):>12.3f}  {sum(r.errors.values())} {dict(r.errors) or ''}"
            )
    print()
    for c in levels:
        chat = runs["chat", c]
        for name in names[1:]:
            r = runs[name, c]
            agg = (r.tokens / r.wall) / (chat.tokens / chat.wall)
            decode = statistics.median(r.decode) / statistics.median(chat.decode)
            print(
                f"c={c}: {name} / chat: aggregate {agg:.3f}, decode per request {decode:.3f} "
                "(target >= 0.98)"
            )


if __name__ == "__main__":
    main()

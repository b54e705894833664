"""Agent-shaped load: long prompts, the next turn, and long prompts arriving together.

Coding agents send 10-30 thousand tokens a turn (system prompt, tools, history). Per server
(steward, mlx_lm.server) on the same model, in one run:

- alone: a new long prompt's time to first token (TTFT);
- next turn: the same conversation one turn later (a prompt cache serves the prefix);
- rounds: `--long` new long prompts at once with one short request beside them, while
  `--decoding` streams decode beside: the long prompts' TTFT (the last of them), the short
  one's, and the decoding streams' worst gap between tokens.

Bare mlx-lm in this process prefills each round's long prompts one after another: the
engine's speed limit for the same work. Every round's prompts are new (new shapes too).

    python -m bench.agents --model DIR [--long-tokens 13000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

import httpx

from bench.client import pooled, stream_chat
from bench.overhead import start_server
from bench.step_phases import long_text
from bench.throughput import start_peer

QUESTION = "Which file should change first? Answer in one line."


def chat(system: str, question: str = QUESTION, history: list[dict] | None = None) -> list:
    return [
        {"role": "system", "content": system},
        *(history or []),
        {"role": "user", "content": question},
    ]


async def ttft(client: Any, model: str, messages: list, tokens: int = 8) -> tuple[float, str]:
    body = {"model": model, "messages": messages, "max_tokens": tokens, "temperature": 0}
    seen = await stream_chat(client, body | {"stream": True})
    if isinstance(seen, str) or not seen.times:
        raise SystemExit(f"request failed: {seen}")
    return seen.times[0] - seen.started, "".join(seen.text)


async def decoding(client: Any, model: str, stop: asyncio.Event, gaps: list[float]) -> None:
    """A stream decoding beside the round, its gaps recorded while the round runs."""
    body = {"model": model, "messages": chat("You are terse.", "Count upward."), "stream": True}
    while not stop.is_set():
        seen = await stream_chat(client, body | {"max_tokens": 256, "temperature": 0})
        if isinstance(seen, str):
            raise SystemExit(f"decoding stream failed: {seen}")
        gaps.extend(b - a for a, b in zip(seen.times, seen.times[1:], strict=False))


async def server_run(url: str, model: str, tokenizer: Any, args: argparse.Namespace) -> dict:
    results: dict[str, Any] = {}
    async with pooled(url, args.long + args.decoding + 2) as client:
        await ttft(client, model, chat("warm"))  # the server's first request, unmeasured
        system = long_text(tokenizer, args.long_tokens, salt=10_000)
        results["alone"], answer = await ttft(client, model, chat(system))
        history = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": answer}]
        results["next"], _ = await ttft(client, model, chat(system, "And then?", history))
        rounds = []
        for r in range(args.rounds):
            # Made before the streams start: tokenizing them would stall this client's
            # loop, and with it the gaps it measures.
            systems = [
                long_text(tokenizer, args.long_tokens, r * args.long + j) for j in range(args.long)
            ]
            stop, gaps = asyncio.Event(), []
            beside = [
                asyncio.create_task(decoding(client, model, stop, gaps))
                for _ in range(args.decoding)
            ]
            await asyncio.sleep(1.0)  # they decode before the round arrives
            gaps.clear()
            started = time.perf_counter()
            long = [ttft(client, model, chat(s)) for s in systems]
            short = ttft(client, model, chat("You are terse.", "Say hi."))
            *longs, (short_ttft, _) = await asyncio.gather(*long, short)
            long_ttft = max(t for t, _ in longs)
            stop.set()
            await asyncio.gather(*beside)
            rounds.append((long_ttft, short_ttft, max(gaps, default=0.0)))
            print(
                f"    round {r + 1}: long {long_ttft:.2f} s, short {short_ttft:.2f} s, "
                f"worst gap {max(gaps, default=0.0):.3f} s ({time.perf_counter() - started:.1f} s)",
                flush=True,
            )
        results["rounds"] = rounds
    return results


def bare_rounds(model: Any, tokenizer: Any, args: argparse.Namespace) -> list[float]:
    """Each round's long prompts prefilled by mlx-lm alone, one after another (to the
    first token)."""
    from mlx_lm import stream_generate

    seconds = []
    for r in range(args.rounds):
        started = time.perf_counter()
        for j in range(args.long):
            system = long_text(tokenizer, args.long_tokens, r * args.long + j)
            prompt = tokenizer.apply_chat_template(chat(system), add_generation_prompt=True)
            next(iter(stream_generate(model, tokenizer, prompt, max_tokens=1)))
        seconds.append(time.perf_counter() - started)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--long-tokens", type=int, default=13_000)
    parser.add_argument("--long", type=int, default=3)
    parser.add_argument("--decoding", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-peer", action="store_true")
    args = parser.parse_args()

    from mlx_lm import load

    model, tokenizer = load(str(args.model))
    bare_rounds(model, tokenizer, argparse.Namespace(**{**vars(args), "rounds": 1, "long": 1}))
    bare = bare_rounds(model, tokenizer, args)
    del model
    print(f"bare mlx-lm, {args.long} long prompts one after another: {bare}", flush=True)
    runs = {}
    proc, url = start_server(args.model, ["--queue-size", "256"])
    try:
        limit = httpx.get(url + "/health").json()["batch"]["limit"]
        print(f"  steward (batch limit {limit}: --max-batch auto)", flush=True)
        runs["steward"] = asyncio.run(server_run(url, "default", tokenizer, args))
    finally:
        proc.terminate()
        proc.wait(60)
    if not args.no_peer:
        proc, url = start_peer(args.model, 256)
        try:
            print("  mlx_lm.server", flush=True)
            runs["mlx_lm.server"] = asyncio.run(server_run(url, str(args.model), tokenizer, args))
        finally:
            proc.terminate()
            proc.wait(60)
    print(f"\n{args.long_tokens}-token prompts; TTFT in seconds")
    for name, r in runs.items():
        rounds = " / ".join(f"{long:.2f}" for long, _, _ in r["rounds"])
        shorts = " / ".join(f"{short:.2f}" for _, short, _ in r["rounds"])
        gaps = " / ".join(f"{gap:.3f}" for _, _, gap in r["rounds"])
        print(
            f"{name:14} alone {r['alone']:.2f}, next turn {r['next']:.2f}; "
            f"{args.long} new together: {rounds}; short beside: {shorts}; worst gap {gaps}"
        )
        ratios = " / ".join(
            f"{long / b:.1f}x" for (long, _, _), b in zip(r["rounds"], bare, strict=True)
        )
        print(f"{'':14} long prompts together / bare one after another: {ratios}")
    print(f"{'bare mlx-lm':14} {' / '.join(f'{b:.2f}' for b in bare)}")


if __name__ == "__main__":
    main()

"""Grammar-constrained decoding's cost: the same server and prompts, with and without a schema.

A constrained answer has every token masked by llguidance: per step and per sequence, a mask
over the vocabulary computed on the CPU and applied to the logits, on the decode path. One
`steward serve` (`--max-batch` the largest concurrency) takes both modes; for each
concurrency C, after one unmeasured round of each, `--rounds` rounds in which C clients
each stream one greedy chat completion of `--tokens` tokens at once, unconstrained and
constrained (which goes first alternates by round, so drift hits both). The constrained
requests carry a `json_schema` response format that asks for an array of at least
`--tokens` strings, which cannot close within the budget: like the unconstrained text of a
random-weight model (`bench.random_llama`, which never emits EOS), it runs to length, so
decode speed is compared token for token. Each constrained answer is checked to be text the
schema allows (a prefix, when cut by length).

Printed per C and mode: aggregate tokens/s (completion tokens from `usage` over the rounds'
wall time), the worker's own per-request decode speed (median `timings.predicted_per_second`),
p50 time to first token, completion tokens, finish reasons and errors; then constrained /
unconstrained for aggregate and worker decode speed (target >= 0.90), over all rounds and as
the median of each round's own ratio (a round's two modes run back to back, so a host whose
speed drifts from round to round moves both).

    python -m bench.constrained [--model DIR] [--concurrency 1,32] [--tokens 128] [--rounds 3]
                                [--bounded]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import llguidance
import llguidance.hf

from bench.client import pooled, stream_chat
from bench.overhead import bench_model, start_server
from steward.front.structured import grammar

MODES = ("unconstrained", "constrained")
PROMPT = "Client {i}: list short words for what a lighthouse keeper sees, as JSON."
Check = Callable[[str, str | None], str | None]  # (text, finish reason) -> what is wrong


@dataclass
class Mode:
    """One mode at one concurrency, over its measured rounds."""

    tokens: int = 0
    wall: float = 0.0
    ttfts: list[float] = field(default_factory=list)
    worker_tps: list[float] = field(default_factory=list)
    worker_ttfts: list[float] = field(default_factory=list)  # seconds, admitted to first token
    finishes: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    rounds: list[tuple[float, float] | None] = field(default_factory=list)  # agg, worker tok/s


def schema(tokens: int, bounded: bool = False) -> dict[str, Any]:
    """An object that cannot close within `tokens` tokens: each string item takes one.
    `bounded` strings (`maxLength`) take llguidance off its fast path for free text: each
    mask then walks the whole vocabulary (measured, on the H200: 0.39 of unconstrained
    decode at c=32)."""
    item: dict[str, Any] = {"type": "string", "minLength": 1}
    if bounded:
        item["maxLength"] = 12
    items = {"type": "array", "items": item, "minItems": tokens}
    return {
        "type": "object",
        "properties": {"items": items},
        "required": ["items"],
        "additionalProperties": False,
    }


def request(i: int, tokens: int, constrained: dict[str, Any] | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": PROMPT.format(i=i)}],
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if constrained:
        named = {"name": "items", "schema": constrained}
        body["response_format"] = {"type": "json_schema", "json_schema": named}
    return body


def schema_check(model_dir: Path, wanted: dict[str, Any]) -> Check:
    """Whether an answer is text the schema allows: the grammar steward compiles, fed the
    answer retokenized (llguidance matches bytes, so any tokenization of them will do)."""
    from mlx_lm.utils import load_tokenizer

    llt = llguidance.hf.from_tokenizer(load_tokenizer(model_dir)._tokenizer)
    compiled = grammar(wanted, "bench")

    def check(text: str, finish: str | None) -> str | None:
        matcher = llguidance.LLMatcher(llt, compiled, log_level=0)
        ids = llt.tokenize_str(text)
        if matcher.try_consume_tokens(ids) < len(ids):
            return "answer breaks the schema"
        if finish == "stop" and not matcher.is_accepting():
            return "stopped on incomplete JSON"
        return None

    return check


async def one(
    client: httpx.AsyncClient, body: dict[str, Any], check: Check | None, mode: Mode
) -> None:
    seen = await stream_chat(client, body)
    if isinstance(seen, str):
        mode.errors[seen] += 1
        return
    if not seen.times or seen.usage is None or seen.timings is None:
        mode.errors["no content, usage or timings"] += 1
        return
    if check and (problem := check("".join(seen.text), seen.finish)):
        mode.errors[problem] += 1
    mode.tokens += seen.usage["completion_tokens"]
    mode.ttfts.append(seen.times[0] - seen.started)
    mode.worker_tps.append(seen.timings["predicted_per_second"])
    mode.worker_ttfts.append(seen.timings["prompt_ms"] / 1e3)
    mode.finishes[str(seen.finish)] += 1


async def batch(
    client: httpx.AsyncClient, bodies: list[dict[str, Any]], check: Check | None, mode: Mode
) -> None:
    """Every client's request at once, timed until the last answer ends."""
    tokens, answers = mode.tokens, len(mode.worker_tps)
    started = time.perf_counter()
    await asyncio.gather(*(one(client, body, check, mode) for body in bodies))
    wall = time.perf_counter() - started
    mode.wall += wall
    worker = mode.worker_tps[answers:]  # None: a round without one answer
    mode.rounds.append(
        ((mode.tokens - tokens) / wall, statistics.median(worker)) if worker else None
    )


async def level(
    url: str, clients: int, tokens: int, rounds: int, wanted: dict[str, Any], check: Check
) -> dict[str, Mode]:
    shapes = {"unconstrained": None, "constrained": wanted}
    bodies = {m: [request(i, tokens, shapes[m]) for i in range(clients)] for m in MODES}
    checks = {"unconstrained": None, "constrained": check}
    results = {m: Mode() for m in MODES}
    async with pooled(url, clients) as client:
        for m in MODES:  # unmeasured: prompts cached, grammar compiled, batch shapes seen
            await batch(client, bodies[m], checks[m], Mode())
        for r in range(rounds):
            for m in MODES if r % 2 == 0 else MODES[::-1]:
                await batch(client, bodies[m], checks[m], results[m])
    return results


def report(clients: int, rounds: int, results: dict[str, Mode]) -> None:
    print(f"\nc={clients}: {rounds} round(s) of {clients} request(s) per mode")
    print(f"{'mode':15}{'agg tok/s':>11}{'worker tok/s/req':>18}{'p50 TTFT ms':>13}", end="")
    print(f"{'(worker)':>9}", end="")
    print(f"{'tokens':>8}  finish, errors")
    speeds = {}
    for name, m in results.items():
        agg = m.tokens / m.wall
        worker = statistics.median(m.worker_tps) if m.worker_tps else float("nan")
        ttft, inside = (
            statistics.median(t) * 1e3 if t else float("nan") for t in (m.ttfts, m.worker_ttfts)
        )
        speeds[name] = agg, worker
        print(
            f"{name:15}{agg:>11.1f}{worker:>18.1f}{ttft:>13.1f}{inside:>9.1f}{m.tokens:>8}  ",
            end="",
        )
        print(f"{dict(m.finishes)}, {dict(m.errors) or 'none'}")
    (u_agg, u_worker), (c_agg, c_worker) = speeds["unconstrained"], speeds["constrained"]
    print(
        f"constrained / unconstrained: aggregate {c_agg / u_agg:.3f}, "
        f"worker decode {c_worker / u_worker:.3f}   (target >= 0.90)"
    )
    rounds = zip(results["constrained"].rounds, results["unconstrained"].rounds, strict=True)
    pairs = [(c, u) for c, u in rounds if c and u]
    if pairs:  # each round's two modes ran back to back: drift of the host cancels out
        agg = statistics.median(c[0] / u[0] for c, u in pairs)
        worker = statistics.median(c[1] / u[1] for c, u in pairs)
        print(
            f"  median of the {len(pairs)} rounds' ratios: aggregate {agg:.3f}, worker decode "
            f"{worker:.3f}",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="MLX model dir (default: the default model)")
    parser.add_argument("--concurrency", default="1,32")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bounded", action="store_true", help="strings with a maxLength")
    args = parser.parse_args()
    concurrency = [int(c) for c in args.concurrency.split(",")]

    model_dir = bench_model(args.model)
    wanted = schema(args.tokens, args.bounded)
    check = schema_check(model_dir, wanted)
    top = max(concurrency)
    print(f"model {model_dir}, {args.tokens} tokens per answer")
    print(f"constrained by {json.dumps(wanted)}")
    server = ["--max-batch", str(top), "--queue-size", str(max(64, 2 * top))]
    proc, url = start_server(model_dir, server)
    try:
        for c in concurrency:
            report(
                c, args.rounds, asyncio.run(level(url, c, args.tokens, args.rounds, wanted, check))
            )
    finally:
        proc.terminate()
        proc.wait(60)


if __name__ == "__main__":
    main()

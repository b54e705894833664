"""Speculative decoding: decode speed with and without it, measured in the same run.

Two workloads, each against a steward started with `--speculate none` and one with
`--speculate auto` (drafts where verify steps measure as paying; `--speculate always` for
the mechanism unjudged), one after the other on the same device:
- code edit: a file of ~150 lines in the prompt, "return the whole file with one change";
  asked plainly (n-gram lookup alone) and with the file as OpenAI's `prediction`, at each
  `--edit-concurrency` level;
- chat stories, which do not copy, at each `--chat-concurrency` level.
With `--draft-model DIR`, both workloads also against a steward with that draft model and
against `mlx_lm.server --draft-model` (the same pair), at each `--draft-concurrency` level.
Each client streams `--rounds` requests back to back (greedy). Printed per workload, mode
and C: per-request decode tok/s (median, after the first token, the server's own usage
count over the stream's time), aggregate tok/s, the draft tokens' acceptance (usage), and
the ratio of decode speed to speculation off.

    python -m bench.speculation [--model DIR] [--draft-model DIR] [--speculate always] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.client import pooled, stream_chat
from bench.overhead import bench_model, start_server
from bench.throughput import start_peer

STORY = "Write a long story about a lighthouse keeper and the ships she watches."
EDIT = (
    "Here is a Python file.\n\n```python\n{file}```\n\nRename the parameter `{old}` of "
    "`{function}` to `{new}`, everywhere in that function. Answer with the whole file, "
    "changed, in one code block, and nothing else."
)


def source(functions: int, variant: int) -> tuple[str, str]:
    """A file of `functions` small functions (about 12 lines each); the one to edit."""
    parts = []
    for i in range(functions):
        name = f"measure_{variant}_{i}"
        parts.append(
            f"def {name}(values, scale, offset):\n"
            f'    """Scale and shift the values of batch {i}, dropping the negative ones."""\n'
            "    result = []\n"
            "    for value in values:\n"
            "        shifted = value * scale + offset\n"
            "        if shifted < 0:\n"
            "            continue\n"
            f"        result.append(round(shifted, {i % 4 + 1}))\n"
            f"    if len(result) > {10 + i}:\n"
            f"        result = result[:{10 + i}]\n"
            "    return result\n\n\n"
        )
    return "".join(parts), f"measure_{variant}_{functions // 2}"


@dataclass
class Level:
    """One mode at one concurrency."""

    tokens: int = 0
    wall: float = 0.0
    decode: list[float] = field(default_factory=list)  # per request, tok/s after the first
    accepted: int = 0
    rejected: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def acceptance(self) -> float:
        drafted = self.accepted + self.rejected
        return self.accepted / drafted if drafted else float("nan")


def body(
    workload: str, predicted: bool, client: int, model: str, args: argparse.Namespace
) -> dict[str, Any]:
    """One client's request: its own file to edit (so no two prompts are one), or a story;
    the prediction is the file as it was, in the code block the answer is asked for."""
    file, function = source(args.functions, client)
    edit = EDIT.format(file=file, function=function, old="scale", new="factor")
    ask: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": STORY if workload == "story" else edit}],
        "max_tokens": args.tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if predicted:
        ask["prediction"] = {"type": "content", "content": f"```python\n{file}```"}
    return ask


async def load(
    url: str, model: str, workload: str, predicted: bool, clients: int, args: argparse.Namespace
) -> Level:
    level = Level()
    async with pooled(url, clients) as http:

        async def user(client: int) -> None:
            for _ in range(args.rounds):
                ask = body(workload, predicted, client, model, args)
                seen = await stream_chat(http, ask)
                if isinstance(seen, str) or not seen.times or not seen.usage:
                    level.errors.append(seen if isinstance(seen, str) else "no tokens")
                    continue
                usage, times = seen.usage, seen.times
                level.tokens += usage["completion_tokens"]
                if times[-1] > times[0]:
                    level.decode.append((usage["completion_tokens"] - 1) / (times[-1] - times[0]))
                details = usage.get("completion_tokens_details") or {}
                level.accepted += details.get("accepted_prediction_tokens", 0)
                level.rejected += details.get("rejected_prediction_tokens", 0)

        started = time.perf_counter()
        await asyncio.gather(*(user(c) for c in range(clients)))
        level.wall = time.perf_counter() - started
    return level


# A server's modes: (workload, with the prediction, the mode's name, concurrency levels).
Modes = list[tuple[str, bool, str, list[int]]]


def run(
    name: str,
    started: tuple[subprocess.Popen, str],
    model: str,
    work: Modes,
    args: argparse.Namespace,
) -> dict[tuple[str, str, int], Level]:
    """Every workload and level of `work` against one server, each level warmed up once
    alike (unmeasured), then measured; the server stopped after."""
    proc, url = started
    results = {}
    once = argparse.Namespace(**{**vars(args), "rounds": 1})
    try:
        for workload, predicted, mode, levels in work:
            for c in levels:
                asyncio.run(load(url, model, workload, predicted, c, once))
                level = asyncio.run(load(url, model, workload, predicted, c, args))
                results[workload, mode, c] = level
                speed = statistics.median(level.decode or [0])
                print(
                    f"  {name:10} {workload:5} {mode:10} c={c}: {speed:.1f} tok/s/request "
                    f"errors {len(level.errors)}",
                    flush=True,
                )
    finally:
        proc.terminate()
        proc.wait(60)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="MLX model dir (default: the default model)")
    parser.add_argument("--edit-concurrency", default="1,8,32")
    parser.add_argument("--chat-concurrency", default="1,32")
    parser.add_argument("--draft-model", type=Path, help="also a draft model, and mlx_lm.server")
    parser.add_argument("--draft-concurrency", default="1,8")
    parser.add_argument("--no-peer", action="store_true", help="skip mlx_lm.server --draft-model")
    parser.add_argument("--functions", type=int, default=12, help="in the edited file")
    parser.add_argument("--tokens", type=int, default=1200, help="most tokens an answer has")
    parser.add_argument("--rounds", type=int, default=2, help="requests per client")
    parser.add_argument(
        "--speculate", choices=["auto", "always"], default="auto", help="the speculating mode"
    )
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run on a CPU: tiny file, few tokens"
    )
    args = parser.parse_args()
    if args.quick:
        args.edit_concurrency = args.chat_concurrency = args.draft_concurrency = "1,2"
        args.functions, args.tokens, args.rounds = 2, 32, 1
    edit, chat, drafted = (
        [int(c) for c in text.split(",")]
        for text in (args.edit_concurrency, args.chat_concurrency, args.draft_concurrency)
    )
    model = bench_model(args.model)
    print(f"model {model}, {args.functions} functions, at most {args.tokens} tokens an answer")
    if args.draft_model:
        edit_off, chat_off = sorted({*edit, *drafted}), sorted({*chat, *drafted})
    else:
        edit_off, chat_off = edit, chat
    off = [("edit", False, "off", edit_off), ("story", False, "off", chat_off)]
    on = [
        ("edit", False, "lookup", edit),
        ("edit", True, "prediction", edit),
        ("story", False, "lookup", chat),
    ]
    results = run("off", start_server(model, ["--speculate", "none"]), "default", off, args)
    results |= run("on", start_server(model, ["--speculate", args.speculate]), "default", on, args)
    if args.draft_model:
        draft = [("edit", False, "draft", drafted), ("story", False, "draft", drafted)]
        drafting = ["--speculate", args.speculate, "--draft-model", str(args.draft_model)]
        server = start_server(model, drafting)
        results |= run("draft", server, "default", draft, args)
        if not args.no_peer:
            peer = [(w, p, "mlx_lm " + m, c) for w, p, m, c in draft]
            server = start_peer(model, args.tokens, ["--draft-model", str(args.draft_model)])
            results |= run("mlx_lm", server, str(model), peer, args)

    print()
    head = f"{'workload':10}{'mode':16}{'c':>4}{'decode tok/s/req':>18}{'agg tok/s':>11}"
    print(head + f"{'acceptance':>12}{'vs off':>8}  errors")
    order = ["off", "lookup", "prediction", "draft", "mlx_lm draft"]
    for (workload, mode, c), r in sorted(
        results.items(), key=lambda kv: (kv[0][0], kv[0][2], order.index(kv[0][1]))
    ):
        speed = statistics.median(r.decode or [0])
        base = results.get((workload, "off", c))
        ratio = speed / statistics.median(base.decode or [float("nan")]) if base else float("nan")
        print(
            f"{workload:10}{mode:16}{c:>4}{speed:>18.1f}{r.tokens / r.wall:>11.1f}"
            f"{r.acceptance:>12.2f}{ratio:>8.2f}  {len(r.errors)}"
        )


if __name__ == "__main__":
    main()

"""Speculative decoding: decode speed with and without it, measured in the same run.

Two workloads, each against a steward started with `--speculate none` and one with the
default (`auto`), one after the other on the same device:
- code edit: a file of ~150 lines in the prompt, "return the whole file with one change";
  asked plainly (n-gram lookup alone) and with the file as OpenAI's `prediction`, at each
  `--edit-concurrency` level;
- chat stories, which do not copy, at each `--chat-concurrency` level.
Each client streams `--rounds` requests back to back (greedy). Printed per workload, mode
and C: per-request decode tok/s (median, after the first token, the server's own usage
count over the stream's time), aggregate tok/s, the draft tokens' acceptance (usage), and
the ratio of decode speed to speculation off.

    python -m bench.speculation [--model DIR] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.client import pooled, stream_chat
from bench.overhead import bench_model, start_server

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


def body(workload: str, predicted: bool, client: int, args: argparse.Namespace) -> dict[str, Any]:
    """One client's request: its own file to edit (so no two prompts are one), or a story;
    the prediction is the file as it was, in the code block the answer is asked for."""
    file, function = source(args.functions, client)
    content = EDIT.format(file=file, function=function, old="scale", new="factor")
    ask: dict[str, Any] = {
        "model": "default",
        "messages": [{"role": "user", "content": STORY if workload == "story" else content}],
        "max_tokens": args.tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if predicted:
        ask["prediction"] = {"type": "content", "content": f"```python\n{file}```"}
    return ask


async def load(
    url: str, workload: str, predicted: bool, clients: int, args: argparse.Namespace
) -> Level:
    level = Level()
    async with pooled(url, clients) as http:

        async def user(client: int) -> None:
            for _ in range(args.rounds):
                seen = await stream_chat(http, body(workload, predicted, client, args))
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


def run(model: Path, speculate: str, args: argparse.Namespace) -> dict[tuple, Level]:
    """Every workload, mode and level against one server (warmed up alike, unmeasured)."""
    modes = [("edit", False, args.edit), ("story", False, args.chat)]
    if speculate == "auto":
        modes.insert(1, ("edit", True, args.edit))
    proc, url = start_server(model, ["--speculate", speculate, "--queue-size", "256"])
    results = {}
    once = argparse.Namespace(**{**vars(args), "rounds": 1})
    try:
        for workload, predicted, levels in modes:
            for c in levels:
                asyncio.run(load(url, workload, predicted, c, once))  # every shape met once
                level = asyncio.run(load(url, workload, predicted, c, args))
                results[workload, predicted, c] = level
                print(
                    f"  {speculate:5} {workload:5} {'prediction' if predicted else 'plain':10} "
                    f"c={c}: {statistics.median(level.decode or [0]):.1f} tok/s/request, "
                    f"errors {level.errors or 0}",
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
    parser.add_argument("--functions", type=int, default=12, help="in the edited file")
    parser.add_argument("--tokens", type=int, default=1200, help="most tokens an answer has")
    parser.add_argument("--rounds", type=int, default=2, help="requests per client")
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run on a CPU: tiny file, few tokens"
    )
    args = parser.parse_args()
    if args.quick:
        args.edit_concurrency, args.chat_concurrency = "1,2", "1,2"
        args.functions, args.tokens, args.rounds = 2, 32, 1
    args.edit = [int(c) for c in args.edit_concurrency.split(",")]
    args.chat = [int(c) for c in args.chat_concurrency.split(",")]
    model = bench_model(args.model)
    print(f"model {model}, {args.functions} functions, at most {args.tokens} tokens an answer")
    off = run(model, "none", args)
    on = run(model, "auto", args)

    print()
    head = f"{'workload':10}{'mode':12}{'c':>4}{'decode tok/s/req':>18}{'agg tok/s':>11}"
    print(head + f"{'acceptance':>12}{'vs off':>8}  errors")
    for (workload, predicted, c), level in sorted(on.items(), key=lambda kv: kv[0]):
        base = off[workload, False, c]
        for mode, r in (("off", base), ("prediction" if predicted else "lookup", level)):
            if mode == "off" and predicted:
                continue  # printed once, beside lookup
            speed = statistics.median(r.decode or [0])
            ratio = speed / statistics.median(base.decode or [float("nan")])
            print(
                f"{workload:10}{mode:12}{c:>4}{speed:>18.1f}{r.tokens / r.wall:>11.1f}"
                f"{r.acceptance:>12.2f}{ratio:>8.2f}  {len(r.errors)}"
            )


if __name__ == "__main__":
    main()

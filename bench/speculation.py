"""Speculative decoding: decode speed with and without it, measured in the same run.

Two workloads, each against a steward started with `--speculate none` and one with
`--speculate auto` (drafts where verify steps measure as paying; `--speculate always` for
the mechanism unjudged), all up at once on the same device and asked in turn, a round of
requests at a time (what drifts over a run drifts alike for each):
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

    python -m bench.speculation [--model DIR] [--draft-model DIR] [--part all|lookup|draft]
        [--speculate always] [--quick]
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

    def add(self, other: Level) -> None:
        self.tokens += other.tokens
        self.wall += other.wall
        self.decode += other.decode
        self.accepted += other.accepted
        self.rejected += other.rejected
        self.errors += other.errors

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


@dataclass
class Server:
    """A server under test, and what it is asked: (workload, with the prediction, the
    mode's name, concurrency levels) each."""

    proc: subprocess.Popen
    url: str
    model: str
    modes: list[tuple[str, bool, str, list[int]]]


def run(servers: list[Server], args: argparse.Namespace) -> dict[tuple[str, str, int], Level]:
    """Every server's modes, level by level: each level warmed up once alike (unmeasured)
    on every server, then measured a round at a time on each in turn, so that what drifts
    on the device over a run drifts alike for all; the servers stopped after."""
    once = argparse.Namespace(**{**vars(args), "rounds": 1})
    asks = [
        (server, workload, predicted, mode, c)
        for server in servers
        for workload, predicted, mode, levels in server.modes
        for c in levels
    ]
    results: dict[tuple[str, str, int], Level] = {}
    try:
        for workload, c in dict.fromkeys((w, c) for _, w, _, _, c in asks):
            here = [ask for ask in asks if ask[1] == workload and ask[4] == c]
            for measured in range(args.rounds + 1):  # round 0 warms up
                for server, _, predicted, mode, _ in here:
                    got = asyncio.run(load(server.url, server.model, workload, predicted, c, once))
                    level = results.setdefault((workload, mode, c), Level())
                    if measured:
                        level.add(got)
            for _, _, _, mode, _ in here:
                speed = statistics.median(results[workload, mode, c].decode or [0])
                errors = len(results[workload, mode, c].errors)
                line = f"  {workload:5} {mode:12} c={c}: {speed:.1f} tok/s/request errors {errors}"
                if errors:
                    line += f" (the first: {results[workload, mode, c].errors[0][:200]})"
                print(line, flush=True)
    finally:
        for server in servers:
            server.proc.terminate()
        for server in servers:
            server.proc.wait(60)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="MLX model dir (default: the default model)")
    parser.add_argument("--edit-concurrency", default="1,8,32")
    parser.add_argument("--chat-concurrency", default="1,32")
    parser.add_argument("--draft-model", type=Path, help="also a draft model, and mlx_lm.server")
    parser.add_argument("--draft-concurrency", default="1,8")
    parser.add_argument("--no-peer", action="store_true", help="skip mlx_lm.server --draft-model")
    parser.add_argument(
        "--part",
        choices=["all", "lookup", "draft"],
        default="all",
        help="lookup and prediction alone, or the draft model alone (with its baseline)",
    )
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
    lookup = args.part != "draft"
    drafting = args.draft_model is not None and args.part != "lookup"
    edit_off = sorted({*(edit if lookup else []), *(drafted if drafting else [])})
    chat_off = sorted({*(chat if lookup else []), *(drafted if drafting else [])})
    off = [("edit", False, "off", edit_off), ("story", False, "off", chat_off)]
    servers = [Server(*start_server(model, ["--speculate", "none"]), "default", off)]
    if lookup:
        on = [
            ("edit", False, "lookup", edit),
            ("edit", True, "prediction", edit),
            ("story", False, "lookup", chat),
        ]
        servers.append(Server(*start_server(model, ["--speculate", args.speculate]), "default", on))
    if drafting:
        draft = [("edit", False, "draft", drafted), ("story", False, "draft", drafted)]
        flags = ["--speculate", args.speculate, "--draft-model", str(args.draft_model)]
        servers.append(Server(*start_server(model, flags), "default", draft))
        if not args.no_peer:
            peer = [(w, p, "mlx_lm " + m, c) for w, p, m, c in draft]
            started = start_peer(model, args.tokens, ["--draft-model", str(args.draft_model)])
            servers.append(Server(*started, str(model), peer))
    results = run(servers, args)

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
            f"{workload:10}{mode:16}{c:>4}{speed:>18.1f}{r.tokens / (r.wall or 1):>11.1f}"
            f"{r.acceptance:>12.2f}{ratio:>8.2f}  {len(r.errors)}"
        )


if __name__ == "__main__":
    main()

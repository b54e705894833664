"""Time to recovery, fault -> serving again, for each kind of backend fault (SPEC §3) and
each kind of spare (`--standby none|warm|hot`), against restarting the whole process.

For each fault action a real `steward serve` runs the model with `--inject-fault
decode:ACTION:nth=2` (once its spare is ready); request 1 is served normally, request 2
meets the fault. Reported: the supervisor's own measure (fault detected -> serving, /health
`recovery_s`), the worker bring-up time of that server (load + canary), and what the client
saw: the faulted request's latency against a normal one's (the difference is what the
fault cost it, replay included). The baseline is what a process supervisor alone would
give: kill steward, start it again, first answer.

Targets: a request-scoped fault (raise) recovers in <= 2 s; a worker replacement (poison,
crash, hang) in <= bring-up + 1 s without a spare, hang plus its --stall-timeout to be
noticed.

    python -m bench.recovery [--model DIR] [--stall-timeout 5] [--standby none,warm,hot]

`--batch`: a full batch meets one fault (issue 20). `--clients` N (32) streams decode
together: N - 1 clients each stream `--rounds` answers back to back, and once all of them
are decoding, a quarter into their answers (at the batch's speed measured in a warm-up), one
more request joins. In the `crash` run that joiner is the server's request 2N and
`decode:crash:nth=2N` kills the worker at its second token (so the joiner is the fault's
prime suspect, tried alone after the others); in the `crash-mid` run the crash strikes a
decoding member mid-answer (`decode:crash:nth=N+1@K`, K half the answer: no member is at
its first step, the batch runs again as one group); in the `poison` run the joiner carries
`decode:poison:marker=M`. Printed per run: the worst gap between two content deltas any
stream saw, TTFT p50/p95, innocent requests answered and failed, worker replacements, and
whether the poison was quarantined. Each run gets a server of its own, unless `--url` names
one started fresh with `--max-batch N --inject-fault 'decode:crash:nth=2N;decode:poison:
marker=BENCH-POISON'` (the crash run goes first there: nth counts the server's requests).

    python -m bench.recovery --batch [--model DIR | --random 1b] [--clients 32] [--tokens 128]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.client import Streamed, pooled, stream_chat
from bench.overhead import bench_model, start_server
from bench.throughput import pct

BODY = {
    "messages": [{"role": "user", "content": "What is the capital of France?"}],
    "max_tokens": 4,
    "temperature": 0,
}


# (standby, fault) -> seconds: a request-scoped fault costs a canary; a hot spare is a swap
TARGETS = {(standby, "raise"): 2.0 for standby in ("none", "warm", "hot")} | {("hot", "crash"): 0.5}


def timed_post(url: str) -> tuple[int, float]:
    started = time.perf_counter()
    r = httpx.post(url + "/v1/chat/completions", json=BODY, timeout=600)
    return r.status_code, time.perf_counter() - started


def spare_ready(url: str, standby: str) -> None:
    deadline = time.monotonic() + 600
    while standby != "none" and time.monotonic() < deadline:
        if httpx.get(url + "/health").json()["standby"]["state"] == "ready":
            return
        time.sleep(0.05)


def restart(model: Path | None) -> float:
    """Kill steward, start it again, first answer: seconds."""
    proc, url = start_server(model, ["--standby", "none"])
    timed_post(url)
    started = time.perf_counter()
    proc.kill()
    proc.wait(60)
    proc, url = start_server(model, ["--standby", "none"])
    try:
        timed_post(url)
        return time.perf_counter() - started
    finally:
        proc.terminate()
        proc.wait(60)


def one(model: Path | None, action: str, stall: float, standby: str) -> dict:
    args = ["--inject-fault", f"decode:{action}:nth=2", "--stall-timeout", str(stall)]
    proc, url = start_server(model, [*args, "--standby", standby])
    try:
        spare_ready(url, standby)
        bring_up = httpx.get(url + "/health").json()["worker"]["bring_up_s"]
        status_1, normal = timed_post(url)
        status_2, faulted = timed_post(url)
        health = httpx.get(url + "/health").json()
    finally:
        proc.terminate()
        proc.wait(60)
    fault = health["faults"]["last"]
    return {
        "standby": standby,
        "action": action,
        "class": fault["class"],
        "recovery_s": fault["recovery_s"],
        "bring_up_s": bring_up,
        "normal_s": normal,
        "faulted_s": faulted,
        "statuses": (status_1, status_2),
        "generation": health["worker"]["generation"],
    }


MARKER = "BENCH-POISON"
STORY = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]


@dataclass
class BatchRun:
    """One fault met by a full batch, as its clients saw it."""

    fault: str
    innocents: list[Streamed | str]  # an answer, or what went wrong
    joiner: Streamed | str
    replacements: float
    health: dict

    def answered(self) -> list[Streamed]:
        return [s for s in self.innocents if whole(s)]

    def worst_gap(self) -> float:
        return max((gap for s in self.answered() for gap in gaps(s)), default=0.0)

    def ttfts(self) -> list[float]:
        return [s.times[0] - s.started for s in self.answered()]

    def errors(self) -> Counter[str]:
        """Innocent requests not answered in full, by what their clients saw."""
        return Counter(s if isinstance(s, str) else "unfinished" for s in self.innocents
                       if not whole(s))  # fmt: skip


def whole(seen: Streamed | str) -> bool:
    """Answered to its end (a finish reason, some content), not an error."""
    return isinstance(seen, Streamed) and seen.finish is not None and bool(seen.times)


def gaps(seen: Streamed) -> list[float]:
    """Seconds between consecutive content deltas of one stream."""
    return [b - a for a, b in itertools.pairwise(seen.times)]


def restarts(url: str) -> float:
    """Workers started after the first (/metrics), else the restarts in the window (/health)."""
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith("steward_worker_restarts_total "):
            return float(line.split()[1])
    return float(httpx.get(url + "/health", timeout=30).json()["restarts_in_window"])


async def until_decoding(url: str, members: int) -> None:
    """/health shows `members` in flight (never a wait for a time: they may be slow)."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        while (await client.get("/health")).json()["in_flight"] < members:
            await asyncio.sleep(0.01)


async def full_batch(url: str, clients: int, rounds: int, tokens: int, joiner: str) -> tuple:
    """A warm-up batch of `clients`, then `clients - 1` streams and the joiner."""
    body = {"messages": STORY, "max_tokens": tokens, "temperature": 0, "stream": True}
    joining = {**body, "messages": [{"role": "user", "content": joiner}]}
    async with pooled(url, clients + 1) as client:
        warm = await asyncio.gather(*(stream_chat(client, body) for _ in range(clients)))
        steps = [gap for s in warm if isinstance(s, Streamed) for gap in gaps(s)]
        step = statistics.median(steps) if steps else 0.0

        async def user() -> list[Streamed | str]:
            return [await stream_chat(client, body) for _ in range(rounds)]

        users = [asyncio.ensure_future(user()) for _ in range(clients - 1)]
        await until_decoding(url, clients - 1)
        await asyncio.sleep(step * tokens / 4)  # a quarter into their answers
        joined = await stream_chat(client, joining)
        innocents = [s for answers in await asyncio.gather(*users) for s in answers]
    return innocents, joined


def batch_run(fault: str, url: str, args: argparse.Namespace) -> BatchRun:
    before = restarts(url)
    spare_ready(url, str(httpx.get(url + "/health").json()["standby"].get("mode", "none")))
    text = STORY[0]["content"] + (f" {MARKER}" if fault == "poison" else "")
    innocents, joiner = asyncio.run(full_batch(url, args.clients, args.rounds, args.tokens, text))
    if fault.startswith("crash"):
        innocents.append(joiner)  # the crash's own request is innocent too
    deadline = time.monotonic() + 600
    while (health := httpx.get(url + "/health").json())["status"] not in ("ready", "degraded"):
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return BatchRun(fault, innocents, joiner, restarts(url) - before, health)


def batch_main(args: argparse.Namespace) -> None:
    model = None if args.url else bench_model(args.model)
    if args.random:
        from bench.random_llama import build

        model = build(Path(tempfile.mkdtemp()), model, args.random, None)
    n = args.clients
    specs = {
        "crash": f"decode:crash:nth={2 * n}",
        "crash-mid": f"decode:crash:nth={n + 1}@{max(2, args.tokens // 2)}",
        "poison": f"decode:poison:marker={MARKER}",
    }
    print(f"model {args.url or model}, {n} streams of {args.tokens} tokens, {args.rounds} rounds")
    print(f"(standby: {args.standby}; with --url, the server's own)")
    runs = []
    for fault in args.runs.split(","):
        if args.url:
            runs.append(batch_run(fault, args.url, args))
            continue
        serve = ["--standby", args.standby, "--max-batch", str(n), "--queue-size", str(4 * n)]
        proc, url = start_server(model, [*serve, "--inject-fault", specs[fault]])
        try:
            runs.append(batch_run(fault, url, args))
        finally:
            proc.terminate()
            proc.wait(60)
    print(
        f"{'fault':8}{'innocents':>10}{'answered':>9}{'errors':>7}{'worst gap s':>12}"
        f"{'TTFT p50 s':>11}{'p95 s':>7}{'replaced':>9}{'faults':>7}  {'last fault':13}poison"
    )
    for run in runs:
        errors, faults = run.errors(), run.health["faults"]
        poison = "-"
        if run.fault == "poison":
            poison = "quarantined" if "request_quarantined" in str(run.joiner) else "NOT"
        print(
            f"{run.fault:8}{len(run.innocents):>10}{len(run.answered()):>9}"
            f"{sum(errors.values()):>7}{run.worst_gap():>12.3f}{pct(run.ttfts(), 0.5):>11.3f}"
            f"{pct(run.ttfts(), 0.95):>7.3f}{run.replacements:>9.0f}"
            f"{faults['total']:>7}  {(faults['last'] or {}).get('class', '-'):13}{poison}"
        )
        if errors:
            print(f"  {run.fault} errors: {errors}")
        if isinstance(run.joiner, Streamed):
            own = max(gaps(run.joiner), default=0.0)
            print(f"  {run.fault}: the joiner's own worst gap {own:.3f} s")
        if run.fault == "poison" and poison == "NOT":
            print(f"  the poison request ended: {run.joiner}")
        print(f"  {run.fault}: standby {run.health['standby']}, last fault {faults['last']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", type=Path, help="model, or --random's tokenizer (default: the default model)"
    )
    parser.add_argument("--stall-timeout", type=float, default=5.0)
    parser.add_argument("--standby", default=None, help="none,warm,hot (--batch: auto)")
    parser.add_argument("--actions", default="raise,poison,crash,hang")
    batch = parser.add_argument_group("--batch: a full batch meets one fault")
    batch.add_argument("--batch", action="store_true")
    batch.add_argument("--url", help="a steward started for it (see above); else one per run")
    batch.add_argument("--random", choices=["1b", "8b"], help="a random llama, built here")
    batch.add_argument("--clients", type=int, default=32)
    batch.add_argument("--tokens", type=int, default=128)
    batch.add_argument("--rounds", type=int, default=2, help="answers per client")
    batch.add_argument("--runs", default="crash-mid,crash,poison")
    args = parser.parse_args()
    if args.batch:
        args.standby = args.standby or "auto"
        batch_main(args)
        return
    args.standby = args.standby or "none,warm,hot"
    rows = [
        one(args.model, action, args.stall_timeout, standby)
        for standby in args.standby.split(",")
        for action in args.actions.split(",")
    ]
    print(
        f"{'standby':8}{'fault':8}{'class':14}{'recovery s':>11}{'bring-up s':>11}"
        f"{'target s':>10}{'met':>5}{'normal req s':>14}{'faulted req s':>15}{'gen':>5}  statuses"
    )
    for row in rows:
        target = TARGETS.get((row["standby"], row["action"]))
        if target is None and row["standby"] == "none":
            target = row["bring_up_s"] + 1.0  # a new worker: its bring-up, and little else
        met = "-" if target is None else "yes" if row["recovery_s"] <= target else "NO"
        print(
            f"{row['standby']:8}{row['action']:8}{row['class']:14}{row['recovery_s']:>11.2f}"
            f"{row['bring_up_s']:>11.2f}{target or float('nan'):>10.2f}{met:>5}"
            f"{row['normal_s']:>14.2f}"
            f"{row['faulted_s']:>15.2f}{row['generation']:>5}  {row['statuses']}"
        )
    print(f"baseline, the whole process restarted (kill, start, first answer): "
          f"{restart(args.model):.2f} s")  # fmt: skip
    print(
        f"(hang is noticed after --stall-timeout {args.stall_timeout:.0f} s; recovery_s starts "
        "when a fault is detected)"
    )


if __name__ == "__main__":
    main()

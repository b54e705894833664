"""Faults on a GPU as clients see them, beside mlx_lm.server in the same run (SPEC §3: the
stall rule, failover on suspicion, a new worker in seconds, the disk tier where it pays).

Every run is a fresh real `steward serve` of one model (`--random 1b`: a random-weight
llama in bf16 built here, the default model's tokenizer):

- `start`: process start to first answer, steward with default flags (a cache directory of
  its own, empty: kernels and calibration measured afresh; then again with it filled)
  against `mlx_lm.server`'s cold start to its first answer. Target: steward's first start
  <= 1.25x the peer's.
- `hang`: `--clients` streams (32) of `--tokens` (128) greedy tokens, `--rounds` (2) each
  after a warm-up round; request 41 hangs at its 20th token (`decode:hang:nth=41@20`), with
  the default standby (hot where two copies fit) and with `--standby none`. Targets: every
  request answered, none refused; worst gap <= 2 s (hot), <= the replacement's bring-up +
  2 s (none); the replacement's bring-up (a new process: every phase) <= 5 s.
- `slow`: the same load with one step of 3 s (`decode:slow=3:nth=41@20`). Target: every
  request answered, no fault counted, no restart spent.
- `crash`: `--standby warm`, request 2 crashes the worker at its first decode step; the
  next answer's delay (the faulted request's latency less a normal one's) against killing
  mlx_lm.server and starting it again (kill to first answer). Target: the delay <= 0.5x the
  peer's restart.
- `poison`: a poison request joins a batch of 32 (bench/recovery.py's run): its two
  faults spend the hot spare and a replacement. Targets: innocents' TTFT <= 5 s, worst gap
  <= 1 s.
- `disk`: conversations of about `--context` (13,000) tokens, `RESUMES` of them with their
  next turn crashed at its 8th token and resumed on the hot spare, with and without
  `--prompt-cache-dir`, the run without it done again after. Target: the resumed streams'
  worst gap and the first turns' TTFT (medians: one stream is noise) with the disk tier
  no worse than without: at most the worse of the two runs without it (their difference
  is the noise between two runs of one server).

    python -m bench.failover --random 1b [--runs start,hang,slow,crash,poison,disk]
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

from bench.client import Streamed, pooled, stream_chat
from bench.overhead import bench_model, start_server
from bench.recovery import MARKER, batch_run, gaps, spare_ready, whole
from bench.throughput import pct, start_peer

STORY = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]
SHORT = {"messages": STORY, "max_tokens": 8, "temperature": 0}
AT_TOKEN = 20  # the token at which a hang or a slow step strikes
OPENINGS = 6  # first turns of distinct conversations timed per disk run (one is noise)
RESUMES = 3  # of those, conversations whose next turn is crashed and resumed


def faulted(clients: int) -> int:
    """The request a hang or a slow step strikes: one of the first measured round's (the
    warm-up round is requests 1 to `clients`); 41 of 32 clients."""
    return clients + clients // 4 + 1


def line(name: str, value: str, target: str = "", met: bool | None = None) -> None:
    verdict = "" if met is None else ("met" if met else "NOT met")
    print(f"  {name:42}{value:>22}   {target:24}{verdict}", flush=True)


def first_answer(url: str, started: float, deadline: float = 900) -> float:
    """Seconds from `started` until `url` answers a short chat completion."""
    while time.perf_counter() - started < deadline:
        try:
            r = httpx.post(url + "/v1/chat/completions", json=SHORT, timeout=600)
            if r.status_code == 200:
                return time.perf_counter() - started
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise SystemExit(f"{url} gave no answer within {deadline} s")


def steward(model: Path, flags: list[str], env: dict[str, str] | None = None) -> tuple:
    """A steward process started now (not waited for): (process, url, its start time)."""
    started = time.perf_counter()
    proc, url = start_server(model, flags, env=env)
    return proc, url, started


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(90)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def bring_up_s(worker: dict) -> float:
    """The serving worker's bring-up: its phases' sum where it came up as a spare (whose
    promotion, a swap, is all that `bring_up_s` counts then)."""
    return max(worker.get("bring_up_s", 0.0), sum((worker.get("phases") or {}).values()))


def health(url: str) -> dict:
    return httpx.get(url + "/health", timeout=30).json()


# -- start ------------------------------------------------------------------------------


def start_run(model: Path) -> None:
    print("start: process start to first answer", flush=True)
    started = time.perf_counter()
    peer, url = start_peer(model, 64)
    try:
        peer_s = first_answer(url, started)
    finally:
        peer.terminate()
        peer.wait(60)
    cache = tempfile.mkdtemp(prefix="steward-cache-")
    firsts = []
    for which in ("first start (empty cache)", "second start (cache filled)"):
        proc, url, started = steward(model, [], {"STEWARD_CACHE_DIR": cache})
        try:
            firsts.append(first_answer(url, started))
            body = health(url)
        finally:
            stop(proc)
        line(f"steward {which}", f"{firsts[-1]:.2f} s")
        line("  its worker's bring-up", f"{body['worker'].get('bring_up_s', 0):.2f} s")
        if phases := body["worker"].get("phases"):
            print(f"    phases {phases}")
    line("mlx_lm.server cold start", f"{peer_s:.2f} s")
    ratio = firsts[0] / peer_s
    line("steward first start / peer", f"{ratio:.2f}", "<= 1.25", ratio <= 1.25)


# -- hang and slow: a full batch meets one silent step -------------------------------------


async def load(url: str, clients: int, rounds: int, tokens: int) -> list[Streamed | str]:
    """A warm-up round of `clients` streams, then `clients` streams `rounds` times each."""
    body = {"messages": STORY, "max_tokens": tokens, "temperature": 0, "stream": True}
    async with pooled(url, clients) as client:
        await asyncio.gather(*(stream_chat(client, body) for _ in range(clients)))

        async def user() -> list[Streamed | str]:
            return [await stream_chat(client, body) for _ in range(rounds)]

        answers = await asyncio.gather(*(user() for _ in range(clients)))
    return [seen for some in answers for seen in some]


def batch_report(name: str, seen: list[Streamed | str], before: dict, after: dict) -> float:
    answered = [s for s in seen if whole(s)]
    errors = Counter(s if isinstance(s, str) else "unfinished" for s in seen if not whole(s))
    worst = max((gap for s in answered for gap in gaps(s)), default=0.0)
    ttfts = [s.times[0] - s.started for s in answered]
    line(f"{name}: answered", f"{len(answered)}/{len(seen)}", "all", len(answered) == len(seen))
    if errors:
        print(f"    errors {dict(errors)}")
    line(f"{name}: worst gap", f"{worst:.3f} s")
    line(f"{name}: TTFT p50 / p95 / max", f"{pct(ttfts, 0.5):.2f}/{pct(ttfts, 0.95):.2f}/"
         f"{max(ttfts, default=0):.2f} s")  # fmt: skip
    faults = after["faults"]["total"] - before["faults"]["total"]
    line(f"{name}: faults counted / restarts", f"{faults} / {after['restarts_in_window']}")
    print(f"    last fault {after['faults']['last']}", flush=True)
    return worst


def silent_step_run(model: Path, action: str, standby: str | None, args: argparse.Namespace):
    flags = ["--inject-fault", f"decode:{action}:nth={faulted(args.clients)}@{AT_TOKEN}"]
    flags += ["--standby", standby] if standby else []
    proc, url, _ = steward(model, flags)
    try:
        body = health(url)
        spare_ready(url, body["standby"].get("mode", "none"))
        before = health(url)
        seen = asyncio.run(load(url, args.clients, args.rounds, args.tokens))
        after = health(url)
        deadline = time.monotonic() + 90
        while action != "hang" and after["suspects"] and time.monotonic() < deadline:
            time.sleep(0.1)  # a slow worker's verdict: it comes when its step ends
            after = health(url)
    finally:
        stop(proc)
    return seen, before, after


def hang_run(model: Path, args: argparse.Namespace) -> None:
    nth = faulted(args.clients)
    print(f"hang: {args.clients} streams, request {nth} hangs at token {AT_TOKEN}", flush=True)
    for standby in (None, "none"):
        name = f"hang, standby {standby or 'default'}"
        seen, before, after = silent_step_run(model, "hang", standby, args)
        worst = batch_report(name, seen, before, after)
        print(f"    standby {after['standby']}")
        if standby is None:
            line(f"{name}: worst gap", f"{worst:.3f} s", "<= 2 s", worst <= 2.0)
        else:
            bring_up = bring_up_s(after["worker"])
            line(f"{name}: replacement's bring-up", f"{bring_up:.3f} s", "<= 5 s", bring_up <= 5)
            line(f"{name}: worst gap - bring-up", f"{worst - bring_up:.3f} s", "<= 2 s",
                 worst <= bring_up + 2.0)  # fmt: skip


def slow_run(model: Path, args: argparse.Namespace) -> None:
    nth = faulted(args.clients)
    print(f"slow: request {nth}'s step at token {AT_TOKEN} takes 3 s", flush=True)
    seen, before, after = silent_step_run(model, "slow=3", None, args)
    batch_report("slow", seen, before, after)
    faults = after["faults"]["total"] - before["faults"]["total"]
    spent = after["restarts_in_window"] - before["restarts_in_window"]
    line("slow: no fault, no restart", f"{faults} / {spent}", "0 / 0", faults == 0 == spent)


# -- crash with a warm spare, against the peer's whole restart ----------------------------


def timed(url: str, body: dict) -> float:
    started = time.perf_counter()
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=600)
    r.raise_for_status()
    return time.perf_counter() - started


def crash_run(model: Path) -> None:
    print("crash: --standby warm, request 2 crashes the worker", flush=True)
    proc, url, _ = steward(model, ["--standby", "warm", "--inject-fault", "decode:crash:nth=2"])
    try:
        spare_ready(url, "warm")
        normal = timed(url, SHORT)
        faulted = timed(url, SHORT)
        body = health(url)
    finally:
        stop(proc)
    started = time.perf_counter()
    peer, peer_url = start_peer(model, 64)
    first_answer(peer_url, started)
    started = time.perf_counter()
    peer.kill()
    peer.wait(60)
    peer, peer_url = start_peer(model, 64)
    try:
        restart = first_answer(peer_url, started)
    finally:
        peer.terminate()
        peer.wait(60)
    delay = faulted - normal
    bring_up = body["worker"].get("bring_up_s", 0.0)
    line("crash, warm spare: promoted in (load, shapes, canary)", f"{bring_up:.2f} s")
    if phases := body["worker"].get("phases"):
        print(f"    phases {phases}")
    line("crash, warm spare: next answer's delay", f"{delay:.2f} s")
    line("mlx_lm.server killed and started again", f"{restart:.2f} s")
    line("delay / peer's restart", f"{delay / restart:.2f}", "<= 0.5", delay <= 0.5 * restart)
    print(f"    last fault {body['faults']['last']}", flush=True)


# -- a poison request in a full batch -----------------------------------------------------


def poison_run(model: Path, args: argparse.Namespace) -> None:
    print(f"poison: a poison request joins {args.clients} streams", flush=True)
    n = args.clients
    flags = ["--max-batch", str(n), "--queue-size", str(4 * n)]
    flags += ["--inject-fault", f"decode:poison:marker={MARKER}"]
    proc, url, _ = steward(model, flags)
    try:
        run = batch_run("poison", url, args)
    finally:
        stop(proc)
    ttfts = run.ttfts()
    quarantined = "request_quarantined" in str(run.joiner)
    line("poison: innocents answered", f"{len(run.answered())}/{len(run.innocents)}")
    line("poison: innocents' TTFT max", f"{max(ttfts, default=0):.2f} s", "<= 5 s",
         max(ttfts, default=0) <= 5)  # fmt: skip
    line("poison: worst gap", f"{run.worst_gap():.3f} s", "<= 1 s", run.worst_gap() <= 1)
    line("poison: quarantined, replacements", f"{quarantined}, {run.replacements:.0f}")


# -- the disk tier ------------------------------------------------------------------------


def conversation(tokens: int, keeper: int = 0) -> list[dict]:
    """About `tokens` tokens of a log, none shared with another `keeper`'s."""
    lines = max(1, tokens // 17)  # about 17 tokens a line
    log = " ".join(f"Log entry {i}: keeper {keeper} trimmed the lamp and wound the clock." for
                   i in range(lines))  # fmt: skip
    return [{"role": "user", "content": f"Keeper {keeper}'s log. {log}\nSummarise the log."}]


async def turns(url: str, context: int) -> tuple[list[Streamed | str], list[Streamed | str]]:
    """`RESUMES` conversations, each a first turn then its next (crashed at its 8th token and
    resumed on the spare, which is waited for again before the next conversation), then
    first turns of `OPENINGS - RESUMES` more: every first turn's TTFT and every resumed
    stream's worst gap is one sample."""
    openings, resumed = [], []
    async with pooled(url, 1) as client:
        for keeper in range(OPENINGS):
            first = {"messages": conversation(context, keeper), "max_tokens": 16,
                     "temperature": 0, "stream": True}  # fmt: skip
            opened = await stream_chat(client, first)
            openings.append(opened)
            if keeper >= RESUMES:
                continue
            said = "".join(opened.text) if isinstance(opened, Streamed) else ""
            history = [*first["messages"], {"role": "assistant", "content": said}]
            history.append({"role": "user", "content": "And what did he do next?"})
            body = {"messages": history, "max_tokens": 32, "temperature": 0, "stream": True}
            body["stream_options"] = {"include_usage": True}
            resumed.append(await stream_chat(client, body))
            await asyncio.to_thread(spare_ready, url, "hot")
    return openings, resumed


def disk_run(model: Path, args: argparse.Namespace) -> None:
    print(
        f"disk: {RESUMES} conversations of {args.context} tokens, each next turn crashed "
        "at token 8 and resumed on the hot spare: without the disk tier, with, without"
    )
    rows = {}
    for name in ("without", "with disk", "without again"):
        # conversation k's next turn is request 2k + 2
        crashes = [f"decode:crash:nth={2 * k + 2}@8" for k in range(RESUMES)]
        flags = ["--standby", "hot", "--max-restarts", str(RESUMES + 1)]
        flags += [arg for spec in crashes for arg in ("--inject-fault", spec)]
        if name == "with disk":
            flags += ["--prompt-cache-dir", tempfile.mkdtemp(prefix="steward-kv-")]
        proc, url, _ = steward(model, flags)
        try:
            spare_ready(url, "hot")
            openings, resumed = asyncio.run(turns(url, args.context))
        finally:
            stop(proc)
        if not (all(isinstance(o, Streamed) for o in openings) and all(map(whole, resumed))):
            raise SystemExit(f"disk {name}: a conversation did not end whole: {resumed}")
        ttft = pct([o.times[0] - o.started for o in openings], 0.5)
        rows[name] = (ttft, pct([max(gaps(r), default=0.0) for r in resumed], 0.5))
        cached = [((r.usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens")
                  for r in resumed]  # fmt: skip
        line(f"disk {name}: the resumed turns' cached tokens", str(cached))
        line(f"disk {name}: first turns' TTFT p50 / resumed worst gap p50",
             f"{rows[name][0]:.3f} / {rows[name][1]:.3f} s")  # fmt: skip
    # Two runs without the disk tier bound the noise between runs: the disk tier is no
    # worse where it is within what the same server gives twice.
    for i, what in enumerate(("first TTFT p50", "worst gap p50")):
        with_disk, without = rows["with disk"][i], (rows["without"][i], rows["without again"][i])
        line(f"disk: {what} with / without (again)",
             f"{with_disk / without[0]:.2f} ({with_disk / without[1]:.2f})",
             "<= 1, or within noise", with_disk <= max(without))  # fmt: skip


RUNS = {"start": start_run, "crash": crash_run}
LOADED = {"hang": hang_run, "slow": slow_run, "poison": poison_run, "disk": disk_run}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="model, or --random's tokenizer")
    parser.add_argument("--random", choices=["1b", "8b"], help="a random llama, built here")
    parser.add_argument("--runs", default="start,hang,slow,crash,poison,disk")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--context", type=int, default=13_000)
    args = parser.parse_args()
    model = bench_model(args.model)
    if args.random:
        from bench.random_llama import build

        model = build(Path(tempfile.mkdtemp()), model, args.random, None)
    print(f"model {model}; python {sys.version.split()[0]}", flush=True)
    for run in args.runs.split(","):
        started = time.perf_counter()
        if run in RUNS:
            RUNS[run](model)
        else:
            LOADED[run](model, args)
        print(f"  ({run} took {time.perf_counter() - started:.0f} s)", flush=True)


if __name__ == "__main__":
    main()

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
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import httpx

from bench.overhead import start_server

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="model (default: the default model)")
    parser.add_argument("--stall-timeout", type=float, default=5.0)
    parser.add_argument("--standby", default="none,warm,hot")
    parser.add_argument("--actions", default="raise,poison,crash,hang")
    args = parser.parse_args()
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

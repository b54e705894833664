"""Time to recovery, fault -> serving again, for each kind of backend fault (SPEC §3).

For each fault action a real `steward serve` runs the model with `--inject-fault
decode:ACTION:nth=2`; request 1 is served normally, request 2 meets the fault. Reported:
the supervisor's own measure (fault detected -> serving, /health `recovery_s`), the worker
bring-up time of that server (load + canary, the yardstick for a replacement), and what the
client saw (latency of the faulted request, and of a normal one).

Targets: a request-scoped fault (raise) recovers in <= 2 s; a worker replacement (poison,
crash, hang) in <= bring-up + 1 s, hang plus its --stall-timeout to be noticed.

    python bench/recovery.py [--model DIR] [--stall-timeout 5]
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


def timed_post(url: str) -> tuple[int, float]:
    started = time.perf_counter()
    r = httpx.post(url + "/v1/chat/completions", json=BODY, timeout=600)
    return r.status_code, time.perf_counter() - started


def one(model: Path | None, action: str, stall: float) -> dict:
    args = ["--inject-fault", f"decode:{action}:nth=2", "--stall-timeout", str(stall)]
    proc, url = start_server(model, args)
    try:
        bring_up = httpx.get(url + "/health").json()["worker"]["bring_up_s"]
        status_1, normal = timed_post(url)
        status_2, faulted = timed_post(url)
        health = httpx.get(url + "/health").json()
    finally:
        proc.terminate()
        proc.wait(60)
    fault = health["faults"]["last"]
    return {
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
    args = parser.parse_args()
    rows = [one(args.model, a, args.stall_timeout) for a in ("raise", "poison", "crash", "hang")]
    print(
        f"{'fault':8}{'class':14}{'recovery s':>11}{'bring-up s':>11}{'target s':>10}"
        f"{'met':>5}{'normal req s':>14}{'faulted req s':>15}{'gen':>5}  statuses"
    )
    for row in rows:
        scoped = row["action"] == "raise"
        target = 2.0 if scoped else row["bring_up_s"] + 1.0
        met = "yes" if row["recovery_s"] <= target else "NO"
        print(
            f"{row['action']:8}{row['class']:14}{row['recovery_s']:>11.2f}"
            f"{row['bring_up_s']:>11.2f}{target:>10.2f}{met:>5}{row['normal_s']:>14.2f}"
            f"{row['faulted_s']:>15.2f}{row['generation']:>5}  {row['statuses']}"
        )
    print(
        f"(hang is noticed after --stall-timeout {args.stall_timeout:.0f} s; recovery_s starts "
        "when a fault is detected)"
    )


if __name__ == "__main__":
    main()

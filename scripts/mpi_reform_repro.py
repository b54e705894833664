"""Repeat: 3 long streams on an mpi group, SIGKILL or SIGSTOP rank 1 mid-stream; when the
re-formed group is suspected of a hang, dump every rank's stacks with gdb (rank 1 first).

    python scripts/mpi_reform_repro.py [FAULTS] [--model DIR]

Run from the repository root, beside two busy loops to make it likelier. gdb stops a rank
while it reads it, which the group's pulse bound takes for a hang: raise the bound for the
run where the stacks matter. Output under /tmp/sim (the model: /tmp/sim/tiny, built from the
default model's tokenizer when missing, as tests/conftest.py builds it).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.ranks.test_ranks import SERVING  # noqa: E402
from tests.supervisor.test_resume import stream  # noqa: E402

PORT = 18977
URL = f"http://127.0.0.1:{PORT}"
OUT = Path("/tmp/sim")
LOG = OUT / "repro_server.log"
PROMPTS = ["Count to ten.", "Name a bird.", "Why?"]
TOKENS = 480
GDB = ["gdb", "-batch", "-iex", "set auto-load safe-path /"]
STACKS = ["-ex", "thread apply all py-bt", "-ex", "thread apply all bt 14"]


def tiny_model(where: Path) -> Path:
    """The tests' tiny llama, built once."""
    if not (where / "config.json").is_file():
        from steward.model.gguf import materialize
        from steward.model.resolve import resolve_model
        from tests.tinymodel import build_tiny_model

        build_tiny_model(where, materialize(resolve_model(None)))
    return where


def health() -> dict:
    return httpx.get(URL + "/health", timeout=5).json()


def wait_serving() -> dict:
    """/health once the group serves, every rank of it."""
    for _ in range(600):
        try:
            h = health()
            ranks = h["worker"]["ranks"]
            if h["status"] in SERVING and ranks and all(r["serving"] for r in ranks):
                return h
        except (httpx.HTTPError, KeyError, TypeError):
            pass
        time.sleep(0.2)
    raise SystemExit("never serving")


def dump(tag: str, ranks: list[int]) -> None:
    """Each rank's stacks, rank 1 first (rank 0 waits in a collective either way)."""
    for rank, pid in sorted(enumerate(ranks), reverse=True):
        said = subprocess.run(
            [*GDB, "-p", str(pid), *STACKS], capture_output=True, text=True, timeout=180
        )
        text = said.stdout + "\n--stderr--\n" + said.stderr
        (OUT / f"repro_{tag}_r{rank}_{pid}.bt").write_text(text)
    print("dumped", tag, ranks, flush=True)


def attempt(number: int) -> bool:
    """One fault under 3 streams; whether a re-formed group was suspected of a hang (the
    faulted one is, when stopped: its pulse bound may be raised past the stall bound)."""
    victim = wait_serving()["worker"]["ranks"][1]["pid"]
    generation = health()["worker"]["generation"]
    started = [threading.Event() for _ in PROMPTS]
    results: list[dict | None] = [None] * len(PROMPTS)

    def run(i: int) -> None:
        results[i] = stream(URL, PROMPTS[i], TOKENS, started[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(PROMPTS))]
    for thread in threads:
        thread.start()
    for event in started:
        event.wait(60)
    time.sleep(0.3)
    mark = LOG.stat().st_size
    os.kill(victim, signal.SIGKILL if number % 2 == 0 else signal.SIGSTOP)
    hung = False
    while any(thread.is_alive() for thread in threads):
        if not hung and re.search(
            rf"worker (?!{generation}\b)\d+ suspected of a hang", LOG.read_text()[mark:]
        ):
            hung = True
            h = health()
            dump(f"a{number}", [r["pid"] for r in h["worker"]["ranks"]])
        time.sleep(0.2)
    errors = [(result or {}).get("errors") for result in results]
    print("attempt", number, "generation", generation, errors, "HUNG" if hung else "", flush=True)
    return hung


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("faults", type=int, nargs="?", default=6)
    parser.add_argument("--model", type=Path, default=OUT / "tiny")
    args = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    model = tiny_model(args.model)
    command = [sys.executable, "-m", "steward", "serve", "--model", str(model)]
    command += ["--ranks", "2", "--distributed-backend", "mpi", "--standby", "none"]
    command += ["--port", str(PORT), "--queue-timeout", "120", "--max-restarts", "1000"]
    with LOG.open("w") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            hangs = sum(attempt(number) for number in range(args.faults))
            print(f"{hangs} of {args.faults} re-formed groups suspected of a hang", flush=True)
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(60)


if __name__ == "__main__":
    main()

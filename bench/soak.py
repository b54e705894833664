"""Chaos soak: clients keep working while faults are injected on a schedule.

`--clients` (8) threads use the official `openai` SDK with its default retries, streaming and
not, with answers of mixed lengths, for `--minutes` (10), against a real `steward serve`
whose backend faults every `--every` (20) seconds, rotating `raise`, `poison`, `crash`,
`hang` and `slow` (SPEC §6 `period=S+OFFSET` triggers). Reported: requests, successes as the
clients saw them, failures by type, every fault with its recovery time, worker processes
left behind after the server exits (orphans), and the memory of the front and of each
worker over time (`--plot F.png` draws it).

    python -m bench.soak [--model DIR] [--minutes 10] [--standby warm] [--plot soak.png]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import openai

from bench.overhead import start_server

ACTIONS = ("raise", "poison", "crash", "hang", "slow=0.2")


def schedule(every: float) -> str:
    """One fault every `every` s, the actions in turn."""
    cycle = every * len(ACTIONS)
    return ";".join(
        f"decode:{action}:period={cycle:g}+{every * (i + 1):g}" for i, action in enumerate(ACTIONS)
    )


def rss(pid: int | None) -> int | None:
    """Resident memory in bytes, None if the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, TypeError):
        return None
    return None


class Soak:
    def __init__(self, url: str, clients: int, deadline: float) -> None:
        self.url, self.clients, self.deadline = url, clients, deadline
        self.outcomes: Counter[str] = Counter()
        self.lock = threading.Lock()

    def client(self, n: int) -> None:
        rng = random.Random(n)
        sdk = openai.OpenAI(base_url=self.url + "/v1", api_key="none", timeout=180)
        i = 0
        while time.monotonic() < self.deadline:
            i += 1
            messages = [{"role": "user", "content": f"Client {n}, question {i}: tell a story."}]
            tokens = rng.choice((8, 16, 32, 64))
            try:
                if i % 2:
                    reply = sdk.chat.completions.create(
                        model="default", messages=messages, max_tokens=tokens, temperature=0
                    )
                    ok = reply.choices[0].finish_reason in ("stop", "length")
                else:
                    finish = None
                    for chunk in sdk.chat.completions.create(
                        model="default",
                        messages=messages,
                        max_tokens=tokens,
                        temperature=0,
                        stream=True,
                    ):
                        finish = (
                            chunk.choices[0].finish_reason if chunk.choices else None
                        ) or finish
                    ok = finish in ("stop", "length")
                outcome = "ok" if ok else "no finish"
            except openai.APIStatusError as exc:
                outcome = f"{exc.status_code} {getattr(exc, 'type', None) or exc.body}"
            except openai.APIError as exc:  # an SSE error event, or the connection
                body = exc.body if isinstance(exc.body, dict) else {}
                outcome = f"stream {body.get('type', type(exc).__name__)}"
            with self.lock:
                self.outcomes[outcome] += 1

    def run(self, sample: threading.Event) -> None:
        threads = [threading.Thread(target=self.client, args=(n,)) for n in range(self.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        sample.set()


def watch(url: str, front: int, every: float, stop: threading.Event) -> tuple[list, set[int]]:
    """Memory samples (t, front, worker, spare) and every worker pid seen."""
    samples, pids = [], set()
    started = time.monotonic()
    with httpx.Client(base_url=url, timeout=5) as http:
        while not stop.wait(every):
            try:
                health = http.get("/health").json()
            except httpx.HTTPError:
                continue
            worker, spare = health["worker"]["pid"], health.get("standby", {}).get("pid")
            pids.update(p for p in (worker, spare) if p)
            samples.append((time.monotonic() - started, rss(front), rss(worker), rss(spare)))
    return samples, pids


def faults_logged(log: str) -> list[dict]:
    return [
        json.loads(line)["fault"]
        for line in log.splitlines()
        if line.startswith("{") and '"fault"' in line and '"steward.faults"' in line
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="MLX model dir (default: the default model)")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--every", type=float, default=20.0, help="seconds between faults")
    parser.add_argument("--standby", default="warm", choices=["none", "warm", "hot"])
    parser.add_argument("--plot", type=Path, help="a PNG of memory over time")
    args = parser.parse_args()

    log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"soak-{os.getpid()}.log"
    flags = ["--inject-fault", schedule(args.every), "--stall-timeout", "5", "--log-json"]
    flags += ["--standby", args.standby, "--max-restarts", "1000"]
    with log_path.open("w") as log_file:
        proc, url = start_server(args.model, flags, stderr=log_file)
        stop = threading.Event()
        result: list = []
        watcher = threading.Thread(
            target=lambda: result.extend(watch(url, proc.pid, 2.0, stop)), daemon=True
        )
        watcher.start()
        soak = Soak(url, args.clients, time.monotonic() + args.minutes * 60)
        soak.run(stop)
        watcher.join()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(120)
    samples, pids = result
    time.sleep(1.0)
    orphans = sorted(pid for pid in pids if rss(pid) is not None)
    faults = faults_logged(log_path.read_text())
    total = sum(soak.outcomes.values())
    ok = soak.outcomes["ok"]
    print(f"{args.minutes:g} min, {args.clients} clients, a fault every {args.every:g} s, "
          f"--standby {args.standby}; server exit code {code}")  # fmt: skip
    print(f"requests {total}, succeeded {ok} ({100 * ok / max(total, 1):.2f}%)")
    for outcome, n in soak.outcomes.most_common():
        if outcome != "ok":
            print(f"  failed: {outcome}: {n}")
    recovered = [f for f in faults if f.get("recovery_s") is not None]
    print(f"faults {len(faults)}, recovered {len(recovered)}")
    for fault in faults:
        print(f"  {fault['id']} {fault['class']}: {fault['action']}, {fault['recovery_s']} s")
    print(f"worker processes seen {len(pids)}, left after exit (orphans): {orphans or 0}")
    if samples:
        warm = samples[len(samples) // 5]
        last = samples[-1]
        print(
            f"front RSS {warm[1] / 2**20:.0f} MiB after warm-up, {last[1] / 2**20:.0f} MiB at "
            f"the end; worker {(warm[2] or 0) / 2**20:.0f} -> {(last[2] or 0) / 2**20:.0f} MiB"
        )
    if args.plot and samples:
        plot(samples, faults, args.plot)


def plot(samples: list, faults: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s[0] for s in samples]
    fig, ax = plt.subplots(figsize=(9, 4))
    for i, name in ((1, "front"), (2, "worker"), (3, "spare")):
        ax.plot(t, [(s[i] or 0) / 2**20 for s in samples], label=name)
    ax.set_xlabel("seconds")
    ax.set_ylabel("RSS, MiB")
    ax.set_title(f"steward soak: {len(faults)} faults injected")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out)
    print(f"plot: {out}")


if __name__ == "__main__":
    sys.exit(main())

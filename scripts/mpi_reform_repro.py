"""Repeat: 3 long streams on an mpi group, SIGSTOP rank 1 mid-stream; when the re-formed
group is suspected of a hang, dump every rank's native stacks with gdb."""
import os, re, signal, subprocess, sys, threading, time
from pathlib import Path
import httpx
sys.path.insert(0, "/work/main")
from tests.supervisor.test_resume import stream

PORT = 18931
from tests.ranks.test_ranks import SERVING
URL = f"http://127.0.0.1:{PORT}"
LOG = Path("/tmp/sim/repro_server.log")
out = open(LOG, "w")
server = subprocess.Popen(
    [sys.executable, "-m", "steward", "serve", "--model", "/tmp/sim/tiny", "--ranks", "2",
     "--distributed-backend", "mpi", "--standby", "none", "--port", str(PORT), "--queue-timeout", "120", "--max-restarts", "100"],
    stdout=out, stderr=subprocess.STDOUT, cwd="/work/main")

def health():
    return httpx.get(URL + "/health", timeout=5).json()

def wait_serving():
    for _ in range(600):
        try:
            h = health()
            if h["status"] in SERVING and h["worker"]["ranks"] and all(r["serving"] for r in h["worker"]["ranks"]):
                return h
        except Exception:
            pass
        time.sleep(0.2)
    raise SystemExit("never serving")

def children(pid):
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []

def dump(tag):
    ps = subprocess.run(["ps", "-eo", "pid,ppid,stat,pcpu,etimes,args"], capture_output=True, text=True).stdout
    Path(f"/tmp/sim/repro_{tag}_ps.txt").write_text(ps)
    rows = [l.split() for l in ps.splitlines()[1:] if "mpimeet" in l]
    oldest = max(int(r[4]) for r in rows)
    pids = sorted((int(r[0]) for r in rows if int(r[4]) == oldest), reverse=True)  # rank 1 first
    for round in range(1):
        for pid in pids:
            r = subprocess.run(["gdb", "-p", str(pid), "-batch", "-iex", "set auto-load safe-path /", "-ex", "thread apply all py-bt", "-ex", "thread apply all bt 14"], capture_output=True, text=True, timeout=120)
            Path(f"/tmp/sim/repro_{tag}_{pid}_{round}.bt").write_text(r.stdout + "\n--stderr--\n" + r.stderr)
        time.sleep(1)
    print("dumped", tag, pids, flush=True)

PROMPTS = ["Count to ten.", "Name a bird.", "Why?"]
try:
    for attempt in range(int(sys.argv[1]) if len(sys.argv) > 1 else 6):
        h = wait_serving()
        victim = h["worker"]["ranks"][1]["pid"]
        started = [threading.Event() for _ in PROMPTS]
        results = [None] * 3
        def run(i):
            results[i] = stream(URL, PROMPTS[i], 480, started[i])
        threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
        for t in threads: t.start()
        for e in started: e.wait(60)
        time.sleep(0.3)
        mark = LOG.stat().st_size
        os.kill(victim, signal.SIGKILL if attempt % 2 == 0 else signal.SIGSTOP)
        dumped = False
        while any(t.is_alive() for t in threads):
            text = LOG.read_text()[mark:]
            if not dumped and "suspected of a hang" in text:
                dump(f"a{attempt}")
                dumped = True
            time.sleep(0.2)
        print("attempt", attempt, [ (r or {}).get("errors") for r in results ], "dumped" if dumped else "", flush=True)
finally:
    server.send_signal(signal.SIGTERM)
    server.wait(60)

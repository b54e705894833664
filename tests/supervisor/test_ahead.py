"""The next worker's process started ahead (`--process-ahead`, supervisor/ahead.py), end to
end: a real front, real worker processes, real MLX on the tiny model, a real crash. The
replacement is the process that waited, its imports done before the fault."""

from __future__ import annotations

import signal
from pathlib import Path

from tests.conftest import until
from tests.supervisor.test_recovery import BODY
from tests.supervisor.test_standby import alive


def workers(front: int) -> set[int]:
    """The front's worker processes (spawned by multiprocessing, not its resource tracker)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rpartition(")")[2].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == front and b"spawn_main" in cmdline:
            found.add(int(stat.parent.name))
    return found


def test_a_replacement_is_the_process_started_ahead(serve, tiny_model) -> None:
    server = serve(
        "--model", str(tiny_model), "--standby", "none", "--process-ahead", "on",
        "--inject-fault", "decode:crash:nth=2",
    )  # fmt: skip
    health = server.wait()
    first = health["worker"]["pid"]
    until(lambda: len(workers(server.proc.pid)) == 2, 30, "a process started ahead")
    (ahead,) = workers(server.proc.pid) - {first}
    imports = health["worker"]["phases"]["imports"]
    assert server.http.post("/v1/chat/completions", json=BODY).status_code == 200
    assert server.http.post("/v1/chat/completions", json=BODY).status_code == 200  # crashes
    health = server.wait("degraded")
    assert health["faults"]["last"]["action"] == "replaced worker (generation 2)"
    assert health["worker"]["pid"] == ahead  # the process that waited serves now
    phases = health["worker"]["phases"]
    assert "start" not in phases and phases["imports"] < imports / 4, (phases, imports)
    until(lambda: len(workers(server.proc.pid) - {ahead}) == 1, 30, "the next one ahead")
    pids = workers(server.proc.pid)
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait(10)
    until(lambda: not any(alive(pid) for pid in pids), 10, "no process left of the front")


def test_on_a_cpu_auto_starts_none_ahead(serve, tiny_model) -> None:
    server = serve("--model", str(tiny_model), "--standby", "none")
    health = server.wait()
    assert server.http.post("/v1/chat/completions", json=BODY).status_code == 200
    assert workers(server.proc.pid) == {health["worker"]["pid"]}

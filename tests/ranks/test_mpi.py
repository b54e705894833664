"""A model over two local ranks on MLX's `mpi` backend, started by one `mpirun` (Open MPI)
and watched by steward rank by rank (docs/distributed.md): real mpirun, real ranks, real
MPI collectives on this CPU, real signals.

Skipped, saying so, where mpirun is missing, unless `STEWARD_RANKS_MPI_REQUIRED=1` (which
`.ci/run` sets after installing `openmpi-bin`).
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from steward.ranks import mpirun
from steward.ranks.group import GRACE, SILENCE, WATCH
from steward.wire.ranks import HERE, RankHost
from tests.conftest import ROOT, Server, free_port, until
from tests.ranks.test_ranks import (
    LONG,
    PROMPTS,
    drained_mid_stream,
    every_rank_serving,
    hit_mid_stream,
    ranks,
    same_as_one_process,
    serving_again,
)
from tests.supervisor.test_resume import assert_whole

REQUIRED = os.environ.get("STEWARD_RANKS_MPI_REQUIRED") == "1"
MPI = ["--distributed-backend", "mpi"]
# tokens a faulted stream asks for: the tiny model decodes faster over MPI than over the
# ring, and three streams of `LONG` could end between two looks at /health
LONGER = 10 * LONG
# Each fault's streams of their own: rank 0 has no lost-peer error to report on mpi, so a
# rank's fault is a crash of the worker, whose suspects a second crash would quarantine
STREAMS = {signal.SIGKILL: PROMPTS, signal.SIGSTOP: ["Count to ten.", "Name a bird.", "Why?"]}


def need_mpirun() -> None:
    if shutil.which("mpirun") is None:
        why = "Open MPI is not installed (mpirun)"
        if REQUIRED:
            pytest.fail(f"{why}, and STEWARD_RANKS_MPI_REQUIRED=1")
        pytest.skip(why)


@pytest.fixture(scope="module")
def group(tiny_model: Path) -> Iterator[Server]:
    # no spare: a faulted group is re-formed
    need_mpirun()
    args = ["--model", str(tiny_model), "--ranks", "2", *MPI, "--standby", "none"]
    server = Server([*args, "--queue-timeout", "120"])
    server.wait()
    yield server
    server.stop()


def parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def ended(pid: int) -> bool:
    """Gone, or a zombie that init has yet to reap: mpirun, ending a job it aborts (a rank
    that exits first, as rank 0 does when it stops), SIGKILLs the other ranks and exits
    without reaping them (Open MPI 4.1), and this machine's init reaps late."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return True
    return fields[0] == "Z" and fields[1] == "1"


def mpirun_of(listed: list[dict]) -> int:
    """The mpirun that started the ranks `listed` (/health's): their parent, here."""
    (launcher,) = {parent(rank["pid"]) for rank in listed}
    assert Path(f"/proc/{launcher}/comm").read_text().strip() == "mpirun"
    return launcher


def test_greedy_answers_equal_one_process(group: Server, serve, tiny_model: Path) -> None:
    one = serve("--model", str(tiny_model), "--standby", "none")
    one.wait()
    mpirun_of(same_as_one_process(group, one))
    assert " mpi ranks (pids to come, to come), started by mpirun (pid " in group.output()


@pytest.mark.parametrize("fault", [signal.SIGKILL, signal.SIGSTOP], ids=["kill", "stop"])
def test_rank_1_faulted_mid_stream(group: Server, fault: signal.Signals) -> None:
    """Every stream ends whole; the group is re-formed by a new mpirun with new pids; no
    process of the old group is left (its ranks, its mpirun); a rank is seen within the
    bounds of any rank's."""
    generation = group.health().json()["worker"]["generation"]
    old = ranks(group)
    launcher = mpirun_of(old)
    answers, references, noticed = hit_mid_stream(group, fault, LONGER, STREAMS[fault])
    for seen, reference in zip(answers, references, strict=True):
        assert_whole(seen, reference)
    bound = GRACE + WATCH + (SILENCE if fault == signal.SIGSTOP else 0.0)
    print(f"an mpi rank's {fault.name} seen faulted in {noticed:.2f} s (bound {bound:.1f} s)")
    assert noticed < bound + 2.0  # the slack: a poll of /health on a loaded machine
    new = serving_again(group, generation)["worker"]["ranks"]
    assert {r["pid"] for r in new}.isdisjoint({r["pid"] for r in old})
    assert mpirun_of(new) != launcher
    left = [launcher, *(r["pid"] for r in old)]
    until(lambda: all(ended(pid) for pid in left), 10, "the old ranks and mpirun gone")
    why = "killed by SIGKILL" if fault == signal.SIGKILL else "silent for"
    assert f"rank 1 (pid {old[1]['pid']}) {why}" in group.output()


def test_sigterm_drains_and_leaves_no_rank_or_mpirun(serve, tiny_model: Path) -> None:
    need_mpirun()
    server = serve("--model", str(tiny_model), "--ranks", "2", *MPI)
    server.wait()
    listed = every_rank_serving(server)
    left = [mpirun_of(listed), *(r["pid"] for r in listed)]
    drained_mid_stream(server, LONGER)
    assert [pid for pid in left if not ended(pid)] == []


TWO_HERE = [RankHost(HERE, (HERE,))] * 2
# Two sums as a re-formed group's first steps make them: the canary's (small), then a
# replayed batch's prefill, 3 prompts of 222 tokens at 64 floats (170 KB: more than one of
# Open MPI's TCP fragments, 128 KiB)
SUMS = """
import mlx.core as mx
group = mx.distributed.init(strict=True, backend="mpi")
for size in (5 * 64, 3 * 222 * 64):
    mx.eval(mx.distributed.all_sum(mx.ones((size,)), group=group))
print("summed", flush=True)
"""


def netmask(prefix: int) -> int:
    """Open MPI 4.1's netmask of a CIDR prefix (`opal_net_prefix2netmask`) as x86 computes
    it: `1 << 32` shifts by 0."""
    return (((1 << prefix % 32) - 1) << (32 - prefix)) & 0xFFFFFFFF


def included(listed: str, address: str) -> bool:
    """Whether Open MPI 4.1 takes an interface at `address` for `btl_tcp_if_include`."""
    mine = int(ipaddress.IPv4Address(address))
    for entry in listed.split(","):
        ip, prefix = entry.split("/")
        mask = netmask(int(prefix))
        if int(ipaddress.IPv4Address(ip)) & mask == mine & mask:
            return True
    return False


def test_only_the_hosts_addresses_carry_mpi() -> None:
    """The loopback's entry, as Open MPI 4.1 reads it, takes no other interface: a /32 took
    every one, and a second link wedged the first large collective (mpirun.py `include`)."""
    listed = mpirun.include(TWO_HERE)
    assert included(listed, HERE)
    assert not included(listed, "192.0.2.2")
    assert not included(mpirun.include([RankHost("far", ("10.0.0.4",))]), "10.0.0.6")


def test_a_large_collective_after_a_small_one_completes() -> None:
    """Two ranks as steward's mpirun starts them sum what a re-formed group's canary and
    replayed prefill sum. With the loopback's entry a /32, on a host with a second interface
    (this one's eth0) the second sum never ended: Open MPI split it over both links."""
    need_mpirun()
    env = {**os.environ, **(mpirun.ROOT if os.geteuid() == 0 else {})}
    argv = [*mpirun.launcher(TWO_HERE), "--timeout", "60", sys.executable, "-c", SUMS]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert done.stdout.count("summed") == 2, done.stdout + done.stderr


def test_without_mpirun_exits_78_saying_so(tiny_model: Path) -> None:
    """mpirun looked for before anything starts: a PATH without it."""
    argv = [sys.executable, "-m", "steward", "serve", "--model", str(tiny_model), "--ranks", "2"]
    path = {**os.environ, "PATH": str(Path(sys.executable).parent)}
    done = subprocess.run(
        [*argv, *MPI, "--port", str(free_port())],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        env=path,
    )
    assert done.returncode == 78, done.stderr
    assert "--distributed-backend mpi: mpirun is not on PATH" in done.stderr

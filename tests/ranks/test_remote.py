"""A rank on "another host": `--hostfile` with rank 1 started over `ssh localhost`, through a
real OpenSSH server that the test starts as the current user on a free port, with its own
host key and user key (docs/distributed.md). Real ssh, real ranks, real signals.

The front finds the test's ssh options through an `ssh` on its PATH that adds `-F` (an
operator keeps them in ~/.ssh/config, which ssh reads from the user's home, not `$HOME`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from steward.ranks.group import GRACE, SILENCE, WATCH
from steward.wire.ranks import DOWN_BEAT, FRONT_SILENCE
from tests.conftest import ROOT, Server, free_port, until
from tests.ranks.test_mpi import LONGER, ended
from tests.ranks.test_ranks import (
    PROMPTS,
    completion,
    every_rank_serving,
    gone,
    hit_mid_stream,
    rank_series,
    sample,
    serving_again,
)
from tests.ranks.test_standby import promoted, spare_ready
from tests.supervisor.test_resume import assert_whole, stream

SSHD = Path("/usr/sbin/sshd")
REQUIRED = os.environ.get("STEWARD_RANKS_SSH_REQUIRED") == "1"


@pytest.fixture(scope="module")
def ssh_bin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A folder whose `ssh` reaches `localhost` on a private sshd, started here."""
    if not SSHD.exists() or shutil.which("ssh-keygen") is None:
        why = "openssh-server is not installed (/usr/sbin/sshd)"
        if REQUIRED:
            pytest.fail(f"{why}, and STEWARD_RANKS_SSH_REQUIRED=1")
        pytest.skip(why)
    folder = tmp_path_factory.mktemp("ssh")
    for key in ("host", "user"):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / key)], check=True
        )
    (folder / "authorized_keys").write_text((folder / "user.pub").read_text())
    port = free_port()
    (folder / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {folder / 'host'}\n"
        f"AuthorizedKeysFile {folder / 'authorized_keys'}\nPidFile {folder / 'sshd.pid'}\n"
        "StrictModes no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "UsePAM no\nPermitRootLogin yes\n"
    )
    (folder / "ssh_config").write_text(
        f"Host localhost far\n  HostName 127.0.0.1\n  Port {port}\n"
        f"  IdentityFile {folder / 'user'}\n"
        f"  UserKnownHostsFile {folder / 'known_hosts'}\n  StrictHostKeyChecking no\n"
    )
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    ssh = bin_dir / "ssh"
    ssh.write_text(f'#!/bin/sh\nexec {shutil.which("ssh")} -F {folder / "ssh_config"} "$@"\n')
    ssh.chmod(0o755)
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation
    log = folder / "sshd.log"
    sshd = subprocess.Popen([str(SSHD), "-D", "-E", str(log), "-f", str(folder / "sshd_config")])
    check = [str(ssh), "-o", "BatchMode=yes", "localhost", "true"]
    until(lambda: subprocess.run(check, capture_output=True).returncode == 0, 30, "sshd up")
    yield bin_dir
    sshd.terminate()
    sshd.wait(10)


@pytest.fixture(scope="module")
def hostfile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Rank 0 here, rank 1 over `ssh localhost` (mlx.launch's format)."""
    path = tmp_path_factory.mktemp("hosts") / "hosts.json"
    hosts = [{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}, {"ssh": "localhost", "ips": ["127.0.0.1"]}]
    path.write_text(json.dumps(hosts))
    return path


def over_ssh(tiny_model: Path, hostfile: Path, ssh_bin: Path, *args: str) -> Server:
    """A server of the tiny model on the hostfile's two "hosts", up."""
    path = f"{ssh_bin}{os.pathsep}{os.environ['PATH']}"
    served = ["--model", str(tiny_model), "--hostfile", str(hostfile), *args]
    server = Server([*served, "--queue-timeout", "120"], env={"PATH": path})
    server.wait()
    return server


@pytest.fixture(scope="module")
def remote(tiny_model: Path, hostfile: Path, ssh_bin: Path) -> Iterator[Server]:
    # no spare: a faulted group is re-formed (a spare group's promotion: the last test)
    server = over_ssh(tiny_model, hostfile, ssh_bin, "--standby", "none")
    yield server
    server.stop()


def family(server: Server, part: str = "worker") -> set[int]:
    """Every process of the serving group (`part="standby"`: the spare group) now, on either
    "host": its ranks, the tether holding the remote one, its ssh session, and the front's
    ssh client that started the tether (the tether's command line ends as the client's)."""
    ranks = {r["pid"] for r in server.health().json()[part]["ranks"]}
    tethers = {_parent(pid) for pid in ranks} - {server.proc.pid}
    sessions = {_parent(pid) for pid in tethers}
    payloads = {_argv(pid)[-1] for pid in tethers}
    clients = _children(server.proc.pid, "ssh")
    return (
        ranks
        | tethers
        | sessions
        | {pid for pid in clients if _argv(pid)[-1].split()[-1] in payloads}
    )


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _argv(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_text().rstrip("\0").split("\0")


def _running(module: str) -> set[int]:
    """Every process running `python -m module`."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = _argv(int(entry.name))
            except OSError:
                continue
            if argv[1:3] == ["-m", module]:
                found.add(int(entry.name))
    return found


def _children(pid: int, name: str) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and not gone(int(entry.name)):
            try:
                if (entry / "comm").read_text().strip() == name and _parent(int(entry.name)) == pid:
                    found.add(int(entry.name))
            except OSError:
                continue
    return found


def test_a_remote_rank_answers_as_one_process_does(remote: Server, serve, tiny_model: Path):
    one = serve("--model", str(tiny_model), "--standby", "none")
    ranks = every_rank_serving(remote)
    assert [(r["rank"], r["host"]) for r in ranks] == [(0, "127.0.0.1"), (1, "localhost")]
    assert all(r["alive"] and r["joined"] for r in ranks)
    assert len(family(remote)) == 5  # two ranks, a tether, its session, an ssh client
    assert rank_series(remote)[sample("steward_rank_alive", rank=1, host="localhost")] == 1.0
    one.wait()
    for prompt in PROMPTS[:2]:
        expected = completion(one.url, prompt, False)
        assert completion(remote.url, prompt, False) == expected
        assert completion(remote.url, prompt, True) == expected
        assert stream(remote.url, prompt)["text"] == stream(one.url, prompt)["text"]


@pytest.mark.parametrize("fault", [signal.SIGKILL, signal.SIGSTOP], ids=["kill", "stop"])
def test_a_remote_rank_faulted_mid_stream(remote: Server, fault: signal.Signals) -> None:
    """Every stream ends whole; the group is re-formed with new pids; no process of the old
    group is left, here or on the other host; a stopped rank is seen within its bound."""
    generation = remote.health().json()["worker"]["generation"]
    old = family(remote)
    victim = remote.health().json()["worker"]["ranks"][1]["pid"]
    answers, references, noticed = hit_mid_stream(remote, fault)
    for seen, reference in zip(answers, references, strict=True):
        assert_whole(seen, reference)
    bound = GRACE + WATCH + (SILENCE if fault == signal.SIGSTOP else 0.0)
    print(f"a remote rank's {fault.name} seen in {noticed:.2f} s (bound {bound:.1f} s)")
    assert noticed < bound + 2.0  # the slack: a poll of /health on a loaded machine
    serving_again(remote, generation)
    until(lambda: all(gone(pid) for pid in old), 10, "the old group gone")
    assert old.isdisjoint(family(remote))
    why = "killed by SIGKILL" if fault == signal.SIGKILL else "silent for"
    assert f"rank 1 (pid {victim} on localhost) {why}" in remote.output()


def test_a_front_gone_silent_leaves_no_remote_rank(remote: Server) -> None:
    """The front stopped (SIGSTOP: its heartbeats stop while the ssh session stays up, as
    over a link cut without a reset): the tether kills its rank within `FRONT_SILENCE` s;
    the front, resumed, sees the rank gone and forms the group again."""
    generation = remote.health().json()["worker"]["generation"]
    victim = remote.health().json()["worker"]["ranks"][1]["pid"]
    tether = _parent(victim)
    os.kill(remote.proc.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        until(lambda: gone(victim) and gone(tether), FRONT_SILENCE + 10, "the rank killed")
        took = time.monotonic() - stopped
    finally:
        os.kill(remote.proc.pid, signal.SIGCONT)
    print(f"a silent front's remote rank killed in {took:.1f} s (bound {FRONT_SILENCE:.0f} s)")
    assert took < FRONT_SILENCE + DOWN_BEAT + 2.0  # the slack: a loaded machine
    serving_again(remote, generation)
    assert "no word from the front for 10 s" in remote.output()  # the tether's, over ssh
    assert f"rank 1 (pid {victim} on localhost) killed by SIGKILL" in remote.output()


def test_the_front_killed_leaves_no_rank_on_either_host(remote: Server) -> None:
    """SIGKILL of the front (last: the module's server goes with it): rank 0 dies with it,
    its feed to the remote rank ends, the tether kills the rank, the session and the ssh
    client end."""
    group = family(remote)
    remote.proc.kill()
    remote.proc.wait(10)
    until(lambda: all(gone(pid) for pid in group), 10, "every process of the group gone")


def test_auto_keeps_a_hot_spare_group_on_both_hosts(
    tiny_model: Path, hostfile: Path, ssh_bin: Path
) -> None:
    """`auto` decides from each host's memory, as that host's own rank said it (the tiny
    model fits both: hot), and the spare group has its rank 1 over ssh too. Rank 1 of the
    serving group killed mid-stream: the spare group serves, every stream whole, and no
    process of the old group is left on either host; another spare group forms behind.
    Stopped, the front leaves no process of either group."""
    server = over_ssh(tiny_model, hostfile, ssh_bin)
    try:
        standby = spare_ready(server)["standby"]
        assert (standby["mode"], standby["asked"]) == ("hot", "auto")
        assert "the tightest of 2" in standby["why"], standby["why"]
        hosts = [(r["rank"], r["host"]) for r in standby["ranks"]]
        assert hosts == [(0, "127.0.0.1"), (1, "localhost")]
        old, spare = family(server), family(server, "standby")
        assert len(old) == len(spare) == 5 and old.isdisjoint(spare)
        old_ranks, spare_ranks = promoted(server, signal.SIGKILL)
        until(lambda: all(gone(pid) for pid in old), 10, "the old group gone on both hosts")
        assert family(server) == spare
        spare_ready(server, old_ranks | spare_ranks)
        behind = family(server, "standby")
        assert behind.isdisjoint(old | spare)
    finally:
        server.stop()
    until(lambda: all(gone(pid) for pid in spare | behind), 10, "no process left on either host")


@pytest.fixture(scope="module")
def mpi_hostfile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Rank 0 here, rank 1 on "far" (the same sshd): mpirun takes `localhost` for here."""
    path = tmp_path_factory.mktemp("hosts") / "mpi.json"
    hosts = [{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}, {"ssh": "far", "ips": ["127.0.0.1"]}]
    path.write_text(json.dumps({"backend": "mpi", "hosts": hosts}))
    return path


def test_an_mpi_rank_over_ssh_killed_mid_stream(
    tiny_model: Path, mpi_hostfile: Path, ssh_bin: Path
) -> None:
    """mpirun starts rank 1 over ssh (its daemon, orted, on "far"), where a tether holds its
    meeting: killed mid-stream, every stream ends whole, the group is re-formed, and no
    process of the old group is left on either host (ranks, tether, sessions, orted)."""
    if shutil.which("mpirun") is None:
        pytest.skip("Open MPI is not installed (mpirun)")
    server = over_ssh(tiny_model, mpi_hostfile, ssh_bin, "--standby", "none")
    try:
        generation = server.health().json()["worker"]["generation"]
        listed = every_rank_serving(server)
        assert [(r["rank"], r["host"]) for r in listed] == [(0, "127.0.0.1"), (1, "far")]
        old = {r["pid"] for r in listed} | {_parent(r["pid"]) for r in listed}  # mpirun, orted
        assert {_argv(pid)[0].rsplit("/", 1)[-1] for pid in old} >= {"mpirun", "orted"}
        old |= _running("steward.ranks.tether")
        old |= {_parent(pid) for pid in old} - {server.proc.pid}  # their ssh sessions
        answers, references, noticed = hit_mid_stream(server, signal.SIGKILL, LONGER)
        for seen, reference in zip(answers, references, strict=True):
            assert_whole(seen, reference)
        print(f"an mpi rank over ssh SIGKILLed: seen in {noticed:.2f} s")
        serving_again(server, generation)
        until(lambda: all(ended(pid) for pid in old), 10, "the old group gone on both hosts")
    finally:
        server.stop()


MIXED = ["a", "b", "127.0.0.1"]  # here (rank 0's, whatever its name), there, here again


@pytest.mark.parametrize(
    ("hosts", "args", "why"),
    [
        (
            {"backend": "jaccl", "hosts": [{"ssh": "a", "ips": ["1.2.3.4"]}] * 2},
            [],
            "host 0 (a): rdma lists one device per host",
        ),
        (
            {"backend": "mpi", "hosts": [{"ssh": h, "ips": ["1.2.3.4"]} for h in MIXED]},
            [],
            "mpirun places a host's ranks together: list each host's ranks in a row",
        ),
        ([{"ssh": "a", "ips": ["1.2.3.4"]}] * 2, ["--ranks", "2"], "give one or the other"),
    ],
)
def test_a_hostfile_that_cannot_work_exits_78(tmp_path: Path, hosts, args, why) -> None:
    """Through the command line, before anything starts (what is wrong inside the file
    itself: test_hostfile.py)."""
    path = tmp_path / "hosts.json"
    path.write_text(json.dumps(hosts))
    argv = [sys.executable, "-m", "steward", "serve", "--hostfile", str(path), *args]
    done = subprocess.run(
        [*argv, "--port", str(free_port())], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 78, done.stderr
    assert why in done.stderr

"""The one `mpirun` (Open MPI) of a group on the mpi backend: MLX's mpi backend joins only
ranks that mpirun started, so the group starts mpirun, and mpirun every rank, here and,
through its daemon (`orted`) started over ssh, on the hostfile's other hosts. Each rank then
meets steward for what every rank is given (mpirank.py), and is watched and killed by its
pid as any rank is (group.py).

mpirun runs in a session of its own (a Ctrl-C at the front's terminal drains, never cuts
it); it puts each rank in a process group of its own, so its group alone is not the ranks.
A group killed kills every rank by its pid first, so that mpirun, and each host's daemon,
reap them and end the job themselves (mpirun aborts the job once one rank has gone, and
kills the others at once: a rank ignores SIGTERM, mpirun's first word otherwise, for 1 s);
what is left of mpirun's group after `KILLED` s is SIGKILLed. The front's death ends the
ranks (their lines and feeds end), and mpirun with them. A rank's exit status is mpirun's,
its parent's: mpirun reports the signal that killed one on its stderr, read here on its
way to the front's (the ranks' stderr comes the same way), so that the log names it.

mpirun is told the hosts (each host's ranks in a row: it places a host's slots together),
that the ranks may outnumber the cores (`--oversubscribe`, unbound; not
`mpi_yield_when_idle`, whose sched_yield polling starved the front more than plain polling
does: /health answered in up to 0.9 s against 0.25 s, two ranks on two shared cores), and
to carry MPI's messages over TCP between the hosts' `ips` alone (the loopback for `--ranks
N`), as the ring backend does (`include`). It reaches other hosts with the ssh and the options
remote ranks use (remote.py); it runs as root only where the front does (Open MPI refuses,
unless told).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from itertools import groupby
from pathlib import Path
from typing import IO

from steward.ranks.formation import machine
from steward.ranks.remote import KEPT, SSH
from steward.wire.ranks import RankHost

MPIRUN = "mpirun"
RANK = "steward.ranks.mpimeet"
ROOT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
# mpirun's word for a rank killed by a signal (Open MPI 4.1): the status a rank's own
# parent, not steward, holds
REPORT = re.compile(rb"process rank (\d+) with PID \d+ on node \S+ exited on signal (\d+)")


def missing(hosts: Sequence[RankHost]) -> str:
    """Why mpirun cannot start a group on `hosts`: no Open MPI's mpirun here, or a host
    whose ranks are not in a row; "" when it can."""
    found = shutil.which(MPIRUN)
    if found is None:
        return f"{MPIRUN} is not on PATH (install Open MPI: apt-get install openmpi-bin)"
    try:
        said = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=30)
        version = said.stdout + said.stderr
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"{found} --version failed: {error}"
    if "Open MPI" not in version:
        return f"{found} is not Open MPI's ({version.strip().splitlines()[0]})"
    runs = [where for where, _ in groupby(_machines(hosts))]
    if len(runs) != len(set(runs)):
        return "mpirun places a host's ranks together: list each host's ranks in a row"
    return ""


def command(hosts: Sequence[RankHost], folder: Path, wait: float) -> list[str]:
    """mpirun's command line: one rank on each of `hosts`, each to meet in `folder` within
    `wait` s."""
    return [*launcher(hosts), sys.executable, "-m", RANK, str(folder), str(wait)]


def launcher(hosts: Sequence[RankHost]) -> list[str]:
    """mpirun and its options for one rank on each of `hosts`, up to the program it runs."""
    slots = ",".join(f"{where}:{len(list(run))}" for where, run in groupby(_machines(hosts)))
    return [
        MPIRUN,
        "-np", str(len(hosts)),
        "--host", slots,
        "--map-by", "slot",
        "--bind-to", "none",
        "--oversubscribe",
        "--mca", "odls_base_sigkill_timeout", "0",  # SIGKILL, not SIGTERM then 1 s later
        "--mca", "btl", "self,tcp",
        "--mca", "btl_tcp_if_include", include(hosts),
        "--mca", "plm_rsh_agent", " ".join(SSH),
        *(arg for name in KEPT if name in os.environ for arg in ("-x", name)),
    ]  # fmt: skip


def include(hosts: Sequence[RankHost]) -> str:
    """The hosts' `ips` as Open MPI's `btl_tcp_if_include`: each a /31, the narrowest prefix
    Open MPI 4.1 reads right. A /32 it reads as every interface (its netmask of a prefix
    shifts a 1 left by the prefix: by 32, a shift of 0 on x86, a netmask of 0), and a rank
    with two interfaces, the loopback and eth0, splits a message past one TCP fragment (128
    KiB) over both; its peer files the second link's connection under the first (its
    address does not match), the fragments sent on it are never read, and both ranks spin
    in the collective for good. A /31 adds one address, the other of its pair."""
    return ",".join(sorted({f"{ip}/31" for host in hosts for ip in host.ips}))


class Mpirun:
    """A group's mpirun, started in a session of its own; its stderr (its ranks' too) goes
    on to the front's, read on the way for the signal that killed a rank."""

    def __init__(self, process: subprocess.Popen[bytes], said: threading.Event) -> None:
        self.process = process
        self.said = said  # its stderr ended: it has reported every rank it saw killed

    @classmethod
    def start(
        cls,
        hosts: Sequence[RankHost],
        folder: Path,
        wait: float,
        killed: Callable[[int, int], None],
    ) -> Mpirun:
        """mpirun started; `killed(rank, signal)` for each rank it reports killed."""
        env = {**os.environ, **(ROOT if os.geteuid() == 0 else {})}
        process = subprocess.Popen(
            command(hosts, folder, wait),
            stdin=subprocess.DEVNULL,  # mpirun would hand its stdin to rank 0
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
        said = threading.Event()
        args = (process.stderr, killed, said)
        threading.Thread(target=_said, args=args, daemon=True, name="mpirun-stderr").start()
        return cls(process, said)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def exitcode(self) -> int | None:
        return self.process.poll()

    def kill(self) -> None:
        """SIGKILL what is left of mpirun's process group."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)

    def join(self, timeout: float | None = None) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout)


def _said(stderr: IO[bytes], killed: Callable[[int, int], None], said: threading.Event) -> None:
    """mpirun's stderr to the front's, line by line, each rank it reports killed to
    `killed`; `said` once it ends."""
    with stderr:
        for line in stderr:
            sys.stderr.buffer.write(line)
            sys.stderr.buffer.flush()
            if found := REPORT.search(line):
                killed(int(found[1]), int(found[2]))
    said.set()


def _machines(hosts: Sequence[RankHost]) -> list[str]:
    """Where each rank runs, as mpirun is told: here is the loopback's address."""
    return [machine(hosts, rank) for rank in range(len(hosts))]

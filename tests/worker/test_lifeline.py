"""The worker never outlives the front, however the front ends."""

from __future__ import annotations

import os
import signal

import pytest

from tests.conftest import until


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize(
    ("sig", "code"),
    [
        (signal.SIGTERM, 0),
        (signal.SIGINT, 0),
        (signal.SIGKILL, -signal.SIGKILL),
        (signal.SIGABRT, -signal.SIGABRT),  # a crash of the front itself
    ],
)
def test_worker_dies_with_front(serve, tiny_model, sig, code) -> None:
    server = serve("--model", str(tiny_model))
    worker = server.wait()["worker"]["pid"]
    assert alive(worker)
    server.proc.send_signal(sig)
    assert server.exit_code() == code
    until(lambda: not alive(worker), 5, "the worker gone")

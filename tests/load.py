"""A busy machine, on purpose: CPU-bound processes beside the server under test.

Guarantees that hold only on an idle machine are timing assumptions in disguise; a test
that takes `busy_cpu` runs the server against two busy loops (the number of cores a small
CI runner has), started before the server and killed after the test.

    from tests.load import busy_cpu  # noqa: F401  (a fixture)

    @pytest.mark.usefixtures("busy_cpu")
    def test_...
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

LOOPS = 2


@contextmanager
def busy_loops(count: int = LOOPS) -> Iterator[list[subprocess.Popen]]:
    """`count` processes spinning `while True: pass` until the block ends."""
    loops: list[subprocess.Popen] = []
    try:
        for _ in range(count):
            loops.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
        yield loops
    finally:
        for loop in loops:
            loop.kill()
        for loop in loops:
            loop.wait()


@pytest.fixture
def busy_cpu() -> Iterator[list[subprocess.Popen]]:
    """Two busy loops for the test's duration (started before anything the test starts)."""
    with busy_loops() as loops:
        yield loops

"""A real full filesystem for the disk tier's tests: a 64 KiB tmpfs (skipped where mounting
is not allowed)."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def tiny_tmpfs(folder: Path) -> Iterator[Path]:
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(folder)],
        capture_output=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"no tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:  # lazily: a server that used it may still hold it as it exits
        subprocess.run(["umount", "-l", str(folder)], check=True)

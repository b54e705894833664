"""Tie the worker's life to the front's, however the front dies.

Three independent lines, since each misses a case: Linux's parent-death signal (instant,
but Linux only), EOF on the front's socket (seen by the worker's reader thread), and a
parent-pid poll (macOS has no parent-death signal, and EOF needs a free GIL).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1


def hold(parent_pid: int) -> None:
    """Die with the front. Call first thing in the worker."""
    # Ctrl-C, or a supervisor signalling the whole process group, reaches the front too, and
    # the front drains: the worker finishes its request and is stopped by the front.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if sys.platform == "linux":
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the front died before the signal was armed
        os._exit(1)
    threading.Thread(target=_watch, args=(parent_pid,), daemon=True, name="lifeline").start()


def _watch(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(0.5)
    os._exit(1)

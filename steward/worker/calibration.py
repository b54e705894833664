"""What a model's first worker measured on a GPU (the batch-width knee within memory, the
prefill speed), kept in steward's cache directory so that a restarted steward's first
worker reuses it instead of measuring again.

Within one steward the supervisor hands the first worker's `Calibration` to every later
worker of the model (`WorkerSettings.calibration`); this file is for the next process. It is
keyed by everything the measurement depends on: the model (its config and weight files'
names, sizes and times, as the prompt cache's disk tier names it), the device (its name,
architecture and memory), the versions of MLX and mlx-lm, and the flags that bound the width
(`--max-batch`, `--prompt-cache-bytes`, the worker's memory limit); `VERSION` changes with
the way it is measured. Only a GPU's measurement is kept: on a CPU nothing costly is
measured. A file that cannot be read or written is a miss, logged, never a fault: the worker
measures instead. A stale measurement that its key cannot see (a driver update, another
process on the GPU when it was taken) lasts until the file is removed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from pathlib import Path

import msgspec

from steward.model.resolve import cache_dir
from steward.wire.protocol import Calibration
from steward.wire.settings import WorkerSettings

log = logging.getLogger(__name__)

VERSION = 1  # of the measurement: a change to how the knee or the speed is measured bumps it
# What of the device's description the measurement depends on (not which one of several
# alike it is: its UUID, its bus; nor its free memory now).
DEVICE = ("device_name", "architecture", "memory_size", "total_memory")


def key(settings: WorkerSettings, model: str, device: dict[str, object], runtime: str) -> str:
    """The name a calibration is kept under: the model's identity, the device's
    description (MLX's `device_info`), the runtime's versions, the width's flags."""
    described = {
        "version": VERSION,
        "model": model,
        "device": [str(device.get(k, "")) for k in DEVICE],
        "runtime": runtime,
        "max_batch": settings.max_batch,
        "prompt_cache_bytes": settings.prompt_cache_bytes,
        "memory_limit": settings.memory_limit,
    }
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:32]


def name_here(settings: WorkerSettings) -> str:
    """The key of this worker's model, device and runtime (`key`)."""
    import mlx.core as mx
    import mlx_lm

    from steward.worker.kvstore import model_identity

    versions = f"mlx {mx.__version__}, mlx-lm {mlx_lm.__version__}"
    return key(settings, model_identity(settings.source.path), mx.device_info(), versions)


def folder() -> Path:
    return cache_dir() / "calibration"


def stored(name: str, directory: Path | None = None) -> Calibration | None:
    """The calibration kept under `name`, if any."""
    path = (directory or folder()) / f"{name}.json"
    try:
        return msgspec.json.decode(path.read_bytes(), type=Calibration)
    except FileNotFoundError:
        return None
    except (OSError, msgspec.DecodeError) as exc:
        log.warning("calibration %s unreadable, measured again: %s", path, exc)
        return None


def store(name: str, calibration: Calibration, directory: Path | None = None) -> None:
    """Keep `calibration` under `name` (written whole, then renamed into place)."""
    directory = directory or folder()
    temporary = directory / f".{name}.{os.getpid()}.tmp"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        temporary.write_bytes(msgspec.json.encode(calibration))
        os.replace(temporary, directory / f"{name}.json")
    except OSError as exc:
        log.warning("calibration not kept in %s: %s", directory, exc)
        with contextlib.suppress(OSError):
            temporary.unlink()

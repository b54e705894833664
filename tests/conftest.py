"""Shared fixtures: real `steward serve` processes on free ports, and the models they serve.

Servers are real subprocesses (`python -m steward serve`), so every test goes through the
real CLI, the real worker process, real MLX and real sockets.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import openai
import pytest

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")


def until(check: Callable[[], object], within: float, what: str) -> None:
    """Wait for an observable condition, never for a time (fails after `within` s)."""
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"not {what} within {within} s"
        time.sleep(0.02)


def reply(call: Callable[[], T]) -> T | None:
    """What `call` gets, or None while nothing listens yet (for `until`)."""
    try:
        return call()
    except httpx.TransportError:
        return None


def function_tool(
    name: str, description: str, properties: dict[str, Any], **schema: Any
) -> dict[str, Any]:
    """An OpenAI function tool taking an object of `properties`, all required (`schema`:
    more of the parameters' JSON schema)."""
    parameters = {"type": "object", "properties": properties, "required": list(properties)}
    function = {"name": name, "description": description, "parameters": parameters | schema}
    return {"type": "function", "function": function}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One `steward serve` process; `wait()` for a health state, `stop()` for its exit code."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = Path(os.environ["STEWARD_TEST_LOGS"]) / f"server-{self.port}.log"
        self._log_file = self.log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "steward", "serve", "--port", str(self.port), *args],
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
        )
        self.http = httpx.Client(base_url=self.url, timeout=60)

    def client(self, **kwargs: object) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="none", **kwargs)

    def health(self) -> httpx.Response:
        return self.http.get("/health")

    def wait(self, status: str = "ready", timeout: float = 120) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited {self.proc.returncode}:\n{self.output()}")
            try:
                body = self.health().json()
                if body["status"] == status:
                    return body
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"server not {status} in {timeout} s:\n{self.output()}")

    def until(self, check: Callable[[dict], object], within: float = 30) -> dict:
        """The first /health body that `check` accepts."""
        bodies: list[dict] = []
        until(lambda: check(bodies.append(self.health().json()) or bodies[-1]), within, "seen")
        return bodies[-1]

    def exit_code(self, timeout: float = 60) -> int:
        return self.proc.wait(timeout)

    def output(self) -> str:
        self._log_file.flush()
        return self.log.read_text()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.http.close()
        self._log_file.close()
        return self.proc.returncode


# The files that take minutes, started first so that neither test worker ends on one alone.
SLOW_FIRST = ("tests/front/test_fuzz.py", "tests/front/test_structured_default.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::")[0]
        return SLOW_FIRST.index(path) if path in SLOW_FIRST else len(SLOW_FIRST)

    items.sort(key=rank)  # stable: every other test keeps its place


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """One model cache and one log folder for the whole run, never the user's."""
    os.environ["STEWARD_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    os.environ["STEWARD_TEST_LOGS"] = str(tmp_path_factory.mktemp("logs"))


@pytest.fixture(scope="session")
def default_model_dir(_isolated_cache: None) -> Path:
    """The embedded default model, imported once to MLX format (as `serve` would)."""
    from steward.model.gguf import materialize
    from steward.model.resolve import resolve_model

    return materialize(resolve_model(None))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> Path:
    """A random-weight llama with the real tokenizer: real MLX, fast enough for fault tests."""
    from tests.tinymodel import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny", default_model_dir)


@pytest.fixture
def serve() -> Iterator:
    """Start servers with `serve(args...)`; all are stopped when the test ends."""
    servers: list[Server] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Server:
        server = Server(list(args), env)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def default_server(default_model_dir: Path) -> Iterator[Server]:
    """The real default model, shared by the tests of one module."""
    server = Server(["--served-model-name", "smol"])
    server.wait()
    yield server
    server.stop()

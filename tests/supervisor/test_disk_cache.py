"""The prompt cache's disk tier (`--prompt-cache-dir`) end to end: real servers, real
workers, real MLX on the tiny model with a 4096-token context, real files.

A stream with a ~3,000-token context whose worker dies mid-answer (SIGKILL, once the
prompt's entry is observably on disk: a crash that nothing in the worker sees coming)
resumes on the replacement from that entry, and a steward started again on the same
directory answers a repeated long prompt from it: `cached_tokens` says so each time. On
a full filesystem the long prompt is answered all the same.
"""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import httpx
import pytest

from tests.conftest import Server, until
from tests.tmpfs import tiny_tmpfs

LONG = " ".join(
    f"Log entry {i}: the keeper trimmed the lamp and wound the clockwork." for i in range(170)
)


@pytest.fixture(scope="module")
def long_model(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> Path:
    from tests.tinymodel import build_tiny_model

    folder = tmp_path_factory.mktemp("long") / "tiny"
    return build_tiny_model(folder, default_model_dir, context=4096)


def entries(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.kv"))


def body(max_tokens: int, stream: bool) -> dict:
    return {
        "messages": [{"role": "user", "content": LONG}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
        **({"stream_options": {"include_usage": True}} if stream else {}),
    }


def ask(server: Server, max_tokens: int = 8) -> dict:
    r = httpx.post(server.url + "/v1/chat/completions", json=body(max_tokens, False), timeout=120)
    assert r.status_code == 200, r.text
    answer = r.json()
    return {"text": answer["choices"][0]["message"]["content"], "usage": answer["usage"]}


def metrics(server: Server) -> str:
    return server.http.get("/metrics").text


def test_a_stream_resumed_after_a_crash_loads_its_context_from_disk(
    serve, long_model: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "kv"
    server = serve(
        "--model",
        str(long_model),
        "--prompt-cache-dir",
        str(folder),
        "--inject-fault",
        "decode:slow=0.05:every",  # an answer long enough to be struck in its middle
    )
    server.wait()
    pid = server.health().json()["worker"]["pid"]
    text, usage, killed = "", None, False
    with httpx.stream(
        "POST", server.url + "/v1/chat/completions", json=body(40, True), timeout=120
    ) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            text += "".join(c["delta"].get("content") or "" for c in chunk["choices"])
            usage = chunk.get("usage") or usage
            if text and not killed:  # mid-answer, the prompt's KV on disk: the worker dies
                until(lambda: entries(folder), 30, "the prompt's entry on disk")
                os.kill(pid, signal.SIGKILL)
                killed = True
    health = server.health().json()
    assert health["faults"]["total"] == 1 and health["faults"]["last"]["class"] == "worker_crash"
    assert usage["completion_tokens"] == 40 and 2800 < usage["prompt_tokens"] < 3300
    # the resumed attempt's prefill: the prompt from disk, but for its last token
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1
    assert text == ask(server, 40)["text"]  # greedy: as an unfaulted answer
    assert 'steward_prompt_disk_lookups_total{result="hit"} 1.0' in metrics(server)


def test_a_restarted_steward_answers_a_long_prompt_from_disk(
    serve, long_model: Path, tmp_path: Path
) -> None:
    args = ["--model", str(long_model), "--prompt-cache-dir", str(tmp_path / "kv")]
    first = serve(*args, "--standby", "none")
    first.wait()
    answer = ask(first)
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    until(lambda: entries(tmp_path / "kv"), 30, "an entry on disk")
    assert first.stop() == 0
    second = serve(*args, "--standby", "none")
    second.wait()
    again = ask(second)
    assert again["text"] == answer["text"]
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 2500


def test_a_full_filesystem_fails_no_request(serve, long_model: Path, tmp_path: Path) -> None:
    with tiny_tmpfs(tmp_path / "full") as folder:
        server = serve(
            "--model", str(long_model), "--prompt-cache-dir", str(folder), "--standby", "none"
        )
        server.wait()
        assert ask(server)["usage"]["completion_tokens"] == 8
        until(lambda: "entry not written (ENOSPC)" in server.output(), 30, "the write refused")
        assert ask(server)["usage"]["completion_tokens"] == 8  # the next, with the count
        errors = re.search(r"^steward_prompt_disk_errors_total (\S+)$", metrics(server), re.M)
        assert errors is not None and float(errors[1]) >= 1
        assert list(folder.iterdir()) == []
        server.stop()

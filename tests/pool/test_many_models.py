"""Many models behind one front (SPEC §9), through real servers and real workers: each
model answers beside the others, a fault in one spares the others, loads follow the memory
budget, and a model that fails leaves the others serving."""

from __future__ import annotations

import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.conftest import ROOT, Server, free_port
from tests.supervisor.test_recovery import faults_logged
from tests.tinyembed import build_tiny_embedder

POISON = "X-POISON"


def ask(server: Server, model: str, text: str = "Hello", stream: bool = False) -> tuple[int, str]:
    """The status, and the answer's model (or the error's type), of one small chat."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 3,
        "temperature": 0,
        "stream": stream,
    }
    if stream:
        with server.http.stream("POST", "/v1/chat/completions", json=body) as answer:
            lines = [line for line in answer.iter_lines() if line]
        return answer.status_code, "[DONE]" if lines[-1] == "data: [DONE]" else lines[-1]
    answer = server.http.post("/v1/chat/completions", json=body)
    data = answer.json()
    return answer.status_code, data.get("model") or data["error"]["type"]


def models(server: Server) -> dict:
    return server.health().json()["models"]


def embed(server: Server, model: str) -> tuple[int, int]:
    """The status and the vector's length of one embedding."""
    answer = server.http.post("/v1/embeddings", json={"model": model, "input": "Hello there"})
    return answer.status_code, len(answer.json()["data"][0]["embedding"])


def test_two_models_side_by_side_and_a_fault_in_one_spares_the_other(
    serve, tiny_model, tmp_path: Path, default_model_dir: Path
) -> None:
    embedder = build_tiny_embedder(tmp_path / "embed", default_model_dir)
    server = serve(
        *("--model", f"a={tiny_model}", "--model", f"b={tiny_model}", "--standby", "none"),
        *("--model", f"e={embedder}"),
        *("--inject-fault", f"decode:poison:marker={POISON},model=a"),
    )
    server.wait()
    assert ask(server, "nope") == (404, "model_not_found")  # and nothing loads
    assert models(server)["b"] | {"loads": 0, "state": "unloaded"} == models(server)["b"]
    listed = server.http.get("/v1/models").json()["data"]
    assert [(m["id"], m["status"], m["kind"]) for m in listed] == [
        ("a", "ready", "chat"),
        ("b", "unloaded", "chat"),
        ("e", "unloaded", "embedding"),
    ]

    with ThreadPoolExecutor(9) as pool:  # b and e load on demand meanwhile
        asked = [(m, s) for m in "abab" for s in (False, True)]
        embedded = pool.submit(embed, server, "e")
        answers = list(pool.map(lambda c: ask(server, *c[:1], stream=c[1]), asked))
    assert answers == [(200, "[DONE]" if s else m) for m, s in asked]
    assert embedded.result() == (200, 64)
    assert models(server)["b"]["loads"] == 1
    assert server.http.get("/health/ready", params={"model": "b"}).status_code == 200

    poisoned: list[tuple[int, str]] = []
    aimed = threading.Thread(target=lambda: poisoned.append(ask(server, "a", POISON)))
    aimed.start()
    server.until(lambda h: h["models"]["a"]["state"] == "recovering")
    during = []
    while aimed.is_alive():  # b answers throughout a's recovery
        during.append(ask(server, "b"))
    aimed.join()
    assert poisoned == [(422, "request_quarantined")]
    assert during and set(during) == {(200, "b")}, during
    a, b = models(server)["a"], models(server)["b"]
    assert a["faults"]["total"] == 2 and a["worker"]["generation"] == 3
    assert b["faults"]["total"] == 0 and b["worker"]["generation"] == 1
    assert ask(server, "a") == (200, "a")
    assert ask(server, "b", POISON) == (200, "b")  # the fault was aimed at a alone


def test_loads_follow_the_memory_budget(serve, tiny_model, tmp_path: Path) -> None:
    """Each tiny model needs ~15 MiB (its weights x 1.2, no prompt cache): 40M fits two."""
    table = f'path = "{tiny_model}"\nprompt_cache_bytes = 0\n'
    models_file = tmp_path / "models.toml"
    models_file.write_text(
        f"[a]\n{table}pin = true\n\n[b]\n{table}\n[c]\n{table}idle_ttl = 2\n\n"
        f'[huge]\npath = "{tiny_model}"\nprompt_cache_bytes = 30_000_000\n'
    )
    server = serve("--models", str(models_file), "--memory-budget", "40M", "--standby", "none")
    server.wait()
    with ThreadPoolExecutor(2) as pool:  # two requests for an unloaded model: one load
        assert list(pool.map(lambda _: ask(server, "b"), range(2))) == [(200, "b")] * 2
    assert models(server)["b"]["loads"] == 1

    assert ask(server, "c") == (200, "c")  # b, idle and least recently used, made room
    seen = models(server)
    assert seen["b"]["evictions"] == 1 and seen["b"]["state"] in ("unloading", "unloaded")
    assert seen["a"]["state"] == "ready" and seen["a"]["evictions"] == 0  # pinned

    server.until(lambda h: h["models"]["c"]["state"] == "unloaded", within=60)  # idle_ttl
    assert ask(server, "b") == (200, "b")  # loaded again
    seen = models(server)
    assert (seen["b"]["loads"], seen["c"]["evictions"], seen["a"]["loads"]) == (2, 1, 1)

    refused = server.http.post(
        "/v1/chat/completions",
        json={"model": "huge", "messages": [{"role": "user", "content": "x"}]},
    )
    assert refused.status_code == 507
    assert refused.json()["error"]["type"] == "insufficient_storage"
    assert "resident: a " in refused.json()["error"]["message"]
    assert models(server)["huge"]["loads"] == 0
    metrics = server.http.get("/metrics").text
    assert 'steward_model_loads_total{model="b"} 2.0' in metrics
    assert 'steward_state{model="a",state="ready"} 1.0' in metrics


def test_a_failed_model_leaves_the_others_serving(serve, tiny_model) -> None:
    """Its restart budget spent, a model is `failed` (503) and the others serve; once every
    model has failed the process exits 75 (`--on-model-failed serve`, the default here)."""
    server = serve(
        *("--model", f"a={tiny_model}", "--model", f"b={tiny_model}", "--standby", "none"),
        *("--max-restarts", "0", "--inject-fault", f"decode:poison:marker={POISON}"),
    )
    server.wait()
    assert ask(server, "b") == (200, "b")
    assert ask(server, "a", POISON) == (503, "backend_unavailable")
    health = server.until(lambda h: h["models"]["a"]["state"] == "failed")
    assert health["status"] == "degraded" and health["models"]["b"]["state"] == "ready"
    assert server.health().status_code == 200
    assert server.http.get("/health/ready", params={"model": "a"}).status_code == 503
    assert ask(server, "a") == (503, "backend_unavailable")
    assert ask(server, "b") == (200, "b")
    assert ask(server, "b", POISON) == (503, "backend_unavailable")
    assert server.exit_code() == 75
    assert "every model has failed" in server.output()


def test_an_exit_for_one_model_answers_the_other_models_streams(serve, tiny_model) -> None:
    """A bug in one model's supervision loop exits the process (70); a stream of another
    model in flight then is told so in an error event (retryable), not cut off."""
    faults = "supervisor:crash:marker=BUG,model=a;decode:slow=0.3:marker=SLOW,model=b"
    server = serve(
        *("--model", f"a={tiny_model}", "--model", f"b={tiny_model}", "--standby", "none"),
        *("--inject-fault", faults),
    )
    server.wait()
    assert ask(server, "b") == (200, "b")
    started, lines = threading.Event(), []
    body = {"model": "b", "messages": [{"role": "user", "content": "SLOW"}], "max_tokens": 40}

    def stream() -> None:
        with server.http.stream("POST", "/v1/chat/completions", json=body | {"stream": True}) as r:
            for line in r.iter_lines():
                lines.append(line)
                started.set()

    streaming = threading.Thread(target=stream)
    streaming.start()
    assert started.wait(60)
    assert ask(server, "a", "BUG")[0] == 500
    streaming.join(60)
    errors = [line for line in lines if '"error"' in line]
    assert errors and '"backend_unavailable"' in errors[-1], lines[-3:]
    assert server.exit_code() == 70


def test_a_quarantine_outlives_the_models_unload(serve, tiny_model, tmp_path: Path) -> None:
    """A model unloaded while idle in its restart window keeps its quarantine: the payload
    it refused gets no fresh worker to crash when a request loads the model again."""
    models_file = tmp_path / "models.toml"
    table = f'path = "{tiny_model}"\n'
    models_file.write_text(f"[b]\n{table}[a]\n{table}idle_ttl = 2\n")
    server = serve(
        *("--models", str(models_file), "--standby", "none", "--log-json"),
        *("--inject-fault", f"decode:poison:marker={POISON},model=a"),
    )
    server.wait()
    assert ask(server, "a", POISON) == (422, "request_quarantined")
    assert len(faults_logged(server.output())) == 2
    server.until(lambda h: h["models"]["a"]["state"] == "unloaded", within=60)
    assert ask(server, "a", POISON) == (422, "request_quarantined")
    assert models(server)["a"]["loads"] == 2
    assert len(faults_logged(server.output())) == 2  # refused before it reached the worker
    assert ask(server, "a") == (200, "a")


def test_a_model_that_cannot_load_says_so_and_the_others_serve(
    serve, tiny_model, tmp_path: Path
) -> None:
    """A load on demand the worker refuses (its weights missing: exit 78 for one model)
    answers the request that waited for it with why, not with a shutdown to retry."""
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in tiny_model.iterdir():
        if f.suffix != ".safetensors":
            (broken / f.name).write_bytes(f.read_bytes())
    server = serve("--model", f"a={tiny_model}", "--model", f"b={broken}", "--standby", "none")
    server.wait()
    answer = server.http.post(
        "/v1/chat/completions",
        json={"model": "b", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
    )
    error = answer.json()["error"]
    assert (answer.status_code, error["type"]) == (503, "backend_unavailable"), error
    assert "cannot be served" in error["message"] and "model unusable" in error["message"]
    assert ask(server, "a") == (200, "a")
    assert server.proc.poll() is None


def test_a_bad_models_file_exits_78_naming_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "models.toml"
    bad.write_text('[a]\npath = "/nowhere"\n\n[b]\npath = "/x"\nwarmth = 3\n')
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "steward",
            "serve",
            "--models",
            str(bad),
            "--port",
            str(free_port()),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 78
    assert "line 6" in done.stderr and "unknown key 'warmth'" in done.stderr

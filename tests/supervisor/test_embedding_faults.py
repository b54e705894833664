"""The fault model holds for an embedding worker: a crash in its forward is replayed on the
replacement and answered; a poison input is quarantined while other requests are answered.
For an embedding model, the `prefill` injection point is its forward (SPEC §6)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.tinyembed import build_tiny_embedder


@pytest.fixture(scope="module")
def embedder_dir(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> Path:
    return build_tiny_embedder(tmp_path_factory.mktemp("embed") / "tiny-embed", default_model_dir)


def test_crash_mid_request_is_replayed(serve, embedder_dir: Path) -> None:
    server = serve(
        "--model", str(embedder_dir), "--standby", "none", "--inject-fault", "prefill:crash:nth=2"
    )
    server.wait()
    first = server.http.post("/v1/embeddings", json={"input": ["before the crash"]})
    crashed = server.http.post("/v1/embeddings", json={"input": ["struck", "mid-request"]})
    assert first.status_code == crashed.status_code == 200, crashed.text
    assert len(crashed.json()["data"]) == 2
    health = server.health().json()
    assert health["worker"]["generation"] == 2
    assert health["faults"]["last"]["class"] == "worker_crash"
    # the replacement passed the canary against the first worker's golden vector
    again = server.http.post("/v1/embeddings", json={"input": ["before the crash"]})
    assert again.json()["data"][0]["embedding"] == pytest.approx(
        first.json()["data"][0]["embedding"], abs=1e-5
    )


def test_poison_input_is_quarantined_others_answered(serve, embedder_dir: Path) -> None:
    server = serve(
        "--model",
        str(embedder_dir),
        "--standby",
        "none",
        "--inject-fault",
        "prefill:raise:marker=POISON",
    )
    server.wait()

    def post(text: str) -> int:
        return server.http.post("/v1/embeddings", json={"input": [text, "beside it"]}).status_code

    with ThreadPoolExecutor(4) as pool:
        codes = list(pool.map(post, ["innocent one", "POISON here", "innocent two", "third"]))
    assert codes == [200, 422, 200, 200]
    assert post("POISON here") == 422  # never reaches the backend again
    assert post("innocent again") == 200
    assert server.health().json()["quarantined"] == 1

"""`POST /v1/embeddings` on a real server: a tiny random decoder embedder (tinyembed.py),
the real worker and MLX, the official OpenAI SDK and LangChain unchanged."""

from __future__ import annotations

import base64
import math
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Server
from tests.tinyembed import build_tiny_embedder

DIMENSIONS = 64  # the tiny model's hidden size


@pytest.fixture(scope="module")
def embedder_dir(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> Path:
    return build_tiny_embedder(tmp_path_factory.mktemp("embed") / "tiny-embed", default_model_dir)


@pytest.fixture(scope="module")
def server(embedder_dir: Path) -> Iterator[Server]:
    """Served as `embedding` from its sentence-transformers files alone (no --model-kind)."""
    server = Server(["--model", str(embedder_dir), "--standby", "none"])
    server.wait()
    yield server
    server.stop()


def norm(vector: list[float]) -> float:
    return math.sqrt(sum(v * v for v in vector))


def test_string_list_and_token_ids(server: Server) -> None:
    one = server.http.post("/v1/embeddings", json={"input": "hello world"}).json()
    assert one["object"] == "list" and one["model"] == "tiny-embed"
    (item,) = one["data"]
    assert item["object"] == "embedding" and item["index"] == 0
    assert len(item["embedding"]) == DIMENSIONS and norm(item["embedding"]) == pytest.approx(1)
    assert one["usage"]["prompt_tokens"] == one["usage"]["total_tokens"] > 0

    texts = ["hello world", "a longer text, to be padded beside the others", "x"]
    many = server.http.post("/v1/embeddings", json={"input": texts}).json()
    assert [d["index"] for d in many["data"]] == [0, 1, 2]
    # batched with unequal neighbours, an input's vector is its vector alone
    assert many["data"][0]["embedding"] == pytest.approx(item["embedding"], abs=1e-5)

    ids = server.http.post("/v1/embeddings", json={"input": [100, 200, 300]}).json()
    lists = server.http.post("/v1/embeddings", json={"input": [[100, 200, 300], [400]]}).json()
    assert ids["usage"]["prompt_tokens"] == 3 and lists["usage"]["prompt_tokens"] == 4
    assert lists["data"][0]["embedding"] == pytest.approx(ids["data"][0]["embedding"], abs=1e-5)


def test_base64_and_dimensions(server: Server) -> None:
    floats = server.http.post("/v1/embeddings", json={"input": "hello"}).json()
    packed = server.http.post(
        "/v1/embeddings", json={"input": "hello", "encoding_format": "base64"}
    ).json()
    raw = base64.b64decode(packed["data"][0]["embedding"])
    assert list(struct.unpack(f"<{DIMENSIONS}f", raw)) == floats["data"][0]["embedding"]

    cut = server.http.post("/v1/embeddings", json={"input": "hello", "dimensions": 16}).json()
    vector = cut["data"][0]["embedding"]
    assert len(vector) == 16 and norm(vector) == pytest.approx(1)  # cut, then re-normalized
    over = server.http.post("/v1/embeddings", json={"input": "hello", "dimensions": 65})
    assert over.status_code == 400 and "dimensions" in over.json()["error"]["message"]


def test_bounds_name_the_field(server: Server) -> None:
    def refused(body: dict) -> dict:
        response = server.http.post("/v1/embeddings", json=body)
        assert response.status_code == 400, response.text
        return response.json()["error"]

    assert "input" in refused({"input": []})["message"]
    assert "input[1]" in refused({"input": ["fine", ""]})["message"]
    assert "input[0]" in refused({"input": [[]]})["message"]
    assert "--max-embedding-inputs" in refused({"input": ["a"] * 2049})["message"]
    too_long = refused({"input": ["short", "word " * 2000]})
    assert too_long["type"] == "context_length_exceeded" and "input[1]" in too_long["message"]
    assert "input[0]" in refused({"input": [[7] * 300]})["message"]  # past the 256 context
    assert refused({"input": "hi", "encoding_format": "int8"})["param"] == "encoding_format"
    # a chat route on an embedding model is a 400 that says so (as vLLM answers)
    chat = server.http.post(
        "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}
    )
    assert chat.status_code == 400 and "/v1/embeddings" in chat.json()["error"]["message"]


def test_openai_sdk_unchanged(server: Server) -> None:
    """The SDK asks for base64 by default where numpy is installed, and decodes it."""
    client = server.client()
    default = client.embeddings.create(model="tiny-embed", input=["hello", "world"])
    floats = client.embeddings.create(
        model="tiny-embed", input=["hello", "world"], encoding_format="float"
    )
    assert [len(d.embedding) for d in default.data] == [DIMENSIONS, DIMENSIONS]
    assert default.data[1].embedding == pytest.approx(floats.data[1].embedding, abs=1e-6)
    assert default.usage.prompt_tokens == floats.usage.prompt_tokens > 0
    cut = client.embeddings.create(model="default", input="hello", dimensions=8)
    assert len(cut.data[0].embedding) == 8


def test_langchain_unchanged(server: Server) -> None:
    """LangChain's `OpenAIEmbeddings`; its token-id path needs tiktoken's download, so it is
    off here (`check_embedding_ctx_length=False`): token ids are tested directly above."""
    from langchain_openai import OpenAIEmbeddings

    embeddings = OpenAIEmbeddings(
        model="tiny-embed",
        base_url=server.url + "/v1",
        api_key="none",
        check_embedding_ctx_length=False,
    )
    documents = embeddings.embed_documents(["hello", "world", "again"])
    query = embeddings.embed_query("hello")
    assert len(documents) == 3 and len(query) == DIMENSIONS
    assert query == pytest.approx(documents[0], abs=1e-5)


def test_metrics_count_embeddings(server: Server) -> None:
    server.http.post("/v1/embeddings", json={"input": ["one", "two"]})
    text = server.http.get("/metrics").text
    assert 'route="/v1/embeddings"' in text
    assert "steward_prompt_tokens_total" in text

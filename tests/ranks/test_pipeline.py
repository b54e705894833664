"""`--parallel pipeline` over two local `ring` ranks: each rank holds a run of whole layers
and hands its activations to the next (mlx-lm's `pipeline()`), real MLX `send`/`recv`.

mlx-lm 0.32's llama has no `pipeline()`; its qwen2 has, so the test's model is a tiny
random qwen2 (the tiny llama with zero q/k/v biases, float32): each layer runs whole on one
rank, so greedy answers equal one process's token for token.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import mlx.core as mx
import pytest

from tests.conftest import Server
from tests.ranks.test_ranks import PROMPTS, completion, every_rank_serving
from tests.supervisor.test_resume import stream
from tests.tinymodel import build_tiny_model


@pytest.fixture(scope="module")
def tiny_qwen2(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> Path:
    out = build_tiny_model(tmp_path_factory.mktemp("qwen2") / "qwen2", default_model_dir)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(config | {"model_type": "qwen2"}))
    weights = mx.load(str(out / "model.safetensors"))
    biases = {
        name.replace(".weight", ".bias"): mx.zeros(weight.shape[0], dtype=weight.dtype)
        for name, weight in weights.items()
        if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight"))
    }
    mx.save_safetensors(str(out / "model.safetensors"), weights | biases, {"format": "mlx"})
    return out


@pytest.fixture(scope="module")
def pipeline(tiny_qwen2: Path) -> Iterator[Server]:
    args = ["--model", str(tiny_qwen2), "--ranks", "2", "--parallel", "pipeline"]
    server = Server([*args, "--standby", "none"])
    server.wait()
    yield server
    server.stop()


def test_pipeline_answers_equal_one_process(pipeline: Server, serve, tiny_qwen2: Path) -> None:
    one = serve("--model", str(tiny_qwen2), "--standby", "none")
    assert all(r["joined"] for r in every_rank_serving(pipeline))
    one.wait()
    for prompt in PROMPTS[:2]:
        expected = completion(one.url, prompt, False)
        assert len(expected) > 0
        assert completion(pipeline.url, prompt, False) == expected
        assert completion(pipeline.url, prompt, True) == expected
        assert stream(pipeline.url, prompt)["text"] == stream(one.url, prompt)["text"]

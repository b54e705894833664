"""Ranks per model, from a models file: one model served over two local ranks, with a hot
spare group, beside another served by one process, behind one front and a memory budget,
the same weights answering alike."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.conftest import Server
from tests.ranks.test_ranks import PROMPTS, rank_series, sample


def answer(server: Server, model: str, prompt: str) -> str:
    body = {"model": model, "prompt": prompt, "max_tokens": 16, "temperature": 0}
    done = httpx.post(server.url + "/v1/completions", json=body, timeout=120)
    return done.json()["choices"][0]["text"]


def test_one_model_of_a_models_file_over_ranks(serve, tiny_model: Path, tmp_path: Path) -> None:
    models = tmp_path / "models.toml"
    models.write_text(
        f'[group]\npath = "{tiny_model}"\nranks = 2\nparallel = "tensor"\nstandby = "hot"\n'
        f'pin = true\n\n[solo]\npath = "{tiny_model}"\nstandby = "none"\npin = true\n'
    )
    server = serve("--models", str(models), "--memory-budget", "8G")
    server.wait()
    health = server.until(
        lambda h: (
            all(m["state"] == "ready" for m in h["models"].values())
            and all(r["serving"] for r in h["models"]["group"]["worker"]["ranks"])
            and h["models"]["group"]["standby"]["state"] == "ready"
        ),
        within=120,
    )
    group, solo = health["models"]["group"], health["models"]["solo"]
    assert [r["rank"] for r in group["worker"]["ranks"]] == [0, 1]
    assert all(r["joined"] and r["serving"] for r in group["worker"]["ranks"])
    assert solo["worker"]["ranks"] == []
    assert [r["rank"] for r in group["standby"]["ranks"]] == [0, 1]  # within the budget
    assert solo["standby"]["ranks"] == []
    for prompt in PROMPTS[:2]:
        expected = answer(server, "solo", prompt)
        assert len(expected) > 0
        assert answer(server, "group", prompt) == expected
    series = rank_series(server)  # the group's ranks, under its model's label alone
    assert series[sample("steward_rank_alive", model="group", rank=1, host="127.0.0.1")] == 1.0
    assert {name.split('model="')[1].split('"')[0] for name in series} == {"group"}

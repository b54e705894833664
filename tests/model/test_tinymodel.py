"""The tiny random model that fault tests run on: loads through mlx_lm, generates fast and
always to max_tokens, deterministically."""

from __future__ import annotations

from pathlib import Path

import mlx_lm


def test_tiny_model_generates_eight_tokens(tiny_model: Path) -> None:
    model, tokenizer = mlx_lm.load(str(tiny_model))
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True
    )
    runs = [
        [r.token for r in mlx_lm.stream_generate(model, tokenizer, prompt, max_tokens=8)]
        for _ in range(2)
    ]
    assert len(runs[0]) == 8 and runs[0] == runs[1]
    assert not set(runs[0]) & tokenizer.eos_token_ids

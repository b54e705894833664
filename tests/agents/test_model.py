"""The agents' test model, loaded by mlx-lm: it answers a few words and ends its turn, or
calls the tool when asked, and answers once the tool's result is in; greedy and sampled,
with its markers thousands of tokens back."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from mlx_lm import generate, load
from mlx_lm.sample_utils import make_sampler

from tests.agents.model import ANSWER, ASK, CALLS, TOOL_END, TOOL_START

BASH = {"type": "function", "function": {"name": "Bash", "parameters": {"type": "object"}}}
FILLER = "the agent's long system prompt " * 3000  # about 18 thousand tokens
CALLED = {
    "role": "assistant",
    "content": "",
    "tool_calls": [{"id": "1", "type": "function", "function": {"name": "Bash", "arguments": {}}}],
}
CHATS = {
    "plain": ([{"role": "user", "content": "hello " + FILLER}], ANSWER),
    "asked": ([{"role": "user", "content": ASK + FILLER}], TOOL_START + CALLS["claude"] + TOOL_END),
    "answered": (
        [
            {"role": "user", "content": ASK + FILLER},
            CALLED,
            {"role": "tool", "tool_call_id": "1", "content": "steward note"},
        ],
        ANSWER,
    ),
}


@pytest.fixture(scope="module")
def loaded(agent_model: Callable[..., Path]) -> tuple:
    return load(str(agent_model("claude")))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("chat", list(CHATS))
def test_answers_or_calls_as_the_context_says(loaded: tuple, chat: str, temperature: float) -> None:
    model, tokenizer = loaded
    messages, expected = CHATS[chat]
    prompt = tokenizer.apply_chat_template(messages, tools=[BASH], add_generation_prompt=True)
    assert len(prompt) > 15_000
    sampler = make_sampler(temp=temperature)
    text = generate(model, tokenizer, prompt, max_tokens=40, sampler=sampler)
    assert text == expected.strip()  # then the end token: max_tokens is far off

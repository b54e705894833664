"""The OpenAI Agents SDK (`openai-agents`) runs a two-turn tool loop against steward,
through the Responses API (its default) and through chat completions.

The model is the scripted thinking model (tests/tinymodel.py): the first turn is forced to
call `get_weather` (a named `tool_choice`, which the Agents SDK resets to `auto` once the
tool has run), whose one argument is an enum, so the grammar writes the whole call; the
second turn, given the tool's output, thinks and answers `Paris indeed`, then ends. Tracing
is off: nothing leaves the machine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import pytest

agents = pytest.importorskip("agents")

from openai import AsyncOpenAI  # noqa: E402

from tests.conftest import Server  # noqa: E402
from tests.tinymodel import ANSWER, build_thinking_model  # noqa: E402

agents.set_tracing_disabled(True)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> Iterator[Server]:
    model = build_thinking_model(tmp_path_factory.mktemp("think") / "think", default_model_dir)
    server = Server(["--model", str(model)])
    server.wait()
    yield server
    server.stop()


def weather_agent(model: agents.Model, cities: list[str]) -> agents.Agent:
    @agents.function_tool
    def get_weather(city: Literal["Paris"]) -> str:
        """The weather in a city."""
        cities.append(city)
        return "sunny, 21 C"

    settings = agents.ModelSettings(tool_choice="get_weather", max_tokens=24, temperature=0)
    return agents.Agent(
        name="weather",
        instructions="Answer with the weather.",
        tools=[get_weather],
        model=model,
        model_settings=settings,
    )


def client(server: Server) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def assert_two_turns(result: agents.RunResult, cities: list[str]) -> None:
    assert cities == ["Paris"]  # the tool ran once, with the model's argument
    assert len(result.raw_responses) == 2  # the call, then the answer after its output
    assert result.final_output == ANSWER
    kinds = [type(item).__name__ for item in result.new_items]
    assert kinds[:2] == ["ToolCallItem", "ToolCallOutputItem"] and kinds[-1] == "MessageOutputItem"


def run(agent: agents.Agent) -> agents.RunResult:
    return asyncio.run(agents.Runner.run(agent, "Weather in Paris?", max_turns=4))


def test_a_tool_loop_through_the_responses_api(server: Server) -> None:
    cities: list[str] = []
    model = agents.OpenAIResponsesModel("default", client(server))
    result = run(weather_agent(model, cities))
    assert_two_turns(result, cities)
    assert "ReasoningItem" in [type(item).__name__ for item in result.new_items]


def test_a_streamed_tool_loop_through_the_responses_api(server: Server) -> None:
    cities: list[str] = []
    model = agents.OpenAIResponsesModel("default", client(server))

    async def streamed() -> tuple[list[str], object]:
        running = agents.Runner.run_streamed(weather_agent(model, cities), "Weather?", max_turns=4)
        deltas = [
            event.data.delta
            async for event in running.stream_events()
            if event.type == "raw_response_event"
            and event.data.type == "response.output_text.delta"
        ]
        return deltas, running.final_output

    deltas, final = asyncio.run(streamed())
    assert cities == ["Paris"] and "".join(deltas) == ANSWER == final


def test_a_tool_loop_through_chat_completions(server: Server) -> None:
    cities: list[str] = []
    model = agents.OpenAIChatCompletionsModel("default", client(server))
    result = run(weather_agent(model, cities))
    assert_two_turns(result, cities)

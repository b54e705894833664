"""OpenAI chat completions, `POST /v1/chat/completions`: the body (chat_schema.py) into an
`Ask`, the jobs' events into a `chat.completion` or its `chat.completion.chunk` stream.

A thinking model's thinking is `reasoning_content`, beside `content`, in the message and in
the deltas (where a thinking delta's `content` is null, as DeepSeek's API writes it); its
tokens are counted in `usage.completion_tokens_details.reasoning_tokens`.

A forced tool call (`tool_choice` `required` or named) and `parallel_tool_calls` are the
worker's to carry out (worker/toolcalls.py): a forced call's text is never content, and
without parallel calls only the first comes back. A legacy request (`functions`) is
answered in the legacy shape: `function_call` and its finish reason.
"""

from __future__ import annotations

import secrets
from typing import Any

from fastapi import Request, Response

from steward.front.dialects.chat_schema import ChatRequest, NamedTool
from steward.front.dialects.exchange import dialect_router, exchange, images, served_model
from steward.front.dialects.openai import OpenAIAnswer, choices, logprob_entry
from steward.front.dialects.seam import Ask
from steward.front.docs import generation_responses
from steward.front.structured import ANY_OBJECT, Constraint, constraint
from steward.supervisor.jobs import Job
from steward.wire.protocol import CallDelta, Done, Logprob, Token


async def chat_constraint(body: ChatRequest) -> Constraint:
    """The request's grammar and tool-call mode (structured.py)."""
    choice = body.choice()
    tools = {tool.function.name: tool.function.parameters for tool in body.tools or []}
    schema = None
    if body.structured() and body.response_format is not None:
        given = body.response_format.json_schema
        schema = (given.schema_ if given else None) or ANY_OBJECT
    if isinstance(choice, NamedTool):
        return await constraint(tools, "named", choice.function.name)
    return await constraint(tools, choice, parallel=body.parallel_tool_calls, schema=schema)


class ChatAnswer(OpenAIAnswer):
    object = "chat.completion"
    chunk_object = "chat.completion.chunk"
    prefix = "chatcmpl-"

    def __init__(self, model: str, request_id: str, body: ChatRequest) -> None:
        super().__init__(model, request_id, body.include_usage(), body.logprobs)
        self.legacy = body.legacy
        self.call_ids: dict[tuple[int, int], str] = {}  # (choice, call) -> id

    def choice(self, index: int, job: Job, done: Done) -> dict[str, Any]:
        text = "".join(job.text)
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if job.reasoning:
            message["reasoning_content"] = "".join(job.reasoning)
        if calls := self._calls(index, job.calls):
            message |= self._shaped(calls)
            message["content"] = text or None
        logprobs = self._logprobs(job.logprobs)
        return {"index": index, "message": message, "logprobs": logprobs, **self._finish(done)}

    def delta(self, index: int, token: Token, first: bool) -> list[str]:
        text = token.text
        calls = self._calls(index, token.calls, stream=True)
        logprobs = self._logprobs([token.logprob]) if token.logprob else None
        thinking = token.reasoning
        if not (first or text or thinking or calls or logprobs):
            return []  # nothing in it for the client
        delta: dict[str, Any] = {"role": "assistant"} if first else {}
        if thinking:
            delta["reasoning_content"] = thinking
        delta["content"] = text if text or not thinking else None
        if calls:
            delta |= self._shaped(calls)
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": None}
        return [self.chunk(self.chunk_object, choice, None)]

    def finished(self, index: int, done: Done, first: bool) -> list[str]:
        opening = self.delta(index, Token(-1, -1, ""), first=True) if first else []
        choice = {"index": index, "delta": {}, "logprobs": None, **self._finish(done)}
        return [*opening, self.chunk(self.chunk_object, choice, done)]

    @staticmethod
    def usage(dones: list[Done]) -> dict[str, Any]:
        """OpenAI's, with the thinking tokens among the completion's counted apart, and
        the draft tokens the answer kept and refused (a prediction's, or found by lookup)."""
        details = {
            "reasoning_tokens": sum(done.reasoning_tokens for done in dones),
            "accepted_prediction_tokens": sum(d.accepted_prediction_tokens for d in dones),
            "rejected_prediction_tokens": sum(d.rejected_prediction_tokens for d in dones),
        }
        return OpenAIAnswer.usage(dones) | {"completion_tokens_details": details}

    def _finish(self, done: Done) -> dict[str, str]:
        finish = done.finish_reason
        if self.legacy and finish == "tool_calls":
            finish = "function_call"
        return {"finish_reason": finish}

    def _shaped(self, calls: list[dict[str, Any]]) -> dict[str, Any]:
        """Calls as `tool_calls`, or for a legacy request its one `function_call`."""
        return {"function_call": calls[0]["function"]} if self.legacy else {"tool_calls": calls}

    def _calls(self, index: int, parts: list[CallDelta], stream: bool = False) -> list[dict]:
        """Tool calls in OpenAI's shape: whole (parts joined), or in a stream as deltas,
        each call's first carrying its id, type and name."""
        shaped: list[dict[str, Any]] = []
        whole: dict[int, dict[str, Any]] = {}
        for part in parts:
            if not stream and part.index in whole:
                whole[part.index]["function"]["arguments"] += part.arguments
                continue
            call: dict[str, Any] = {"index": part.index} if stream else {}
            function = {"arguments": part.arguments}
            if part.name is not None:
                key = (index, part.index)
                call_id = self.call_ids.setdefault(key, "call_" + secrets.token_hex(12))
                call |= {"id": call_id, "type": "function"}
                function = {"name": part.name, **function}
            call["function"] = function
            whole[part.index] = call
            shaped.append(call)
        return shaped

    def _logprobs(self, entries: list[Logprob]) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        return {"content": [logprob_entry(e) for e in entries], "refusal": None}


router = dialect_router()


@router.post("/chat/completions", responses=generation_responses("chat.completion"))
async def chat_completions(request: Request, body: ChatRequest) -> Response:
    model = served_model(request, body.model)
    n = choices(request, body)
    fitted = await chat_constraint(body)
    pictures = await images(request, body.image_urls(), model)
    params = body.params() | fitted.params() | {"images": pictures}
    ask = Ask.of(params, body.prompt_chars(), body.stream, n)
    answer = ChatAnswer(model, request.state.request_id, body)
    return await exchange(request, model, ask, answer)

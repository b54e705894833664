"""Anthropic Messages: `POST /v1/messages` and `POST /v1/messages/count_tokens`.

The body (anthropic_schema.py) becomes one `Generate`: the conversation as the chat
template takes it, the tools, thinking on or off, the grammar of a forced call or a JSON
answer (structured.py); the answer (anthropic_answer.py) is a `message` or its event
stream. Every guarantee is the engine's (exchange.py, delivery.py): replay before the
stream starts, resume after (the same content block goes on), quarantine as the stream's
`error` event, errors in Anthropic's envelope with steward's fields added (errors.py).

A client's `max_tokens` is a bound, not a demand (`Ask.fit_context`): agents send their
own (Claude Code 32000 and more), whatever the model's context, and a prompt that leaves
less room gets what there is, ending `model_context_window_exceeded` as Anthropic's
newer models do.

`count_tokens` counts as the engine does: the same `Generate` (less its grammar), run for
one token that nobody sees; the count is the worker's own `Done.prompt_tokens`, the
template and tools included, and its prefill warms the prompt cache for the request that
usually follows. (No worker call only tokenises; the front never loads a tokenizer.)

Claude Code also sends, from the beta API: `context_management` (its prompt-cache path
adds a `clear_thinking_20251015` edit, served: older turns' thinking is left out), `?beta=true`
and the `anthropic-version` / `anthropic-beta` headers (accepted, no effect).
"""

from __future__ import annotations

from typing import Any

from fastapi import Request, Response
from pydantic import BaseModel

from steward.errors import ANTHROPIC_TYPES, ERROR_TYPES, ApiError
from steward.front import backend
from steward.front.dialects.anthropic_answer import MessageAnswer, TokenCount
from steward.front.dialects.anthropic_schema import (
    CountTokensRequest,
    MessagesPrompt,
    MessagesRequest,
)
from steward.front.dialects.exchange import dialect_router, exchange, images, served_model
from steward.front.dialects.seam import Ask
from steward.front.docs import COMMON, GENERATION, IGNORED, FaultRef
from steward.front.structured import ANY_OBJECT, Constraint, constraint


class AnthropicErrorBody(BaseModel):
    type: str  # Anthropic's: invalid_request_error, overloaded_error, ...
    message: str
    code: str  # steward's own type (SPEC §4)
    retryable: bool
    retry_after: int | None = None
    fault: FaultRef | None = None


class AnthropicError(BaseModel):
    """Every error under /v1/messages (steward/errors.py `AnthropicEnvelope`); a started
    stream's `event: error` carries the same body."""

    type: str = "error"
    error: AnthropicErrorBody
    request_id: str


def responses(obj: str, streams: bool) -> dict[int | str, dict[str, Any]]:
    """What the OpenAPI schema says: the answer, and each error status in Anthropic's
    envelope with the types it may carry."""
    kinds: dict[int, set[str]] = {}
    for kind, (status, _retryable) in ERROR_TYPES.items():
        kinds.setdefault(status, set()).add(f"{ANTHROPIC_TYPES[kind]} ({kind})")
    described = {
        status: {
            "model": AnthropicError,
            "description": "error: " + ", ".join(sorted(kinds[status])),
            "headers": IGNORED,
        }
        for status in sorted({401, *GENERATION, *COMMON})
    }
    content: dict[str, Any] = {"application/json": {"schema": {"type": "object"}}}
    if streams:
        content["text/event-stream"] = {}
        obj += (
            ", or with `stream: true` its events: `message_start`, `ping`, then per block "
            "`content_block_start`, `content_block_delta` (`thinking_delta`, "
            "`signature_delta`, `text_delta`, `input_json_delta`), `content_block_stop`; "
            "`message_delta` (stop reason, usage), `message_stop`; a stream that cannot go "
            "on ends with one `error` event instead"
        )
    return {200: {"description": obj, "content": content, "headers": IGNORED}, **described}


router = dialect_router()


async def fitted(body: MessagesPrompt) -> Constraint:
    """The grammar and tool-call mode (structured.py)."""
    tools = {tool.name: tool.input_schema or ANY_OBJECT for tool in body.tools or []}
    choice = body.choice()
    if choice == "tool":
        assert body.tool_choice is not None and body.tool_choice.name is not None
        return await constraint(tools, "named", body.tool_choice.name)
    choice = "required" if choice == "any" else choice
    return await constraint(tools, choice, parallel=not body.single_call, schema=body.schema())


async def prompt(request: Request, model: str, body: MessagesPrompt) -> dict[str, Any]:
    """`Generate`'s prompt fields: the conversation, its images, the tools, thinking."""
    _check_context_management(request, body)
    tools = None
    if body.tools and body.choice() != "none":
        tools = [tool.for_template() for tool in body.tools]
    return {
        "messages": body.template_messages(),
        "images": await images(request, body.image_urls(), model),
        "tools": tools,
        "thinking": body.enable_thinking(),
    }


def _check_context_management(request: Request, body: MessagesPrompt) -> None:
    """A `clear_tool_uses` edit is served where it cannot fire (anthropic_schema.py)."""
    edits = body.clear_tool_uses()
    if not edits:
        return
    supervisor = backend.supervisor(request)
    context = request.state.slot.known_context_length
    if context is None:  # never loaded before
        raise ApiError(
            "backend_unavailable",
            "The model's context length is not known until it has loaded; retry shortly.",
            retry_after=supervisor.retry_after(),
        )
    if low := [edit.threshold for edit in edits if edit.threshold < context]:
        raise ApiError(
            "validation_error",
            f"context_management: clear_tool_uses_20250919 with a trigger of {low[0]} input "
            f"tokens is not served (steward clears no tool results); a trigger at or beyond "
            f"the model's context length ({context}) is, as it can never fire",
            param="context_management",
        )


@router.post("/messages", responses=responses("an Anthropic `message`", streams=True))
async def messages(request: Request, body: MessagesRequest) -> Response:
    """An Anthropic `message`, or with `stream: true` its server-sent events."""
    model = served_model(request, body.model)
    shape = await fitted(body)
    params = await prompt(request, model, body)
    params |= shape.params() | body.sampling() | {"max_tokens": max(body.max_tokens, 1)}
    ask = Ask.of(params, body.prompt_chars(), body.stream, fit_context=body.max_tokens > 0)
    answer = MessageAnswer(
        model,
        request.state.request_id,
        body.max_tokens,
        omit_thinking=bool(body.thinking and body.thinking.display == "omitted"),
    )
    return await exchange(request, model, ask, answer)


@router.post("/messages/count_tokens", responses=responses('`{"input_tokens": N}`', streams=False))
async def count_tokens(request: Request, body: CountTokensRequest) -> Response:
    """`{"input_tokens": N}`: the prompt as the engine counts it (module doc)."""
    model = served_model(request, body.model)
    params = await prompt(request, model, body) | {"max_tokens": 1, "temperature": 0.0}
    ask = Ask.of(params, body.prompt_chars(), stream=False)
    return await exchange(request, model, ask, TokenCount())

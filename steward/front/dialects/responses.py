"""OpenAI Responses: `POST /v1/responses` (a `response` object, or its stream of typed
events), and the stored responses' `GET`, `DELETE`, `input_items` (and `cancel`, which
only a background response could take: steward runs none).

The body (responses_schema.py) and the conversation it continues (a stored response's,
responses_store.py) are read as chat messages (responses_input.py) into one `Ask`; the
jobs' events become output items and stream events (responses_output.py). Replay before
the first event, resume after it, deadlines and cancellation are the engine's
(exchange.py, delivery.py), as for every dialect.

A stream that cannot go on (quarantine, deadline, recovery spent) ends with
`response.failed`, whose `response.error` carries steward's `code` (its error type),
`retryable`, `retry_after`, `fault` and `request_id`. Errors before a stream starts are
ordinary error responses in the SPEC §4 envelope, which the OpenAI SDK reads.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fastapi import Query, Request, Response

from steward.errors import ApiError
from steward.front.dialects.exchange import dialect_router, exchange, images, served_model
from steward.front.dialects.responses_input import read
from steward.front.dialects.responses_output import Output, new_id
from steward.front.dialects.responses_schema import FunctionChoice, ResponsesRequest
from steward.front.dialects.responses_store import ResponseStore, Stored
from steward.front.dialects.seam import Answer, Ask
from steward.front.docs import GENERATION, IGNORED, error_responses
from steward.front.structured import ANY_OBJECT, Constraint, constraint
from steward.supervisor.jobs import Job
from steward.wire.protocol import Done, Token

ITEM_IDS = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "reasoning": "rs",
}
STREAMED = {
    200: {
        "description": "a `response` object, or with `stream: true` an SSE stream of typed "
        "events (`response.created` ... `response.completed`, each with its "
        "`sequence_number`); a stream whose backend cannot recover ends with "
        "`response.failed` instead",
        "content": {
            "application/json": {"schema": {"type": "object"}},
            "text/event-stream": {},
        },
        "headers": IGNORED,
    },
    **error_responses(*GENERATION),
}


def store_of(request: Request) -> ResponseStore:
    """The app's one store, made on first use from its bounds."""
    state = request.app.state
    store = getattr(state, "responses_store", None)
    if store is None:
        config = state.config
        store = ResponseStore(config.responses_store_bytes, config.responses_store_age)
        state.responses_store = store
    return store


def stored(request: Request, response_id: str) -> Stored:
    record = store_of(request).get(response_id)
    if record is None:
        raise ApiError("not_found", f"No stored response {response_id!r}. {GONE}")
    return record


GONE = (
    "Stored responses live in steward's memory: they are lost when it restarts, and the "
    "oldest are evicted past --responses-store-bytes or --responses-store-age."
)


async def responses_constraint(body: ResponsesRequest) -> Constraint:
    """The request's grammar and tool-call mode (structured.py)."""
    choice = body.choice()
    tools = {tool.name: tool.parameters for tool in body.allowed()}
    if isinstance(choice, FunctionChoice):
        return await constraint(tools, "named", choice.name)
    schema = (body.format().schema_ or ANY_OBJECT) if body.structured() else None
    return await constraint(tools, choice, parallel=body.parallel(), schema=schema)


class ResponsesAnswer(Answer):
    """The jobs' events (one job: Responses has no `n`) as a `response` and its events."""

    def __init__(
        self,
        model: str,
        body: ResponsesRequest,
        keep: Callable[[dict[str, Any]], bool],
    ) -> None:
        self.id = new_id("resp")
        self.created = int(time.time())
        self.model = model
        self.body = body
        self.keep = keep
        self.output = Output(
            logprobs=body.includes("message.output_text.logprobs"),
            encrypted=body.includes("reasoning.encrypted_content"),
            namespaced=body.namespaced(),
        )

    def response(self, status: str) -> dict[str, Any]:
        """The response object as it stands (its output so far)."""
        body = self.body
        reasoning = body.reasoning
        text = body.text
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": None,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "max_tool_calls": body.max_tool_calls,
            "model": self.model,
            "output": self.output.items,
            "parallel_tool_calls": body.parallel(),
            "previous_response_id": body.previous_response_id,
            "prompt_cache_key": body.prompt_cache_key,
            "reasoning": {
                "effort": reasoning.effort if reasoning else None,
                "summary": (reasoning.summary or reasoning.generate_summary) if reasoning else None,
            },
            "safety_identifier": body.safety_identifier,
            "service_tier": "default",
            "store": body.store is not False,
            "temperature": 1.0 if body.temperature is None else body.temperature,
            "text": {
                "format": body.format().shown(),
                "verbosity": (text.verbosity if text else None) or "medium",
            },
            "tool_choice": self._tool_choice(),
            "tools": [tool.model_dump(by_alias=True) for tool in body.tools or []],
            "top_logprobs": body.top_logprobs or 0,
            "top_p": body.top_p or 1.0,
            "truncation": "disabled",
            "usage": None,
            "user": body.user,
            "metadata": body.metadata or {},
        }

    def _tool_choice(self) -> Any:
        choice = self.body.tool_choice
        if choice is None:
            return "auto" if self.body.tools else "none"
        return choice if isinstance(choice, str) else choice.model_dump()

    def ended(self, done: Done) -> dict[str, Any]:
        """The whole response, stored if asked."""
        cut = done.finish_reason == "length"
        response = self.response("incomplete" if cut else "completed")
        if cut:
            response["incomplete_details"] = {"reason": "max_output_tokens"}
        else:
            response["completed_at"] = int(time.time())
        response["usage"] = usage(done)
        response["store"] = self.keep(response)
        return response

    def full(self, jobs: list[Job], dones: list[Done]) -> dict[str, Any]:
        job, done = jobs[0], dones[0]
        self.output.add("".join(job.text), "".join(job.reasoning), job.calls, job.logprobs)
        self.output.finish(done)
        self.output.take()  # no stream: the events go nowhere
        return self.ended(done)

    def opening(self) -> list[str]:
        self.output.event("response.created", response=self.response("in_progress"))
        self.output.event("response.in_progress", response=self.response("in_progress"))
        return self.output.take()

    def delta(self, index: int, token: Token, first: bool) -> list[str]:
        logprobs = [token.logprob] if token.logprob else []
        self.output.add(token.text, token.reasoning, token.calls, logprobs)
        return self.output.take()

    def finished(self, index: int, done: Done, first: bool) -> list[str]:
        self.output.finish(done)
        return self.output.take()

    def closing(self, dones: list[Done]) -> list[str]:
        response = self.ended(dones[0])
        self.output.event(f"response.{response['status']}", response=response)
        return self.output.take()

    def failed(self, error: ApiError, request_id: str) -> list[str]:
        if self.output.open is not None:
            self.output.open["status"] = "incomplete"
        response = self.response("failed")
        response["error"] = {
            "code": str(error.type),
            "message": error.message,
            "type": str(error.type),
            **error.details(),
            "request_id": request_id,
        }
        response["store"] = self.keep(response)
        self.output.event("response.failed", response=response)
        return self.output.take()


def usage(done: Done) -> dict[str, Any]:
    """Tokens as the Responses API counts them (thinking is output, counted apart too);
    steward does not count prompt-cache writes (0)."""
    prompt, completion = done.prompt_tokens, done.completion_tokens
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": done.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": done.reasoning_tokens},
        "total_tokens": prompt + completion,
    }


def with_ids(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Items as stored and listed: each with an id (the client's, else a new one)."""
    return [
        item if item.get("id") else {"id": new_id(ITEM_IDS[item["type"]]), **item} for item in items
    ]


router = dialect_router()


@router.post("/responses", responses=STREAMED)
async def create(request: Request, body: ResponsesRequest) -> Response:
    model = served_model(request, body.model)
    store = store_of(request)
    history: list[dict[str, Any]] = []
    if body.previous_response_id is not None:
        previous = store.get(body.previous_response_id)
        if previous is None:
            raise ApiError(
                "validation_error",
                f"previous_response_id: no stored response {body.previous_response_id!r}. {GONE}",
                param="previous_response_id",
            )
        history = previous.conversation()
    items = with_ids(body.items())
    if not items:
        raise ApiError(
            "validation_error", "input: give the input, a string or items", param="input"
        )
    conversation = read(body.instructions, [*history, *items])
    fitted = await responses_constraint(body)
    choice = body.choice()
    tools = [tool.for_template() for tool in body.allowed()] if choice != "none" else None
    logprobs = (body.top_logprobs or 0) if body.includes("message.output_text.logprobs") else -1
    params = {
        "messages": conversation.messages,
        "max_tokens": body.max_output_tokens,
        "tools": tools or None,
        "logprobs": logprobs,
        "thinking": body.thinking(),
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "top_p": body.top_p or 1.0,
        "images": await images(request, conversation.image_urls, model),
        **fitted.params(),
    }
    ask = Ask.of(params, conversation.chars + body.tools_chars(), bool(body.stream))

    def keep(response: dict[str, Any]) -> bool:
        if body.store is False:
            return False
        return store.put(Stored(response, items, history))

    answer = ResponsesAnswer(model, body, keep)
    return await exchange(request, model, ask, answer)


@router.get("/responses/{response_id}", responses=error_responses(400, 404))
def retrieve(request: Request, response_id: str, stream: bool = False) -> dict[str, Any]:
    """A stored response (`include` and `starting_after` change nothing: it is whole)."""
    if stream:
        raise ApiError(
            "validation_error",
            "stream: a stored response is whole; only background responses stream again, "
            "and steward runs none",
            param="stream",
        )
    return stored(request, response_id).response


@router.delete("/responses/{response_id}", responses=error_responses(404))
def delete(request: Request, response_id: str) -> dict[str, Any]:
    if not store_of(request).delete(response_id):
        raise ApiError("not_found", f"No stored response {response_id!r}. {GONE}")
    return {"id": response_id, "object": "response.deleted", "deleted": True}


@router.post("/responses/{response_id}/cancel", responses=error_responses(400, 404))
def cancel(request: Request, response_id: str) -> dict[str, Any]:
    stored(request, response_id)
    raise ApiError(
        "validation_error", "Only background responses can be cancelled; steward runs none."
    )


@router.get("/responses/{response_id}/input_items", responses=error_responses(400, 404))
def input_items(
    request: Request,
    response_id: str,
    limit: int = Query(20, ge=1, le=100),
    order: str = Query("desc", pattern="^(asc|desc)$"),
    after: str | None = Query(None, max_length=256),
) -> dict[str, Any]:
    """The items of the request's own input (not the history a `previous_response_id`
    continued), newest first unless `order=asc`, `limit` at a time after the item `after`."""
    items = stored(request, response_id).input_items
    items = items[::-1] if order == "desc" else list(items)
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise ApiError("validation_error", f"after: no input item {after!r}", param="after")
        items = items[ids.index(after) + 1 :]
    page = items[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(items) > limit,
    }

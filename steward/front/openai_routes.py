"""The OpenAI-compatible routes: /v1/chat/completions, /v1/completions, /v1/models."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from typing import Any

import msgspec
from fastapi import APIRouter, Depends, Request

from steward.errors import ApiError
from steward.front.body import JSONRoute
from steward.front.docs import error_responses, generation_responses
from steward.front.images import ImageLimits, load_images
from steward.front.respond import Answer, Waiter, respond
from steward.front.schemas import ChatRequest, CompletionRequest, Sampling
from steward.front.structured import constraint
from steward.wire.protocol import Generate, encode


def require_key(request: Request) -> None:
    key = request.app.state.config.api_key
    if not key:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.encode(), key.encode()):
        raise ApiError(
            "unauthorized",
            "Missing or wrong API key (Authorization: Bearer ...).",
            headers={"www-authenticate": "Bearer"},
        )


router = APIRouter(
    prefix="/v1",
    dependencies=[Depends(require_key)],
    route_class=JSONRoute,
    responses=error_responses(401),
)


def served_names(request: Request) -> list[str]:
    supervisor = request.app.state.supervisor
    return [supervisor.source.model_id, *request.app.state.config.served_model_name]


def check_model(request: Request, body: Sampling) -> str:
    """The served model's id, if `body.model` names this model (SPEC §4); else 404."""
    names = served_names(request)
    if body.model in (None, "", "default", *names):
        return names[0]
    raise ApiError(
        "model_not_found",
        f"The model {body.model!r} is not served here; this server serves "
        f"{', '.join(repr(n) for n in names)}.",
    )


async def generate(request: Request, kind: str, body: ChatRequest | CompletionRequest):
    model = check_model(request, body)
    supervisor = request.app.state.supervisor
    config = request.app.state.config
    if body.n > config.max_n:
        raise ApiError("validation_error", f"n: at most {config.max_n} (--max-n)")
    params: dict[str, Any] = body.params()
    urls = body.image_urls()
    if urls and not supervisor.vision:
        raise ApiError("validation_error", f"The model {model!r} does not take images.")
    if isinstance(body, ChatRequest) and (body.tools or body.structured()):
        params |= (await asyncio.to_thread(constraint, body)).params()  # off the event loop
    images = await load_images(urls, ImageLimits.of(config)) if urls else []
    payload = Generate(id=0, seq=0, attempt=0, images=images, **params)
    try:
        wire = encode(payload)  # what the worker will get: it must encode, here, not later
    except (msgspec.EncodeError, OverflowError, UnicodeEncodeError) as exc:
        raise ApiError("validation_error", f"The request cannot be encoded: {exc}") from None
    digest = hashlib.sha256(model.encode() + b"\0" + wire).hexdigest()
    request_id = request.state.request_id
    waiters: list[Waiter] = []
    try:
        for choice in _choices(payload, body.n):
            job = supervisor.submit(choice, body.prompt_chars(), request_id, digest, body.stream)
            waiters.append(Waiter(job, supervisor, config, request.app.state.metrics))
    except ApiError:
        for waiter in waiters:  # all choices or none
            waiter.close()
        raise
    chat = isinstance(body, ChatRequest)
    answer = Answer(
        kind,
        model,
        request_id,
        body.include_usage(),
        logprobs=payload.logprobs >= 0,
        parallel_calls=not chat or body.parallel_tool_calls,
    )
    return await respond(request, waiters, answer, body.stream, request_id)


def _choices(payload: Generate, n: int) -> list[Generate]:
    """`n` choices are `n` jobs, batch members that share the prompt; a seeded request's
    choices differ, each by its own seed, and stay reproducible."""
    if payload.seed is None:
        return [payload] * n
    return [msgspec.structs.replace(payload, seed=(payload.seed + i) % 2**32) for i in range(n)]


@router.post("/chat/completions", responses=generation_responses("chat.completion"))
async def chat_completions(request: Request, body: ChatRequest):
    return await generate(request, "chat", body)


@router.post("/completions", responses=generation_responses("text_completion"))
async def completions(request: Request, body: CompletionRequest):
    return await generate(request, "text", body)


@router.get("/models")
def models(request: Request) -> dict[str, Any]:
    supervisor = request.app.state.supervisor
    root = supervisor.source.model_id
    return {
        "object": "list",
        "data": [
            {
                "id": name,
                "object": "model",
                "created": int(supervisor.started_at),
                "owned_by": "steward",
                "root": root,
                "context_length": supervisor.context_length,
            }
            for name in served_names(request)
        ],
    }

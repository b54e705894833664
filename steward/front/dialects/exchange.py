"""One request's exchange with the supervisor, whatever its dialect: the engine side of
every dialect module.

A dialect translates twice, and does nothing else: its wire body into an `Ask` (the one
internal `Generate`, the prompt's characters, whether it streams), and the jobs' events
out into its own wire shapes (an `Answer`; both in seam.py). Everything else lives here
and in delivery.py once, so every guarantee holds in every dialect at once: the model
name, the API key, the digest that quarantine keys on, the default `max_tokens` cap
(here); waiting within the queue and request deadlines, a stream that starts only once
its first token exists, a client that hangs up cancelling its jobs, and the access log's
model, error type and token counts (delivery.py). The rules about the answer itself are
the worker's, once (worker/toolcalls.py): a forced call's text is never content, and a
request that allows no parallel calls gets its first call only; a grammar is compiled off
the event loop in one place (structured.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import msgspec
from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from steward.errors import ApiError, ErrorType
from steward.front import backend
from steward.front.auth import require_key
from steward.front.body import JSONRoute
from steward.front.dialects.delivery import Waiter, respond
from steward.front.dialects.seam import Answer, Ask
from steward.front.docs import error_responses
from steward.front.images import ImageLimits, load_images
from steward.model.kind import KINDS
from steward.supervisor.jobs import Job
from steward.wire.protocol import Embed, Generate, encode


def dialect_router() -> APIRouter:
    """A dialect's routes: under /v1, behind the API key, bodies read as checked JSON."""
    return APIRouter(
        prefix="/v1",
        dependencies=[Depends(require_key)],
        route_class=JSONRoute,
        responses=error_responses(401),
    )


def served_model(request: Request, name: str | None, kind: str = "chat") -> str:
    """The id of the model `name` may mean (pool/names.py), noted for the access log;
    a model of another kind than the route's (`chat` generates) is the route's 400, as
    vLLM answers it."""
    slot = backend.route(request, name)
    model = slot.name
    if (served := slot.config.model_kind) in KINDS and served != kind:  # not "auto"
        route = f"{request.method} {request.url.path}"
        other = "POST /v1/embeddings" if served == "embedding" else "the generation routes"
        raise ApiError(
            "validation_error",
            f"The model {model!r} is {'an' if served == 'embedding' else 'a'} {served} model: "
            f"it does not support {route}; "
            f"it answers {other}.",
            param="model",
        )
    return model


async def images(request: Request, urls: list[str], model: str) -> list[bytes]:
    """The request's images within the limits, for a model that takes images."""
    if not urls:
        return []
    if not request.state.slot.vision:
        raise ApiError("validation_error", f"The model {model!r} does not take images.")
    return await load_images(urls, ImageLimits.of(request.app.state.config))


async def exchange(request: Request, model: str, ask: Ask, answer: Answer) -> Response:
    """Run `ask` and answer it in `answer`'s dialect: JSON, or SSE when it streams."""
    return await respond(request, submit(request, model, ask), answer, ask.stream)


def submit(request: Request, model: str, ask: Ask) -> list[Waiter]:
    """A job per choice, all or none. Without a client `max_tokens`, `--max-tokens-default`
    caps the answer (with `fit_context`, the client's own `max_tokens` does); where the
    prompt leaves less room than that, the context does."""
    cap = request.app.state.config.max_tokens_default if ask.payload.max_tokens is None else 0
    if ask.fit_context and ask.payload.max_tokens is not None:
        cap = ask.payload.max_tokens
    waiters: list[Waiter] = []
    try:
        for choice in _choices(ask.payload, ask.choices):
            unbounded = msgspec.structs.replace(choice, max_tokens=None) if cap else choice
            whole = _starter(request, model, unbounded, ask.prompt_chars, ask.stream)
            if not cap:
                waiters.append(Waiter(request, whole()))
                continue
            limited = msgspec.structs.replace(choice, max_tokens=cap)
            capped = _starter(request, model, limited, ask.prompt_chars, ask.stream)
            try:
                waiters.append(Waiter(request, capped(), fallback=whole))
            except ApiError as error:
                if error.type is not ErrorType.CONTEXT_LENGTH_EXCEEDED:
                    raise
                waiters.append(Waiter(request, whole()))
    except ApiError:
        for waiter in waiters:
            waiter.close()
        raise
    return waiters


def _choices(payload: Generate, n: int) -> list[Generate]:
    """`n` choices are `n` jobs; a seeded request's choices differ, each by its own seed,
    and stay reproducible."""
    if payload.seed is None:
        return [payload] * n
    return [msgspec.structs.replace(payload, seed=(payload.seed + i) % 2**32) for i in range(n)]


def start_job(request: Request, model: str, payload: Embed, prompt_chars: int) -> Job:
    """Submit a payload that is one job (an embedding), as every dialect's are."""
    return _starter(request, model, payload, prompt_chars, stream=False)()


def _starter(
    request: Request, model: str, payload: Generate | Embed, prompt_chars: int, stream: bool
) -> Callable[[], Job]:
    """Submitting `payload`, deferred; its digest (model + the bytes the worker gets) is
    what quarantine recognises a payload by, whatever the dialect."""
    try:
        wire = encode(payload)  # what the worker will get: it must encode, here, not later
    except (msgspec.EncodeError, OverflowError, UnicodeEncodeError) as exc:
        raise ApiError("validation_error", f"The request cannot be encoded: {exc}") from None
    digest = hashlib.sha256(model.encode() + b"\0" + wire).hexdigest()
    request_id = request.state.request_id
    # The supervisor is looked up when the job is submitted: a fallback submitted later
    # goes to the model's supervisor then, not to one evicted meanwhile.
    return lambda: backend.supervisor(request).submit(
        payload, prompt_chars, request_id, digest, stream
    )

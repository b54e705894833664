"""The HTTP front: a FastAPI app over the pool of running supervisors, one per model.

Every error leaves through `error_response`, in the envelope of the dialect its path
belongs to: our own `ApiError`s, FastAPI's validation errors (with the field as `param`),
unknown routes (naming the routes steward serves) and methods, and (as `internal_error`)
bugs in steward itself.
"""

from __future__ import annotations

import logging
import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response

from steward import __version__
from steward.config import ServeConfig
from steward.errors import ApiError, error_response
from steward.front import health_routes
from steward.front.dialects import anthropic, chat, completions, embeddings, openai, responses
from steward.front.middleware import RequestContext
from steward.ops.metrics import Metrics
from steward.pool.pool import Pool
from steward.supervisor.supervisor import Supervisor

log = logging.getLogger("steward.front")

HTTP_TYPES = {
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    413: "request_too_large",
}


def create_app(config: ServeConfig, backend: Pool | Supervisor, metrics: Metrics) -> FastAPI:
    """The app over a pool of supervisors, or over one supervisor (a pool of it)."""
    app = FastAPI(title="steward", version=__version__, docs_url=None, redoc_url=None)
    app.state.config = config
    app.state.pool = backend if isinstance(backend, Pool) else Pool.around(config, backend)
    app.state.metrics = metrics
    app.include_router(health_routes.router)
    for dialect in (chat, completions, openai, anthropic, responses, embeddings):
        app.include_router(dialect.router)
    app.add_middleware(RequestContext, config=config, metrics=metrics)

    def answer(request: Request, error: ApiError) -> Response:
        metrics.error(error.type)
        request.state.error_type = str(error.type)
        return error_response(error, request_id(request), request.url.path)

    @app.get("/metrics", include_in_schema=False)
    def scrape() -> Response:
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> Response:
        return answer(request, exc)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        errors = exc.errors()
        problems = "; ".join(_describe(e) for e in errors[:8])
        param = _param(errors[0]) if errors else None
        return answer(request, ApiError("validation_error", problems, param=param))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        if isinstance(exc.__cause__, ApiError):  # raised while FastAPI read the body
            return answer(request, exc.__cause__)
        kind = HTTP_TYPES.get(exc.status_code, "validation_error")
        message = f"{request.method} {request.url.path}: {exc.detail}"
        if exc.status_code == 404 and "route" not in request.scope:
            message += f"; steward serves {served_routes(app)}"
        return answer(request, ApiError(kind, message, headers=dict(exc.headers or {})))

    @app.exception_handler(Exception)
    async def bug(request: Request, exc: Exception) -> Response:
        log.exception(
            "internal error on %s %s",
            request.method,
            request.url.path,
            extra={"request_id": request_id(request)},
        )
        return answer(
            request, ApiError("internal_error", f"steward bug: {type(exc).__name__}: {exc}")
        )

    return app


def request_id(request: Request) -> str:
    return getattr(request.state, "request_id", "") or "-"


def served_routes(app: FastAPI) -> str:
    """`GET /health, POST /v1/chat/completions, ...`: what a 404 on an unknown route
    offers instead, read from the OpenAPI schema (built once, then cached by FastAPI)."""
    paths = app.openapi()["paths"]
    return ", ".join(
        f"{method.upper()} {path}" for path in sorted(paths) for method in sorted(paths[path])
    )


FIELD = re.compile(r"[A-Za-z_][\w.\[\]]*")


def _param(error: dict) -> str | None:
    """The field a validation error names: its location, or a validator's `field: ...`."""
    where = ".".join(str(p) for p in error.get("loc", ()) if p != "body")
    if where:
        return where
    head, colon, _ = str(error.get("msg", "")).removeprefix("Value error, ").partition(":")
    return head if colon and FIELD.fullmatch(head) else None


def _describe(error: dict) -> str:
    where = ".".join(str(p) for p in error.get("loc", ()) if p != "body")
    message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
    if error.get("type") == "extra_forbidden":  # only with --strict-requests (ignored.py)
        message = "unrecognized request argument (refused: --strict-requests)"
    return message if not where and ": " in message else f"{where or 'body'}: {message}"

"""Health endpoints: answered from the pool's snapshot, never by running inference.

`/health/live` is the front's liveness (200 whenever it can answer); `/health` and
`/health/ready` say whether requests are served now (200) or not (503 + Retry-After).
With one model the body is that model's, as it always was, plus the `models` section;
with several it is the server's, and `/health/ready?model=NAME` answers for one model:
200 while it serves, or is unloaded (a request for it loads it), else 503.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from steward import __version__
from steward.front import backend
from steward.supervisor.state import State

router = APIRouter()


def _health(request: Request) -> JSONResponse:
    snapshot = backend.pool(request).snapshot()
    body = snapshot.health() | {"version": __version__}
    if snapshot.status.serving:
        return JSONResponse(body)
    headers = {}
    if snapshot.status is not State.FAILED:
        headers["retry-after"] = str(snapshot.retry_after)
    return JSONResponse(body, 503, headers=headers)


def _ready(request: Request, model: str | None = None) -> JSONResponse:
    if model is None:
        return _health(request)
    name = backend.pool(request).find(model).name
    one = backend.pool(request).snapshot().model(name)
    body = {"status": str(one.state), "model": name, "service": "steward"} | one.section()
    body |= {"version": __version__}
    if one.state.answers:
        return JSONResponse(body)
    headers = {} if one.failure else {"retry-after": str(one.retry_after)}
    return JSONResponse(body, 503, headers=headers)


NOT_SERVING = {
    503: {
        "description": "not serving now (starting, recovering, failed, stopping): the same "
        "body, with Retry-After unless failed",
        "content": {"application/json": {"schema": {"type": "object"}}},
    }
}
router.add_api_route("/health", _health, methods=["GET"], responses=NOT_SERVING)
UNKNOWN = {
    404: {
        "description": "`model` names no configured model (model_not_found)",
        "content": {"application/json": {"schema": {"type": "object"}}},
    }
}
router.add_api_route("/health/ready", _ready, methods=["GET"], responses=NOT_SERVING | UNKNOWN)


@router.get("/health/live")
def live(request: Request) -> dict[str, object]:
    state = backend.pool(request).status()
    return {"status": "alive", "state": str(state), "service": "steward"}

"""Health endpoints: answered from the supervisor's snapshot, never by running inference.

`/health/live` is the front's liveness (200 whenever it can answer); `/health` and
`/health/ready` say whether requests are served now (200) or not (503 + Retry-After).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from steward import __version__
from steward.supervisor.state import State

router = APIRouter()


def _health(request: Request) -> JSONResponse:
    snapshot = request.app.state.supervisor.snapshot()
    body = snapshot.health() | {"version": __version__}
    if snapshot.status.serving:
        return JSONResponse(body)
    headers = {}
    if snapshot.status is not State.FAILED:
        headers["retry-after"] = str(snapshot.retry_after)
    return JSONResponse(body, 503, headers=headers)


NOT_SERVING = {
    503: {
        "description": "not serving now (starting, recovering, failed, stopping): the same "
        "body, with Retry-After unless failed",
        "content": {"application/json": {"schema": {"type": "object"}}},
    }
}
router.add_api_route("/health", _health, methods=["GET"], responses=NOT_SERVING)
router.add_api_route("/health/ready", _health, methods=["GET"], responses=NOT_SERVING)


@router.get("/health/live")
def live(request: Request) -> dict[str, object]:
    supervisor = request.app.state.supervisor
    return {"status": "alive", "state": str(supervisor.status()), "service": "steward"}

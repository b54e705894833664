"""Health endpoints: answered from the supervisor's state, never by running inference.

`/health/live` is the front's liveness (200 whenever it can answer); `/health` and
`/health/ready` say whether requests are served now (200) or not (503 + Retry-After).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from steward.supervisor.state import State

router = APIRouter()


def _health(request: Request) -> JSONResponse:
    supervisor = request.app.state.supervisor
    body = supervisor.health()
    if supervisor.state.serving:
        return JSONResponse(body)
    headers = {}
    if supervisor.state is not State.FAILED:
        headers["retry-after"] = str(supervisor.retry_after())
    return JSONResponse(body, 503, headers=headers)


router.add_api_route("/health", _health, methods=["GET"])
router.add_api_route("/health/ready", _health, methods=["GET"])


@router.get("/health/live")
def live(request: Request) -> dict[str, object]:
    supervisor = request.app.state.supervisor
    return {"status": "alive", "state": str(supervisor.state), "service": "steward"}

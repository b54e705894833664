"""Health endpoints: answered from the supervisor's state, never by running inference.

`/health/live` is the front's liveness (200 whenever it can answer); `/health` and
`/health/ready` say whether requests are served now (200) or not (503 + Retry-After).
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from steward import __version__
from steward.supervisor.state import State
from steward.supervisor.supervisor import Supervisor

router = APIRouter()


def health_body(supervisor: Supervisor) -> dict[str, Any]:
    """The SPEC §2 fields, and what else an operator wants at a glance."""
    link = supervisor.link
    faults = supervisor.faults
    return {
        "status": str(supervisor.status()),
        "model": supervisor.source.model_id,
        "service": "steward",
        "version": __version__,
        "worker": {
            "pid": link.pid if link else None,
            "generation": link.generation if link else 0,  # which worker serves
            "started": supervisor.generation,  # workers started so far, spares included
            "alive": bool(link and link.worker.exitcode is None),
            "bring_up_s": round(supervisor.bring_up_seconds, 3),
        },
        "faults": {
            "total": supervisor.faults_total,
            "last": faults[-1].summary() if faults else None,
        },
        "restarts_in_window": supervisor.intensity.in_window(),
        "queue_depth": len(supervisor.queue),
        "standby": supervisor.standby.summary(),
        "in_flight": len(supervisor.batch) + len(supervisor.batch.probation),
        "batch": {
            "size": len(supervisor.batch),
            "limit": supervisor.batch.limit,
            "probation": len(supervisor.batch.probation),
        },
        "quarantined": len(supervisor.quarantine),
        "context_length": supervisor.context_length,
        "decode_tps": {"baseline": supervisor.baseline_tps, "recent": supervisor.recent_tps},
        "uptime_s": round(time.time() - supervisor.started_at, 1),
    }


def _health(request: Request) -> JSONResponse:
    supervisor = request.app.state.supervisor
    body = health_body(supervisor)
    status = supervisor.status()
    if status.serving:
        return JSONResponse(body)
    headers = {}
    if status is not State.FAILED:
        headers["retry-after"] = str(supervisor.retry_after())
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

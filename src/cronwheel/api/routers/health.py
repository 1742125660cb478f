"""The index (``GET /``: what this server is and where to go), probes and metrics. The
index and the probes need no key, so people and load balancers reach them; metrics
describe every tenant at once, so they answer only to the metrics token or the admin
key (see :func:`cronwheel.api.auth.require_metrics_reader`)."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from cronwheel.api.auth import require_metrics_reader
from cronwheel.api.errors import error_response
from cronwheel.api.jsonbody import StrictJsonRoute
from cronwheel.api.schemas import ERROR_RESPONSES, ErrorResponse, IndexOut
from cronwheel.api.state import api_state
from cronwheel.domain.errors import CronwheelError
from cronwheel.metrics import CONTENT_TYPE_LATEST, render
from cronwheel.version import package_version

__all__ = ["router"]

log = logging.getLogger("cronwheel.api")

router = APIRouter(tags=["operations"], route_class=StrictJsonRoute)


# Where to go from the index: the docs, the schema, the probes and the API's resources.
_LINKS = {
    "docs": "/docs",
    "redoc": "/redoc",
    "dashboard": "/ui",
    "openapi": "/openapi.json",
    "healthz": "/healthz",
    "readyz": "/readyz",
    "metrics": "/metrics",
    "tenants": "/v1/tenants",
    "jobs": "/v1/jobs",
    "runs": "/v1/runs",
    "dead_letters": "/v1/dead-letters",
    "alerts": "/v1/alerts",
    "workers": "/v1/workers",
    "pools": "/v1/pools",
    "audit": "/v1/audit",
    "operations": "/v1/operations",
}


@router.get(
    "/",
    summary="What this server is, and where to go from here",
    # No key needed, but a request that sends one counts against the key's rate.
    responses={429: ERROR_RESPONSES[429]},
)
async def index(request: Request) -> IndexOut:
    """No key needed. The links are paths on this server (behind a proxy, under its
    root path); everything under `/v1/` needs `Authorization: Bearer <key>`."""
    root = str(request.scope.get("root_path") or "")
    return IndexOut(
        name="cronwheel",
        version=package_version(),
        links={name: f"{root}{path}" for name, path in _LINKS.items()},
    )


@router.get("/healthz", summary="Liveness: the process answers (no database access)")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/readyz",
    summary="Readiness: the store answers",
    responses={503: {"model": ErrorResponse, "description": "The store does not answer"}},
)
async def readyz(request: Request) -> JSONResponse:
    try:
        await api_state(request).store.ping()
    except Exception as exc:
        log.warning("store not ready: %s", exc, extra={"event": "api.not_ready"})
        message = exc.message if isinstance(exc, CronwheelError) else "the store does not answer"
        return error_response(503, "store_unavailable", message)
    return JSONResponse({"status": "ready"})


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={
        200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "text format"},
        401: {"model": ErrorResponse, "description": "No key, or not a valid one"},
        403: {"model": ErrorResponse, "description": "A tenant's key"},
        429: {
            "model": ErrorResponse,
            "description": "Too many requests with this key or token (`rate_limited`): "
            "retry after `Retry-After` seconds",
        },
    },
    dependencies=[Depends(require_metrics_reader)],
)
async def metrics(request: Request) -> Response:
    """Needs `Authorization: Bearer <token>` with the setting `metrics_token` (for the
    scraper) or the admin key. The `pool` label has a value of its own only for the
    pools of the setting `metrics_pools`; every other pool — tenants name them — is
    counted under `other`."""
    try:
        await api_state(request).runs_by_state.refresh()
    except Exception:
        # A scrape should still show everything else when the count fails.
        log.warning(
            "runs by state not refreshed",
            exc_info=True,
            extra={"event": "api.metrics_refresh_failed"},
        )
    return Response(render(), media_type=CONTENT_TYPE_LATEST)

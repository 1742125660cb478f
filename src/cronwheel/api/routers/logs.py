"""Worker logs: workers append an attempt's lines, readers page through a run's.

Lines live in the app's :class:`~cronwheel.logstore.LogStore`, never in the hot tables.
An append is fenced like every other call about an attempt — the attempt must still be
live under the token sent, else 409 ``stale_fencing_token`` and nothing is written —
but with one read by primary key: the lines never touch the transactional tables. An
append that passed the check just as the attempt ended may still land after it; the
SDK never races so, as it sends an attempt's last lines before its outcome.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import Any, cast

from fastapi import APIRouter, Depends, Query, Request

from cronwheel.api.auth import Principal, TenantScope, require_worker, tenant_reader
from cronwheel.api.inputs import parse_id
from cronwheel.api.jsonbody import StrictJsonRoute
from cronwheel.api.schemas import ERROR_RESPONSES, ErrorResponse
from cronwheel.api.state import api_state
from cronwheel.api.worker_schemas import LogAppendOut, LogAppendRequest, LogLineOut, LogPageOut
from cronwheel.logstore import LogEntry, LogStore

__all__ = ["delete_logs", "log_store", "router"]

log = logging.getLogger("cronwheel.api")

router = APIRouter(responses=ERROR_RESPONSES, route_class=StrictJsonRoute)

_STALE: dict[int | str, dict[str, Any]] = {
    409: {
        "model": ErrorResponse,
        "description": "Stale fencing token, or the attempt has ended; nothing was written",
    }
}


def log_store(request: Request) -> LogStore:
    return cast(LogStore, request.app.state.logs)


async def delete_logs(
    request: Request, tenant_id: uuid.UUID, run_ids: Sequence[uuid.UUID] | None
) -> None:
    """Delete the worker logs of deleted runs (None: of a deleted tenant). The database
    deletion has happened: a failure here leaves lines no one can reach, and is logged,
    not answered."""
    try:
        if run_ids is None or run_ids:
            await log_store(request).delete(tenant_id, run_ids=run_ids)
    except Exception as exc:  # a file system's or the database's: the answer stands
        log.warning(
            "logs.delete_failed",
            extra={"event": "logs.delete_failed", "tenant_id": str(tenant_id), "error": str(exc)},
        )


@router.post(
    "/v1/attempts/{attempt_id}/logs",
    tags=["worker protocol"],
    summary="Append an attempt's log lines",
    responses=_STALE,
)
async def append_logs(
    attempt_id: str,
    body: LogAppendRequest,
    request: Request,
    principal: Principal = Depends(require_worker),
) -> LogAppendOut:
    """Lines are kept while the attempt is live: send them before its outcome. Past the
    attempt's log cap (``max_log_bytes_per_attempt``) lines are dropped and counted in
    ``dropped``; one marker line in the log says how many."""
    attempt = await api_state(request).store.attempts_get_live(
        attempt_id=parse_id(attempt_id, "attempt"),
        fencing_token=body.fencing_token,
        tenant_id=principal.tenant_id,
    )
    result = await log_store(request).append(
        attempt.tenant_id,
        run_id=attempt.run_id,
        attempt=attempt.number,
        lines=[LogEntry(ts=line.ts, level=line.level, message=line.message) for line in body.lines],
    )
    return LogAppendOut(
        attempt_id=attempt.id, accepted=result.accepted, dropped=result.dropped, size=result.size
    )


@router.get("/v1/runs/{run_id}/logs", tags=["runs"], summary="Read a run's log lines")
async def read_logs(
    run_id: str,
    request: Request,
    scope: TenantScope = Depends(tenant_reader),
    attempt: int | None = Query(default=None, ge=1, le=10**9, description="one attempt only"),
    cursor: str | None = Query(default=None, max_length=100),
    limit: int = Query(default=500, ge=1, le=1000),
) -> LogPageOut:
    """Oldest first, attempt by attempt. ``next_cursor`` pages through what is there;
    to follow a live run, read again later from ``end_cursor`` until ``run_state`` is
    final."""
    # The state is read before the lines: once it is final, no line can come after.
    run = await api_state(request).store.runs_get(scope.tenant_id, parse_id(run_id, "run"))
    page = await log_store(request).read(
        run.tenant_id, run_id=run.id, attempt=attempt, cursor=cursor, limit=limit
    )
    return LogPageOut(
        run_id=run.id,
        run_state=str(run.state),
        lines=[
            LogLineOut(ts=line.ts, attempt=line.attempt, level=line.level, message=line.message)
            for line in page.lines
        ],
        next_cursor=page.next_cursor,
        end_cursor=page.end_cursor,
    )

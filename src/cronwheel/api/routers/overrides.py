"""``/v1/jobs/{id}/overrides`` and ``/v1/runs/{id}/overrides``: runtime parameter
overrides (``domain/overrides.py``), applied by the store to the runs they reach in the
change's own transaction (``store/sql/overrides.py``; docs/overrides.md)."""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Depends, Query, Request, status

from cronwheel.api.auth import TenantScope, actor_of, tenant_reader, tenant_writer
from cronwheel.api.inputs import parse_id
from cronwheel.api.jsonbody import StrictJsonRoute
from cronwheel.api.override_schemas import (
    OverrideIn,
    OverrideList,
    OverrideOut,
    RunOverrideIn,
    override_out,
)
from cronwheel.api.schemas import ERROR_RESPONSES, ErrorResponse
from cronwheel.api.state import api_state
from cronwheel.domain.errors import ConflictError
from cronwheel.domain.new_job import check_json_size
from cronwheel.domain.overrides import OverrideScope

__all__ = ["router"]

router = APIRouter(tags=["overrides"], responses=ERROR_RESPONSES, route_class=StrictJsonRoute)

_REASON = Query(
    default=None, max_length=1000, description="why: kept in the history and the audit trail"
)
_ENDED = Query(default=False, description="also the overrides consumed by their run or removed")
_MADE: dict[int | str, dict[str, Any]] = {
    409: {
        "model": ErrorResponse,
        "description": "The run started already (a run keeps what it started with); the "
        "job has no occurrence to come (`next`), is over, or has as many overrides as it "
        "may (100)",
    },
    413: {"model": ErrorResponse, "description": "A payload would be larger than allowed"},
}
_REMOVED: dict[int | str, dict[str, Any]] = {
    409: {
        "model": ErrorResponse,
        "description": "The override was removed already, or consumed: its run started with it",
    }
}


async def _create(
    request: Request,
    scope: TenantScope,
    body: RunOverrideIn,
    kind: OverrideScope,
    *,
    job_id: uuid.UUID | None = None,
    run_id: uuid.UUID | None = None,
) -> OverrideOut:
    state = api_state(request)
    limit = state.settings.max_payload_bytes
    if body.payload is not None:
        check_json_size(body.payload, limit=limit, field="payload")
    if job_id is not None and (await state.store.jobs_get(scope.tenant_id, job_id)).workflow:
        # A workflow's runs are made of its nodes: a job's overrides have nothing to reach.
        raise ConflictError(
            f"job {job_id} is a workflow: override a node's run (POST /v1/runs/{{id}}/overrides)",
            job_id=str(job_id),
        )
    made, reached = await state.store.overrides_create(
        scope.tenant_id,
        scope=kind,
        job_id=job_id,
        run_id=run_id,
        payload=body.payload,
        timeout=body.timeout,
        priority=body.priority,
        pool=body.pool,
        reason=body.reason,
        actor=actor_of(request, scope.principal),
        max_payload_bytes=limit,
    )
    return override_out(made, reached)


@router.post(
    "/v1/jobs/{job_id}/overrides",
    status_code=status.HTTP_201_CREATED,
    summary="Override a job's next or future runs",
    responses=_MADE,
)
async def create_job_override(
    job_id: str,
    request: Request,
    body: OverrideIn,
    scope: TenantScope = Depends(tenant_writer),
) -> OverrideOut:
    """Changes the payload (a merge-patch), timeout, priority or pool of the job's
    next occurrence (`next`) or of every run of it not started yet and every one made
    until it is removed (`future`), at once: runs already dispatched, waiting in a
    scheduler's due window or reserved by a worker ahead of their instant included.
    Merge order: job < future < next < run. The job's definition is not changed."""
    kind = OverrideScope(body.scope)
    return await _create(request, scope, body, kind, job_id=parse_id(job_id, "job"))


@router.post(
    "/v1/runs/{run_id}/overrides",
    status_code=status.HTTP_201_CREATED,
    summary="Override one run not started yet",
    responses=_MADE,
)
async def create_run_override(
    run_id: str,
    request: Request,
    body: RunOverrideIn,
    scope: TenantScope = Depends(tenant_writer),
) -> OverrideOut:
    """Changes the payload (a merge-patch), timeout, priority or pool of one run that
    has not started — scheduled, dispatched, or reserved by a worker (the reservation is
    voided: the run goes out again with the change). A run that started is a 409."""
    return await _create(request, scope, body, OverrideScope.RUN, run_id=parse_id(run_id, "run"))


@router.get("/v1/jobs/{job_id}/overrides", summary="A job's overrides")
async def list_job_overrides(
    job_id: str,
    request: Request,
    ended: bool = _ENDED,
    scope: TenantScope = Depends(tenant_reader),
) -> OverrideList:
    """The job's overrides, in the merge order: the active ones, or with `ended` every
    one it had."""
    items = await api_state(request).store.overrides_list(
        scope.tenant_id, job_id=parse_id(job_id, "job"), ended=ended
    )
    return OverrideList(items=[override_out(o) for o in items])


@router.get("/v1/runs/{run_id}/overrides", summary="The overrides of a run")
async def list_run_overrides(
    run_id: str,
    request: Request,
    ended: bool = _ENDED,
    scope: TenantScope = Depends(tenant_reader),
) -> OverrideList:
    """The overrides that made the run what it is (its `override_ids`), and any made
    for it alone, in the merge order."""
    items = await api_state(request).store.overrides_list(
        scope.tenant_id, run_id=parse_id(run_id, "run"), ended=ended
    )
    return OverrideList(items=[override_out(o) for o in items])


@router.delete(
    "/v1/jobs/{job_id}/overrides/{override_id}",
    summary="Remove an override of a job",
    responses=_REMOVED,
)
async def remove_job_override(
    job_id: str,
    override_id: str,
    request: Request,
    reason: str | None = _REASON,
    scope: TenantScope = Depends(tenant_writer),
) -> OverrideOut:
    """The runs not started yet that it reached are made again without it; runs that
    started keep it. The override stays listed (`ended=true`) as removed."""
    removed, reached = await api_state(request).store.overrides_remove(
        scope.tenant_id,
        parse_id(override_id, "override"),
        job_id=parse_id(job_id, "job"),
        actor=actor_of(request, scope.principal),
        reason=reason,
        max_payload_bytes=api_state(request).settings.max_payload_bytes,
    )
    return override_out(removed, reached)


@router.delete(
    "/v1/jobs/{job_id}/overrides",
    summary="Remove every active override of a job",
    responses=_REMOVED,
)
async def remove_job_overrides(
    job_id: str,
    request: Request,
    reason: str | None = _REASON,
    scope: TenantScope = Depends(tenant_writer),
) -> OverrideList:
    """Each active override of the job removed, as one by one: answers them."""
    store = api_state(request).store
    ident = parse_id(job_id, "job")
    removed = []
    for o in await store.overrides_list(scope.tenant_id, job_id=ident):
        try:
            gone, reached = await store.overrides_remove(
                scope.tenant_id,
                o.id,
                job_id=ident,
                actor=actor_of(request, scope.principal),
                reason=reason,
                # No limit on the way: one removed before another may make a payload
                # larger for a moment, and with all gone it is the job's own.
            )
        except ConflictError:
            continue  # consumed or removed since it was listed: not active any more
        removed.append(override_out(gone, reached))
    return OverrideList(items=removed)


@router.delete(
    "/v1/runs/{run_id}/overrides/{override_id}",
    summary="Remove a run's own override",
    responses=_REMOVED,
)
async def remove_run_override(
    run_id: str,
    override_id: str,
    request: Request,
    reason: str | None = _REASON,
    scope: TenantScope = Depends(tenant_writer),
) -> OverrideOut:
    """An override bound to the run (scope `run` or `next`): the run is made again
    without it, if it has not started."""
    removed, reached = await api_state(request).store.overrides_remove(
        scope.tenant_id,
        parse_id(override_id, "override"),
        run_id=parse_id(run_id, "run"),
        actor=actor_of(request, scope.principal),
        reason=reason,
        max_payload_bytes=api_state(request).settings.max_payload_bytes,
    )
    return override_out(removed, reached)

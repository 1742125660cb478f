"""``/v1/bulk/{action}`` and ``/v1/operations``: bulk operations (``domain/bulk.py``),
accepted at once (202) and carried out by the API nodes in the background
(``api/operations.py``)."""

from __future__ import annotations

import uuid
from typing import Any, Literal

from fastapi import APIRouter, Body, Depends, Path, Query, Request, Response, status
from pydantic import Field

from cronwheel.api.auth import TenantScope, actor_of, tenant_reader, tenant_writer
from cronwheel.api.inputs import parse_id
from cronwheel.api.jsonbody import StrictJsonRoute
from cronwheel.api.schemas import ERROR_RESPONSES, RequestModel, ResponseModel, UtcInstant
from cronwheel.api.state import api_state
from cronwheel.domain.bounds import Flag, Instant, Label, Name
from cronwheel.domain.bulk import SELECTED_IDS_MAX, Operation, Selector

__all__ = ["BulkRequest", "OperationList", "OperationOut", "SelectorIn", "router"]

router = APIRouter(tags=["bulk"], responses=ERROR_RESPONSES, route_class=StrictJsonRoute)

_Tags = list[Label]


class SelectorIn(RequestModel):
    """Every condition given must hold. `run_ids` and `states` select runs (cancel,
    redrive); the others select jobs, or for cancel and redrive the runs of the jobs
    they select."""

    job_ids: list[uuid.UUID] | None = Field(default=None, max_length=SELECTED_IDS_MAX)
    run_ids: list[uuid.UUID] | None = Field(default=None, max_length=SELECTED_IDS_MAX)
    tags_all: _Tags = Field(default_factory=list, max_length=20, description="every one")
    tags_any: _Tags = Field(default_factory=list, max_length=20, description="at least one")
    pool: Label | None = None
    name_prefix: Name | None = Field(default=None, description="the job's name starts with")
    states: list[Literal["SCHEDULED", "DISPATCHED", "RUNNING", "DEAD_LETTER"]] = Field(
        default_factory=list, description="run states (cancel: not finished; redrive: dead)"
    )
    due_after: Instant | None = Field(default=None, description="due at or after")
    due_before: Instant | None = Field(default=None, description="due before")


class BulkRequest(RequestModel):
    selector: SelectorIn = Field(default_factory=SelectorIn)
    all: Flag = Field(
        default=False,
        description="act on everything of the tenant: required for an empty selector",
    )
    reason: str | None = Field(
        default=None, max_length=1000, description="recorded in each change's history"
    )


class OperationOut(ResponseModel):
    id: uuid.UUID
    action: str
    state: str = Field(description="pending, running, done or failed")
    selector: dict[str, Any]
    reason: str | None
    actor: str
    matched: int = Field(description="rows selected so far (all of them once done)")
    changed: int = Field(description="rows the action changed")
    skipped: dict[str, int] = Field(description="rows selected and not changed, by why")
    details: dict[str, int] = Field(description="e.g. asked_to_stop: running runs asked to")
    accepted_at: UtcInstant
    started_at: UtcInstant | None
    finished_at: UtcInstant | None
    error: str | None = Field(
        description="why a failed operation stopped: a refusal (its code and message), or "
        "that an internal error stopped it (the details are in the server's log)"
    )


class OperationList(ResponseModel):
    items: list[OperationOut]
    next_cursor: str | None


def operation_out(op: Operation) -> OperationOut:
    return OperationOut(
        id=op.id,
        action=op.action,
        state=op.state.value,
        selector=op.selector,
        reason=op.reason,
        actor=op.actor,
        matched=op.matched,
        changed=op.changed,
        skipped=op.skipped,
        details=op.details,
        accepted_at=op.created_at,
        started_at=op.started_at,
        finished_at=op.finished_at,
        error=op.error,
    )


@router.post(
    "/v1/bulk/{action}",
    status_code=status.HTTP_202_ACCEPTED,
    summary="Act on every job or run a selector matches",
)
async def bulk(
    request: Request,
    response: Response,
    action: Literal["cancel", "pause", "resume", "redrive", "trigger"] = Path(),
    body: BulkRequest = Body(),
    scope: TenantScope = Depends(tenant_writer),
) -> OperationOut:
    """Accepted at once (202) and carried out in the background, the runs due soonest
    first: `cancel` (runs not finished: those not started are cancelled, running ones
    asked to stop), `redrive` (dead letters), `pause`, `resume`, `trigger` (jobs). Follow
    it at `GET /v1/operations/{id}` (the `Location`). The selection is what matches now;
    an empty selector is refused unless `"all": true`. Ids of runs or jobs that are not
    the tenant's are counted as `not found` and never touched. A tenant with
    `max_open_operations` (10) operations not yet ended is refused another: 429
    `limit_exceeded`."""
    s = body.selector
    selector = Selector(
        job_ids=None if s.job_ids is None else tuple(s.job_ids),
        run_ids=None if s.run_ids is None else tuple(s.run_ids),
        tags_all=tuple(s.tags_all),
        tags_any=tuple(s.tags_any),
        pool=s.pool,
        name_prefix=s.name_prefix,
        states=tuple(s.states),
        due_after=s.due_after,
        due_before=s.due_before,
        all=body.all,
    )
    state = api_state(request)
    op = await state.store.operations_create(
        scope.tenant_id,
        action=action,
        selector=selector,
        actor=actor_of(request, scope.principal),
        reason=body.reason,
        max_open=state.settings.max_open_operations,
    )
    state.operations.wake()
    response.headers["Location"] = f"/v1/operations/{op.id}"
    return operation_out(op)


@router.get("/v1/operations/{operation_id}", summary="Follow a bulk operation")
async def get_operation(
    operation_id: str, request: Request, scope: TenantScope = Depends(tenant_reader)
) -> OperationOut:
    op = await api_state(request).store.operations_get(
        scope.tenant_id, parse_id(operation_id, "operation")
    )
    return operation_out(op)


@router.get("/v1/operations", summary="List bulk operations")
async def list_operations(
    request: Request,
    scope: TenantScope = Depends(tenant_reader),
    cursor: str | None = Query(default=None, max_length=500),
    limit: int = Query(default=100, ge=1, le=500),
) -> OperationList:
    """Newest first."""
    page = await api_state(request).store.operations_list(
        scope.tenant_id, cursor=cursor, limit=limit
    )
    return OperationList(items=[operation_out(o) for o in page.items], next_cursor=page.next_cursor)

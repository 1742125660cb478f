"""``/v1/audit``: the audit trail (``domain/audit.py``), newest first."""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from pydantic import Field

from cronwheel.api.auth import tenant_or_every_reader
from cronwheel.api.jsonbody import StrictJsonRoute
from cronwheel.api.schemas import ERROR_RESPONSES, ResponseModel, UtcInstant
from cronwheel.api.state import api_state
from cronwheel.domain.audit import AuditRecord
from cronwheel.domain.bounds import Instant

__all__ = ["AuditList", "AuditOut", "router"]

router = APIRouter(
    prefix="/v1/audit", tags=["audit"], responses=ERROR_RESPONSES, route_class=StrictJsonRoute
)


class AuditOut(ResponseModel):
    id: int = Field(description="increasing: the order the changes committed in")
    at: UtcInstant
    tenant_id: uuid.UUID | None = Field(description="null: a change to no one tenant (a pool)")
    actor: str = Field(description="the key's id, or `admin` for the admin key")
    role: str | None = Field(description="the key's role")
    key_id: uuid.UUID | None = Field(description="null for the admin key of the settings")
    request_id: str | None = Field(description="the request's `X-Request-Id`")
    action: str = Field(description="what was done: `job.pause`, `run.cancel`, `key.revoke`, …")
    target_kind: str = Field(description="`job`, `run`, `tenant`, `key`, `pool`, …")
    target_id: str | None
    reason: str | None
    before: dict[str, Any] | None = Field(description="what changed, as it was")
    after: dict[str, Any] | None = Field(description="what changed, as it became")


class AuditList(ResponseModel):
    items: list[AuditOut]
    next_cursor: str | None


def audit_out(record: AuditRecord) -> AuditOut:
    return AuditOut(
        id=record.id,
        at=record.at,
        tenant_id=record.tenant_id,
        actor=record.actor,
        role=record.role,
        key_id=record.key_id,
        request_id=record.request_id,
        action=record.action,
        target_kind=record.target_kind,
        target_id=record.target_id,
        reason=record.reason,
        before=record.before,
        after=record.after,
    )


@router.get("", summary="Read the audit trail")
async def list_audit(
    request: Request,
    tenant_id: uuid.UUID | None = Depends(tenant_or_every_reader),
    actor: str | None = Query(default=None, max_length=200, description="a key's id, or admin"),
    action: str | None = Query(default=None, max_length=60, description="e.g. job.pause"),
    target_kind: str | None = Query(default=None, max_length=20, description="e.g. job"),
    target: str | None = Query(default=None, max_length=200, description="the target's id"),
    since: Instant | None = Query(default=None, description="made at or after"),
    until: Instant | None = Query(default=None, description="made before"),
    cursor: str | None = Query(default=None, max_length=500),
    limit: int = Query(default=100, ge=1, le=500),
) -> AuditList:
    """Every change made through the API — who (key, role, request), what (action,
    target, the before and after of what changed), when and why — newest first; pass
    `next_cursor` as `cursor` for the next page. A tenant's keys read their tenant's
    records; the admin key reads every record (one tenant's with `Cronwheel-Tenant`),
    the changes to no one tenant among them. Records leave only by retention
    (`CRONWHEEL_AUDIT_RETENTION_DAYS`)."""
    page = await api_state(request).store.audit_list(
        tenant_id,
        actor=actor,
        action=action,
        target_kind=target_kind,
        target_id=target,
        since=since,
        until=until,
        cursor=cursor,
        limit=limit,
    )
    return AuditList(items=[audit_out(r) for r in page.items], next_cursor=page.next_cursor)

"""Bodies of ``/v1/pools``: a pool's P0 share, its live capacity and its backlog. The
rules of the API's other bodies hold (``api/schemas.py``)."""

from __future__ import annotations

import uuid
from typing import Annotated

from pydantic import Field, Strict

from cronwheel.api.schemas import RequestModel, ResponseModel, UtcInstant
from cronwheel.domain.pools import Pool, PoolStatus, priority_class

__all__ = ["PoolBacklogOut", "PoolList", "PoolOut", "PoolUpdate", "pool_out"]

_Share = Annotated[float, Strict(), Field(ge=0, le=1, allow_inf_nan=False)]


class PoolUpdate(RequestModel):
    p0_reserved_share: _Share | None = Field(
        description="the share (0..1) of each live worker's slots that only P0 runs may "
        "take: a worker of capacity c keeps floor(share x c) of them; null: the server's "
        "default (setting `p0_reserved_share`)"
    )


class PoolBacklogOut(ResponseModel):
    tenant_id: uuid.UUID
    tenant: str = Field(description="the tenant's name")
    priority: int = Field(description="0 (P0, leased first) .. 3")
    priority_class: str = Field(description="P0 .. P3")
    ready: int = Field(description="runs in the ready queue: dispatched, not reserved")
    due: int = Field(description="runs due and not dispatched yet (SCHEDULED, fire time come)")


class PoolOut(ResponseModel):
    name: str
    p0_reserved_share: float | None = Field(
        description="the pool's own setting; null: the server's default"
    )
    effective_share: float = Field(description="the share in force")
    updated_at: UtcInstant | None = Field(
        default=None, description="when an admin last set the share (null: never)"
    )
    workers: int = Field(description="live workers (for a tenant: those serving it)")
    capacity: int = Field(description="their slots")
    busy: int = Field(
        description="slots held by running attempts and reservations (for a tenant: its own)"
    )
    free: int | None = Field(
        description="slots not held, per worker, summed; null for a tenant's key (it "
        "depends on other tenants' work)"
    )
    p0_reserved_slots: int = Field(description="slots of the live workers kept for P0 runs")
    ready: int = Field(description="the backlog's ready runs (for a tenant: its own)")
    due: int = Field(description="the backlog's due runs not dispatched yet")
    backlog: list[PoolBacklogOut] = Field(description="by priority, then tenant")


class PoolList(ResponseModel):
    items: list[PoolOut]


def pool_out(status: PoolStatus, settings: Pool | None = None) -> PoolOut:
    return PoolOut(
        name=status.name,
        p0_reserved_share=status.p0_reserved_share,
        effective_share=status.effective_share,
        updated_at=None if settings is None else settings.updated_at,
        workers=status.workers,
        capacity=status.capacity,
        busy=status.busy,
        free=status.free,
        p0_reserved_slots=status.p0_reserved_slots,
        ready=status.ready,
        due=status.due,
        backlog=[
            PoolBacklogOut(
                tenant_id=b.tenant_id,
                tenant=b.tenant_name,
                priority=b.priority,
                priority_class=priority_class(b.priority),
                ready=b.ready,
                due=b.due,
            )
            for b in status.backlog
        ],
    )

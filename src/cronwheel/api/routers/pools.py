"""Pools: what each pool's live workers can take and what waits for them (the admin
sees every pool and every tenant's backlog; a tenant's key the pools serving it and
its own backlog only), and the share of worker slots kept for P0 runs (admin only)."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request

from cronwheel.api.auth import Principal, actor_of, require_admin, tenant_or_every_reader
from cronwheel.api.jsonbody import StrictJsonRoute
from cronwheel.api.pool_schemas import PoolList, PoolOut, PoolUpdate, pool_out
from cronwheel.api.schemas import ERROR_RESPONSES
from cronwheel.api.state import ApiState, api_state
from cronwheel.domain.bounds import Label

__all__ = ["router"]

router = APIRouter(
    prefix="/v1/pools", tags=["pools"], responses=ERROR_RESPONSES, route_class=StrictJsonRoute
)

PoolName = Annotated[Label, Path(description="the pool's name")]


async def _one(state: ApiState, tenant_id: uuid.UUID | None, name: str) -> PoolOut:
    [status] = await state.store.pools_status(
        tenant_id,
        names=[name],
        default_share=state.settings.p0_reserved_share,
        worker_ttl=state.settings.worker_ttl,
    )
    return pool_out(status, await state.store.pools_get(name))


@router.get("", summary="List pools with their capacity and backlog")
async def list_pools(
    request: Request, tenant_id: uuid.UUID | None = Depends(tenant_or_every_reader)
) -> PoolList:
    """Every pool with a live worker or a backlog, by name: its live workers, their
    slots (busy, free, kept for P0) and the runs waiting — ready (the ready queue) and
    due but not dispatched — by priority and tenant. The admin key sees every tenant's
    (one tenant's with `Cronwheel-Tenant`); an operator or viewer key sees the workers
    serving its tenant (its own and the shared ones), counts only its own runs as busy,
    gets no `free` (it depends on other tenants' work) and sees only its own backlog."""
    state = api_state(request)
    statuses = await state.store.pools_status(
        tenant_id,
        default_share=state.settings.p0_reserved_share,
        worker_ttl=state.settings.worker_ttl,
    )
    return PoolList(items=[pool_out(s) for s in statuses])


@router.get("/{name}", summary="Read a pool")
async def get_pool(
    name: PoolName, request: Request, tenant_id: uuid.UUID | None = Depends(tenant_or_every_reader)
) -> PoolOut:
    """As one item of the list, for any pool name (one nothing uses shows zeros)."""
    return await _one(api_state(request), tenant_id, name)


@router.put("/{name}", summary="Set a pool's P0 share")
async def set_pool(
    name: PoolName,
    body: PoolUpdate,
    request: Request,
    principal: Principal = Depends(require_admin),
) -> PoolOut:
    """Admin only. Sets the share of each live worker's slots that only P0 runs may
    take (null: back to the server's default). Recorded as the event `pool.updated`
    (who, the share and the one before). Answers the pool as the admin sees it."""
    state = api_state(request)
    await state.store.pools_set(
        name, p0_reserved_share=body.p0_reserved_share, actor=actor_of(request, principal)
    )
    return await _one(state, None, name)

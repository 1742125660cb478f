"""The fleet pages: workers and pools (what each pool can take and what waits for
it), and for the admin the tenants with their limits, from which it picks the tenant
whose jobs and runs the other pages show."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Depends, Query, Request, Response

from cronwheel.api.routers import pools as pools_api
from cronwheel.api.routers import workers as workers_api
from cronwheel.api.state import api_state
from cronwheel.domain.errors import NotFoundError, PermissionDeniedError
from cronwheel.ui.render import UiRoute, page, redirect
from cronwheel.ui.sessions import Visit, checked_form, signed_in

__all__ = ["router"]

router = APIRouter(prefix="/ui", route_class=UiRoute, include_in_schema=False)

_PAGE = 100


def _fleet_tenant(visit: Visit) -> uuid.UUID | None:
    """Whose workers and pools: the admin sees every tenant's, a tenant key its own."""
    return None if visit.is_admin else visit.scope.tenant_id


@router.get("/workers")
async def workers_page(
    request: Request,
    visit: Visit = Depends(signed_in),
    cursor: str = Query(default="", max_length=500),
) -> Response:
    tenant_id = _fleet_tenant(visit)
    workers = await workers_api.list_workers(
        request=request, tenant_id=tenant_id, pool=None, cursor=cursor or None, limit=_PAGE
    )
    pools = await pools_api.list_pools(request=request, tenant_id=tenant_id)
    return page(
        "workers.html",
        visit,
        title="Workers and pools",
        section="workers",
        workers=workers.items,
        next_cursor=workers.next_cursor,
        paged=bool(cursor),
        pools=pools.items,
    )


@router.get("/tenants")
async def tenants_page(
    request: Request,
    visit: Visit = Depends(signed_in),
    cursor: str = Query(default="", max_length=500),
    notice: str = Query(default="", max_length=200),
) -> Response:
    if not visit.is_admin:
        raise PermissionDeniedError("the tenants page needs the admin key")
    found = await api_state(request).store.tenants_list(cursor=cursor or None, limit=_PAGE)
    return page(
        "tenants.html",
        visit,
        title="Tenants",
        section="tenants",
        notice=notice,
        tenants=found.items,
        next_cursor=found.next_cursor,
        paged=bool(cursor),
    )


@router.post("/tenants/choose")
async def choose_tenant(request: Request, visit: Visit = Depends(signed_in)) -> Response:
    """The admin looks at this tenant's jobs and runs from now on."""
    form = await checked_form(request, visit)
    if not visit.is_admin:
        raise PermissionDeniedError("only the admin key chooses a tenant")
    try:
        tenant_id = uuid.UUID(form.one("tenant"))
    except ValueError:
        raise NotFoundError(f"no tenant {form.one('tenant')!r}") from None
    store = api_state(request).store
    await store.tenants_get(tenant_id)  # 404 for an unknown one
    await store.ui_sessions_set_tenant(token_hash=visit.session.token_hash, tenant_id=tenant_id)
    return redirect("/ui/jobs")

"""Tenants and their API keys (admin only), deleting a tenant with everything it owns
(admin only), and each tenant's webhook secret (the admin, or the tenant's own operator
key)."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Depends, Query, Request, status

from cronwheel.api.auth import Principal, actor_of, authenticate, generate_key, require_admin
from cronwheel.api.inputs import FORCE_QUERY, REASON_QUERY, parse_id
from cronwheel.api.jsonbody import StrictJsonRoute
from cronwheel.api.routers.logs import delete_logs
from cronwheel.api.schemas import (
    ERROR_RESPONSES,
    ErrorResponse,
    KeyCreate,
    KeyCreated,
    KeyList,
    KeyOut,
    TenantCreate,
    TenantCreated,
    TenantDeletedOut,
    TenantList,
    TenantOut,
    TenantUpdate,
    WebhookSecretOut,
)
from cronwheel.api.state import api_state
from cronwheel.domain.errors import NotFoundError, PermissionDeniedError
from cronwheel.domain.model import ApiKey, Tenant
from cronwheel.domain.spec import TenantLimits

__all__ = ["router"]

router = APIRouter(
    prefix="/v1/tenants", tags=["tenants"], responses=ERROR_RESPONSES, route_class=StrictJsonRoute
)


def tenant_out(tenant: Tenant) -> TenantOut:
    return TenantOut(
        id=tenant.id, name=tenant.name, limits=tenant.limits, created_at=tenant.created_at
    )


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    summary="Create a tenant",
    responses={409: {"model": ErrorResponse, "description": "A tenant of that name exists"}},
)
async def create_tenant(
    body: TenantCreate, request: Request, principal: Principal = Depends(require_admin)
) -> TenantCreated:
    """Creates the tenant and an operator key for it; the key is shown only here."""
    store = api_state(request).store
    limits = (body.limits or TenantLimits()).model_dump(mode="json")
    actor = actor_of(request, principal)
    tenant = await store.tenants_create(name=body.name, limits=limits, actor=actor)
    key, key_hash, prefix = generate_key()
    record = await store.api_keys_create(
        tenant.id, role="operator", key_hash=key_hash, prefix=prefix, actor=actor
    )
    return TenantCreated(
        id=tenant.id,
        name=tenant.name,
        limits=tenant.limits,
        created_at=tenant.created_at,
        api_key=key,
        key_id=record.id,
        key_prefix=record.prefix,
    )


@router.get("", summary="List tenants")
async def list_tenants(
    request: Request,
    cursor: str | None = Query(default=None, max_length=500),
    limit: int = Query(default=100, ge=1, le=500),
    principal: Principal = Depends(require_admin),
) -> TenantList:
    page = await api_state(request).store.tenants_list(cursor=cursor, limit=limit)
    return TenantList(items=[tenant_out(t) for t in page.items], next_cursor=page.next_cursor)


@router.get("/{tenant_id}", summary="Read a tenant")
async def get_tenant(
    tenant_id: str, request: Request, principal: Principal = Depends(require_admin)
) -> TenantOut:
    tenant = await api_state(request).store.tenants_get(parse_id(tenant_id, "tenant"))
    return tenant_out(tenant)


@router.patch("/{tenant_id}", summary="Change a tenant's limits")
async def update_tenant(
    tenant_id: str,
    body: TenantUpdate,
    request: Request,
    principal: Principal = Depends(require_admin),
) -> TenantOut:
    """Only the limits named in the body change (null clears one); the others keep
    their values. A bad value is 422 and changes nothing. The limits apply on this API
    node at once and on every other within 5 seconds (docs/limits.md)."""
    store = api_state(request).store
    tid = parse_id(tenant_id, "tenant")
    current = await store.tenants_get(tid)
    known = {k: v for k, v in current.limits.items() if k in TenantLimits.model_fields}
    merged = TenantLimits.model_validate({**known, **body.limits.model_dump(exclude_unset=True)})
    tenant = await store.tenants_update(
        tid, limits=merged.model_dump(mode="json"), actor=actor_of(request, principal)
    )
    # This node at once; the others within key_rates.LIMITS_TTL.
    api_state(request).key_rates.forget_tenant(tid)
    return tenant_out(tenant)


@router.delete(
    "/{tenant_id}",
    summary="Delete a tenant",
    responses={
        409: {
            "model": ErrorResponse,
            "description": "The tenant has jobs not over or runs in progress (`in_use`; the "
            "error names them): cancel them first, or pass force=true",
        }
    },
)
async def delete_tenant(
    tenant_id: str,
    request: Request,
    principal: Principal = Depends(require_admin),
    force: bool = FORCE_QUERY,
    reason: str | None = REASON_QUERY,
) -> TenantDeletedOut:
    """Deletes the tenant with its API keys (refused at once on this API node, within
    a few seconds on the others), workers, jobs, runs, their attempts, events and
    worker logs. Refused (409 `in_use`) while a job of it is active or paused or a run
    is DISPATCHED or RUNNING, unless `force=true`. The deletion is recorded (event
    `tenant.deleted`: who, when, why, what it removed) and outlives the tenant, with
    the tenant's other events not tied to a run."""
    state = api_state(request)
    tid = parse_id(tenant_id, "tenant")
    deleted = await state.store.tenants_delete(
        tid, force=force, actor=actor_of(request, principal), reason=reason
    )
    state.key_cache.forget_tenant(tid)
    state.key_rates.forget_tenant(tid)
    await delete_logs(request, tid, None)
    return TenantDeletedOut(
        id=deleted.id,
        name=deleted.name,
        deleted_at=deleted.at,
        jobs_deleted=deleted.jobs,
        runs_deleted=deleted.runs,
        runs_stopped=len(deleted.stopped),
        api_keys_deleted=deleted.api_keys,
        workers_deleted=deleted.workers,
    )


@router.post("/{tenant_id}/keys", status_code=status.HTTP_201_CREATED, summary="Create an API key")
async def create_key(
    tenant_id: str,
    body: KeyCreate,
    request: Request,
    principal: Principal = Depends(require_admin),
) -> KeyCreated:
    """A new key of ``role`` for the tenant; the key is shown only in this answer."""
    store = api_state(request).store
    tenant = await store.tenants_get(parse_id(tenant_id, "tenant"))
    key, key_hash, prefix = generate_key()
    record = await store.api_keys_create(
        tenant.id,
        role=body.role,
        key_hash=key_hash,
        prefix=prefix,
        actor=actor_of(request, principal),
    )
    return KeyCreated(
        id=record.id,
        tenant_id=tenant.id,
        role=record.role,
        prefix=record.prefix,
        api_key=key,
        created_at=record.created_at,
    )


def key_out(key: ApiKey, tenant_id: uuid.UUID) -> KeyOut:
    return KeyOut(
        id=key.id,
        tenant_id=tenant_id,
        role=key.role,
        prefix=key.prefix,
        created_at=key.created_at,
        revoked_at=key.revoked_at,
    )


@router.get("/{tenant_id}/keys", summary="List a tenant's API keys")
async def list_keys(
    tenant_id: str,
    request: Request,
    cursor: str | None = Query(default=None, max_length=100),
    limit: int = Query(default=100, ge=1, le=500),
    principal: Principal = Depends(require_admin),
) -> KeyList:
    """Every key of the tenant, revoked ones too, oldest first: id, role, prefix and
    when it was made and revoked — never the key or its hash."""
    store = api_state(request).store
    tenant = await store.tenants_get(parse_id(tenant_id, "tenant"))
    page = await store.api_keys_list(tenant.id, cursor=cursor, limit=limit)
    return KeyList(items=[key_out(k, tenant.id) for k in page.items], next_cursor=page.next_cursor)


@router.delete("/{tenant_id}/keys/{key_id}", summary="Revoke an API key")
async def revoke_key(
    tenant_id: str,
    key_id: str,
    request: Request,
    reason: str | None = Query(
        default=None,
        max_length=1000,
        pattern=r"^[^\x00]*$",  # no database keeps a NUL in text
        description="why; recorded in the audit trail",
    ),
    principal: Principal = Depends(require_admin),
) -> KeyOut:
    """The key authenticates nothing from now on, on every API node at once. Answers
    the key's record (``revoked_at`` set); revoking a revoked key changes nothing. The
    audit trail records who revoked it and why (event ``api_key.revoked``). Another
    tenant's key answers 404 like an unknown one."""
    state = api_state(request)
    tid = parse_id(tenant_id, "tenant")
    kid = parse_id(key_id, "API key")
    await state.store.tenants_get(tid)  # unknown: 404
    key = await state.store.api_keys_revoke(
        tid, kid, actor=actor_of(request, principal), reason=reason
    )
    # This node at once; the others when the revocation's notice reaches them.
    state.key_cache.forget(key.id)
    return key_out(key, tid)


# -- the webhook secret ----------------------------------------------------------------


async def _secret_keeper(request: Request, principal: Principal, raw_id: str) -> uuid.UUID:
    """The tenant whose webhook secret ``principal`` may read and rotate: any with the
    admin key; its own with an operator key (the most a tenant key may). Another
    tenant's id answers 404 like an unknown one; a viewer or worker key of the tenant
    403."""
    tenant_id = parse_id(raw_id, "tenant")
    if not principal.is_admin:
        if principal.tenant_id != tenant_id:
            raise NotFoundError(f"no tenant {tenant_id}")
        if principal.role != "operator":
            raise PermissionDeniedError(
                f"a {principal.role} key may not see the webhook secret: use an operator key"
            )
    await api_state(request).store.tenants_get(tenant_id)  # unknown: 404
    return tenant_id


@router.get("/{tenant_id}/webhook-secret", summary="Read the tenant's webhook secret")
async def get_webhook_secret(
    tenant_id: str, request: Request, principal: Principal = Depends(authenticate)
) -> WebhookSecretOut:
    """The key with which the webhook worker signs this tenant's requests, for its
    receivers to verify them. The admin key, or the tenant's own operator key."""
    tid = await _secret_keeper(request, principal, tenant_id)
    secret = await api_state(request).store.tenants_webhook_secret(tid)
    return WebhookSecretOut(tenant_id=tid, webhook_secret=secret)


@router.post("/{tenant_id}/webhook-secret/rotate", summary="Rotate the tenant's webhook secret")
async def rotate_webhook_secret(
    tenant_id: str, request: Request, principal: Principal = Depends(authenticate)
) -> WebhookSecretOut:
    """A new random secret replaces the old one at once: requests signed from now on use
    it (one already under way may still carry the old signature). Recorded in the audit
    trail. The admin key, or the tenant's own operator key."""
    tid = await _secret_keeper(request, principal, tenant_id)
    secret = await api_state(request).store.tenants_webhook_secret_rotate(
        tid, actor=actor_of(request, principal)
    )
    return WebhookSecretOut(tenant_id=tid, webhook_secret=secret)

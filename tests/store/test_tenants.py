"""Tenants and API keys."""

from __future__ import annotations

import uuid

import pytest

from cronwheel.domain.audit import Actor
from cronwheel.domain.errors import ConflictError, NotFoundError, ValidationError
from cronwheel.store import Store
from cronwheel.store.schema import api_keys

from .helpers import T0, at, engine_of, make_tenant


async def test_tenant_create_get_and_duplicate_name(store: Store) -> None:
    tenant = await store.tenants_create(
        name="acme", limits={"max_concurrent_runs": 5}, actor=Actor("admin"), now=T0
    )
    assert tenant.name == "acme"
    assert tenant.limits == {"max_concurrent_runs": 5}
    assert tenant.created_at == T0
    assert await store.tenants_get(tenant.id) == tenant
    assert await store.tenants_get_by_name(name="acme") == tenant

    with pytest.raises(ConflictError):
        await store.tenants_create(name="acme", limits={}, now=at(1))

    assert [t.id for t in (await store.tenants_list()).items] == [tenant.id]
    history = (await store.events_list(None)).items
    assert [(e.kind, e.tenant_id, e.actor) for e in history] == [
        ("tenant.created", tenant.id, "admin")
    ]

    missing = uuid.uuid4()
    with pytest.raises(NotFoundError):
        await store.tenants_get(missing)
    with pytest.raises(NotFoundError):
        await store.tenants_get_by_name(name="absent")
    with pytest.raises(NotFoundError):
        await store.tenants_update(missing, limits={"weight": 2.0}, now=T0)
    with pytest.raises(NotFoundError):
        await store.tenants_webhook_secret(missing)


async def test_tenants_list_pages_without_gaps_or_duplicates(store: Store) -> None:
    created = {(await make_tenant(store)).id for _ in range(5)}
    seen: list[uuid.UUID] = []
    cursor: str | None = None
    pages = 0
    while True:
        page = await store.tenants_list(cursor=cursor, limit=2)
        assert len(page.items) <= 2
        seen += [t.id for t in page.items]
        pages += 1
        cursor = page.next_cursor
        if cursor is None:
            break
    assert pages == 3
    assert len(seen) == len(set(seen)) == 5
    assert set(seen) == created
    with pytest.raises(ValidationError):
        await store.tenants_list(cursor="not-a-cursor")


async def test_tenants_update_limits_and_webhook_secret(store: Store) -> None:
    tenant = await make_tenant(store, weight=1.0)
    updated = await store.tenants_update(
        tenant.id, limits={"max_concurrent_runs": 3, "weight": 2.0}, actor=Actor("ops"), now=at(5)
    )
    assert updated.id == tenant.id
    assert updated.limits == {"max_concurrent_runs": 3, "weight": 2.0}
    assert await store.tenants_get(tenant.id) == updated
    kinds = [(e.kind, e.actor) for e in (await store.events_list(tenant.id)).items]
    assert kinds == [("tenant.created", None), ("tenant.updated", "ops")]

    # Each tenant has its own webhook signing secret, stable across reads.
    other = await make_tenant(store)
    secret = await store.tenants_webhook_secret(tenant.id)
    assert len(secret) >= 32
    assert await store.tenants_webhook_secret(tenant.id) == secret
    assert await store.tenants_webhook_secret(other.id) != secret


async def test_api_keys_by_hash(store: Store) -> None:
    tenant = await make_tenant(store)
    key = await store.api_keys_create(
        tenant.id, role="operator", key_hash="a" * 64, prefix="cw_aaaa", now=T0
    )
    assert (key.tenant_id, key.role, key.prefix, key.created_at) == (
        tenant.id,
        "operator",
        "cw_aaaa",
        T0,
    )
    found = await store.api_keys_get_by_hash(key_hash="a" * 64)
    assert found is not None
    assert (found.id, found.tenant_id, found.role, found.revoked_at) == (
        key.id,
        tenant.id,
        "operator",
        None,
    )
    assert await store.api_keys_get_by_hash(key_hash="b" * 64) is None

    # Tenant-less keys exist only for admins and shared workers.
    admin = await store.api_keys_create(None, role="admin", key_hash="c" * 64, prefix="cw_c")
    shared = await store.api_keys_create(None, role="worker", key_hash="d" * 64, prefix="cw_d")
    assert admin.tenant_id is None
    assert shared.tenant_id is None
    for role, key_hash in (("operator", "e" * 64), ("viewer", "f" * 64)):
        with pytest.raises(ValidationError):
            await store.api_keys_create(None, role=role, key_hash=key_hash, prefix="cw_x")
        assert await store.api_keys_get_by_hash(key_hash=key_hash) is None
    with pytest.raises(ValidationError):
        await store.api_keys_create(tenant.id, role="root", key_hash="1" * 64, prefix="cw_1")
    with pytest.raises(NotFoundError):
        await store.api_keys_create(uuid.uuid4(), role="viewer", key_hash="2" * 64, prefix="cw_2")
    assert await store.api_keys_get_by_hash(key_hash="2" * 64) is None

    # The interface has no way to revoke a key yet; set the column directly.
    async with engine_of(store).begin() as conn:
        await conn.execute(api_keys.update().where(api_keys.c.id == key.id).values(revoked_at=T0))
    assert await store.api_keys_get_by_hash(key_hash="a" * 64) is None

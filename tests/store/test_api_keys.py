"""API keys beyond their creation: the bootstrap admin key made once however many
processes ask at once, listing a tenant's keys, and revoking one (audited, announced)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from cronwheel.domain.audit import Actor
from cronwheel.domain.errors import NotFoundError, ValidationError
from cronwheel.store import CHANNEL_KEYS_REVOKED, Store, create_store
from cronwheel.store.notices import parse_key_revoked

from .helpers import T0, at, make_tenant


async def test_the_bootstrap_admin_key_is_made_once_by_racing_processes(store_url: str) -> None:
    stores = [create_store(store_url) for _ in range(4)]
    for s in stores:
        await s.open()
    try:
        answers = await asyncio.gather(
            *(
                s.api_keys_bootstrap(key_hash=f"{n}" * 64, prefix=f"cw_{n}", now=T0)
                for n, s in enumerate(stores)
            )
        )
    finally:
        for s in stores:
            await s.close()
    assert sorted(created for _key, created in answers) == [False, False, False, True]
    [made] = [key for key, created in answers if created]
    assert {key.id for key, _created in answers} == {made.id}  # every process found it
    assert (made.role, made.tenant_id, made.revoked_at) == ("admin", None, None)
    winner = next(n for n, (_key, created) in enumerate(answers) if created)

    store = create_store(store_url)
    await store.open()
    try:
        found = await store.api_keys_get_by_hash(key_hash=f"{winner}" * 64)
        assert found is not None and found.id == made.id and found.role == "admin"
        for loser in set(range(4)) - {winner}:  # the others' candidates were never stored
            assert await store.api_keys_get_by_hash(key_hash=f"{loser}" * 64) is None
        again, created = await store.api_keys_bootstrap(key_hash="9" * 64, prefix="cw_9")
        assert (again.id, created) == (made.id, False)
        events = [e for e in (await store.events_list(None)).items if e.kind == "api_key.created"]
        assert [(e.tenant_id, e.actor, e.data) for e in events] == [
            (None, "bootstrap", {"key_id": str(made.id), "role": "admin", "prefix": made.prefix})
        ]
    finally:
        await store.close()


async def test_a_tenants_keys_are_listed_oldest_first(store: Store) -> None:
    tenant, other = await make_tenant(store), await make_tenant(store)
    made = [
        await store.api_keys_create(
            tenant.id, role=role, key_hash=f"{n:x}" * 64, prefix=f"cw_{n}", now=at(n)
        )
        for n, role in enumerate(["operator", "viewer", "worker"])
    ]
    await store.api_keys_create(other.id, role="operator", key_hash="f" * 64, prefix="cw_f")
    first = await store.api_keys_list(tenant.id, limit=2)
    assert [k.id for k in first.items] == [k.id for k in made[:2]]
    assert first.next_cursor is not None
    rest = await store.api_keys_list(tenant.id, cursor=first.next_cursor)
    assert [k.id for k in rest.items] == [made[2].id] and rest.next_cursor is None
    assert [k.role for k in first.items + rest.items] == ["operator", "viewer", "worker"]
    assert (await store.api_keys_list(uuid.uuid4())).items == []
    with pytest.raises(ValidationError):
        await store.api_keys_list(tenant.id, cursor="not-a-cursor")


async def test_revoking_a_key_is_audited_and_announced(store: Store) -> None:
    tenant, other = await make_tenant(store), await make_tenant(store)
    key = await store.api_keys_create(
        tenant.id, role="worker", key_hash="a" * 64, prefix="cw_a", now=T0
    )
    sub = store.subscribe(CHANNEL_KEYS_REVOKED)
    try:
        # Another tenant's id, or an unknown key, is not found, and nothing changes.
        for tenant_id, key_id in ((other.id, key.id), (tenant.id, uuid.uuid4())):
            with pytest.raises(NotFoundError):
                await store.api_keys_revoke(tenant_id, key_id, actor=Actor("admin"), now=at(1))
        assert await store.api_keys_get_by_hash(key_hash="a" * 64) is not None

        revoked = await store.api_keys_revoke(
            tenant.id, key.id, actor=Actor("admin"), reason="leaked", now=at(2)
        )
        assert (revoked.id, revoked.revoked_at) == (key.id, at(2))
        assert await store.api_keys_get_by_hash(key_hash="a" * 64) is None
        [listed] = (await store.api_keys_list(tenant.id)).items
        assert listed.revoked_at == at(2)
        # Every API process hears of it (LISTEN/NOTIFY on PostgreSQL, in process on
        # SQLite). A notice sent before the listener is up is lost, as hints may be.
        if store.dialect == "sqlite":
            assert [parse_key_revoked(p) for p in await sub.wait(5.0)] == [key.id]
        # Revoking it again changes nothing.
        again = await store.api_keys_revoke(tenant.id, key.id, actor=Actor("admin"), now=at(3))
        assert again.revoked_at == at(2)
    finally:
        sub.close()
    history = [
        (e.kind, e.actor, e.reason, e.data)
        for e in (await store.events_list(tenant.id)).items
        if e.kind.startswith("api_key.")
    ]
    data = {"key_id": str(key.id), "role": "worker", "prefix": "cw_a"}
    assert history == [
        ("api_key.created", None, None, data),
        ("api_key.revoked", "admin", "leaked", data),
    ]


async def test_revocations_reach_other_processes(store_url: str) -> None:
    """The notice of a revocation made by one process reaches another's subscription
    (PostgreSQL: LISTEN/NOTIFY; SQLite has one process, where it is delivered at once)."""
    writer, listener = create_store(store_url), create_store(store_url)
    await writer.open()
    await listener.open()
    try:
        tenant = await make_tenant(writer)
        sub = listener.subscribe(CHANNEL_KEYS_REVOKED)
        if writer.dialect == "sqlite":
            sub.close()
            sub = writer.subscribe(CHANNEL_KEYS_REVOKED)
        heard: set[uuid.UUID] = set()
        made: list[uuid.UUID] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 15
        try:
            # Until the listener's connection is up, notices are rightly lost: revoke
            # one key after another until one is heard.
            while not heard and loop.time() < deadline:
                key = await writer.api_keys_create(
                    tenant.id, role="viewer", key_hash=uuid.uuid4().hex * 2, prefix="cw_v"
                )
                made.append(key.id)
                await writer.api_keys_revoke(tenant.id, key.id, actor=Actor("admin"))
                heard |= {parse_key_revoked(p) for p in await sub.wait(0.5)}
        finally:
            sub.close()
        assert heard and heard <= set(made)
    finally:
        await writer.close()
        await listener.close()


async def test_a_deleted_tenants_keys_are_announced_as_revoked(store: Store) -> None:
    tenant, other = await make_tenant(store), await make_tenant(store)
    keys = [
        await store.api_keys_create(tenant.id, role=role, key_hash=c * 64, prefix=f"cw_{c}", now=T0)
        for c, role in (("b", "worker"), ("c", "viewer"))
    ]
    theirs = await store.api_keys_create(
        other.id, role="worker", key_hash="d" * 64, prefix="cw_d", now=T0
    )
    sub = store.subscribe(CHANNEL_KEYS_REVOKED)
    try:
        deleted = await store.tenants_delete(tenant.id, actor=Actor("admin"), now=at(1))
        assert deleted.api_keys == 2
        # Every API process forgets them at once, as it does a revoked key (the notice
        # is heard in process on SQLite; across processes on PostgreSQL, see above).
        if store.dialect == "sqlite":
            heard = {parse_key_revoked(p) for p in await sub.wait(5.0)}
            assert heard == {k.id for k in keys}
    finally:
        sub.close()
    for c in "bc":
        assert await store.api_keys_get_by_hash(key_hash=c * 64) is None
    assert await store.api_keys_get_by_hash(key_hash="d" * 64) == theirs

"""Tenants and their API keys."""

from __future__ import annotations

import secrets
import uuid
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from cronwheel.domain.audit import Actor, changed, name_of
from cronwheel.domain.errors import ConflictError, ValidationError
from cronwheel.domain.model import ApiKey, Page, Tenant
from cronwheel.ids import new_id
from cronwheel.store.notices import CHANNEL_KEYS_REVOKED, key_revoked
from cronwheel.store.rows import event_row, tenant_from, uuid_cursor
from cronwheel.store.schema import api_keys, tenants
from cronwheel.store.sql.core import SqlCore

__all__ = ["TenantsMixin"]


class TenantsMixin(SqlCore):
    # -- tenants -------------------------------------------------------------------

    async def tenants_create(
        self,
        *,
        name: str,
        limits: dict[str, Any],
        actor: Actor | None = None,
        now: datetime | None = None,
    ) -> Tenant:
        try:
            async with self._write() as conn:
                at = await self._now(conn, now)
                row = (
                    await conn.execute(
                        tenants.insert()
                        .values(
                            id=new_id(),
                            name=name,
                            limits=limits,
                            created_at=at,
                            webhook_secret=secrets.token_urlsafe(32),
                        )
                        .returning(*tenants.c)
                    )
                ).one()
                await self._insert_events(
                    conn,
                    [
                        event_row(
                            at=at,
                            kind="tenant.created",
                            tenant_id=row.id,
                            actor=name_of(actor),
                            data={"name": name},
                        )
                    ],
                )
                await self._audit(
                    conn,
                    actor,
                    at=at,
                    tenant_id=row.id,
                    action="tenant.create",
                    target_kind="tenant",
                    target_id=row.id,
                    after={"name": name, "limits": limits},
                )
        except IntegrityError:
            raise ConflictError(f"a tenant named {name!r} exists", field="name") from None
        return tenant_from(row)

    async def tenants_get(self, tenant_id: uuid.UUID) -> Tenant:
        async with self._read() as conn:
            row = (await conn.execute(tenants.select().where(tenants.c.id == tenant_id))).first()
        if row is None:
            raise self._not_found("tenant", tenant_id)
        return tenant_from(row)

    async def tenants_get_by_name(self, *, name: str) -> Tenant:
        async with self._read() as conn:
            row = (await conn.execute(tenants.select().where(tenants.c.name == name))).first()
        if row is None:
            raise self._not_found("tenant", name)
        return tenant_from(row)

    async def tenants_list(self, *, cursor: str | None = None, limit: int = 100) -> Page[Tenant]:
        after = uuid_cursor(cursor)
        stmt = tenants.select().order_by(tenants.c.id).limit(limit + 1)
        if after is not None:
            stmt = stmt.where(tenants.c.id > after)
        async with self._read() as conn:
            rows = (await conn.execute(stmt)).all()
        items = [tenant_from(r) for r in rows[:limit]]
        return Page(items, str(items[-1].id) if len(rows) > limit else None)

    async def tenants_update(
        self,
        tenant_id: uuid.UUID,
        *,
        limits: dict[str, Any],
        actor: Actor | None = None,
        now: datetime | None = None,
    ) -> Tenant:
        async with self._write() as conn:
            at = await self._now(conn, now)
            old = (
                await conn.execute(
                    sa.select(tenants.c.limits).where(tenants.c.id == tenant_id).with_for_update()
                )
            ).first()
            if old is None:
                raise self._not_found("tenant", tenant_id)
            row = (
                await conn.execute(
                    tenants.update()
                    .where(tenants.c.id == tenant_id)
                    .values(limits=limits)
                    .returning(*tenants.c)
                )
            ).one()
            await self._insert_events(
                conn,
                [
                    event_row(
                        at=at,
                        kind="tenant.updated",
                        tenant_id=tenant_id,
                        actor=name_of(actor),
                        data={"limits": limits},
                    )
                ],
            )
            before, after = changed(dict(old.limits), limits)
            await self._audit(
                conn,
                actor,
                at=at,
                tenant_id=tenant_id,
                action="tenant.update",
                target_kind="tenant",
                target_id=tenant_id,
                before={"limits": before},
                after={"limits": after},
            )
        return tenant_from(row)

    async def tenants_webhook_secret(self, tenant_id: uuid.UUID) -> str:
        async with self._read() as conn:
            secret = (
                await conn.execute(
                    sa.select(tenants.c.webhook_secret).where(tenants.c.id == tenant_id)
                )
            ).scalar()
        if secret is None:
            raise self._not_found("tenant", tenant_id)
        return str(secret)

    async def tenants_webhook_secret_rotate(
        self, tenant_id: uuid.UUID, *, actor: Actor | None = None, now: datetime | None = None
    ) -> str:
        secret = secrets.token_urlsafe(32)
        async with self._write() as conn:
            at = await self._now(conn, now)
            row = (
                await conn.execute(
                    tenants.update()
                    .where(tenants.c.id == tenant_id)
                    .values(webhook_secret=secret)
                    .returning(tenants.c.id)
                )
            ).first()
            if row is None:
                raise self._not_found("tenant", tenant_id)
            await self._insert_events(
                conn,
                [
                    event_row(
                        at=at,
                        kind="tenant.webhook_secret_rotated",
                        tenant_id=tenant_id,
                        actor=name_of(actor),
                    )
                ],
            )
            # The secrets themselves are never recorded.
            await self._audit(
                conn,
                actor,
                at=at,
                tenant_id=tenant_id,
                action="tenant.rotate_webhook_secret",
                target_kind="tenant",
                target_id=tenant_id,
            )
        return secret

    # -- keys ----------------------------------------------------------------------

    async def api_keys_create(
        self,
        tenant_id: uuid.UUID | None,
        *,
        role: str,
        key_hash: str,
        prefix: str,
        actor: Actor | None = None,
        now: datetime | None = None,
    ) -> ApiKey:
        if role not in ("admin", "operator", "viewer", "worker"):
            raise ValidationError(f"unknown role {role!r}", field="role")
        if tenant_id is None and role not in ("admin", "worker"):
            raise ValidationError(f"a {role} key needs a tenant", field="role")
        async with self._write() as conn:
            at = await self._now(conn, now)
            if tenant_id is not None:
                await self._require_tenant(conn, tenant_id)
            row = (
                await conn.execute(
                    api_keys.insert()
                    .values(
                        id=new_id(),
                        tenant_id=tenant_id,
                        role=role,
                        key_hash=key_hash,
                        prefix=prefix,
                        created_at=at,
                    )
                    .returning(*api_keys.c)
                )
            ).one()
            await self._insert_events(
                conn,
                [
                    event_row(
                        at=at,
                        kind="api_key.created",
                        tenant_id=tenant_id,
                        actor=name_of(actor),
                        data={"key_id": str(row.id), "role": role, "prefix": prefix},
                    )
                ],
            )
            await self._audit(
                conn,
                actor,
                at=at,
                tenant_id=tenant_id,
                action="key.create",
                target_kind="key",
                target_id=row.id,
                after={"role": role, "prefix": prefix},
            )
        return _key_from(row)

    async def api_keys_get_by_hash(self, *, key_hash: str) -> ApiKey | None:
        async with self._read() as conn:
            row = (
                await conn.execute(
                    api_keys.select().where(
                        api_keys.c.key_hash == key_hash, api_keys.c.revoked_at.is_(None)
                    )
                )
            ).first()
        return None if row is None else _key_from(row)

    async def api_keys_bootstrap(
        self, *, key_hash: str, prefix: str, now: datetime | None = None
    ) -> tuple[ApiKey, bool]:
        # One row may be the bootstrap key (a unique partial index): of nodes inserting
        # at once, one inserts and the others wait for its commit, then insert nothing.
        async with self._write() as conn:
            at = await self._now(conn, now)
            row = {
                "id": new_id(),
                "tenant_id": None,
                "role": "admin",
                "key_hash": key_hash,
                "prefix": prefix,
                "created_at": at,
                "bootstrap": True,
            }
            created = (
                await conn.execute(
                    self.driver.insert_ignore(api_keys, [row]).returning(*api_keys.c)
                )
            ).first()
            if created is None:
                existing = (
                    await conn.execute(api_keys.select().where(api_keys.c.bootstrap.is_(True)))
                ).one()
                return _key_from(existing), False
            await self._insert_events(
                conn,
                [
                    event_row(
                        at=at,
                        kind="api_key.created",
                        tenant_id=None,
                        actor="bootstrap",
                        data={"key_id": str(created.id), "role": "admin", "prefix": prefix},
                    )
                ],
            )
        return _key_from(created), True

    async def api_keys_list(
        self, tenant_id: uuid.UUID, *, cursor: str | None = None, limit: int = 100
    ) -> Page[ApiKey]:
        after = uuid_cursor(cursor)
        stmt = (
            api_keys.select()
            .where(api_keys.c.tenant_id == tenant_id)
            .order_by(api_keys.c.id)
            .limit(limit + 1)
        )
        if after is not None:
            stmt = stmt.where(api_keys.c.id > after)
        async with self._read() as conn:
            rows = (await conn.execute(stmt)).all()
        items = [_key_from(r) for r in rows[:limit]]
        return Page(items, str(items[-1].id) if len(rows) > limit else None)

    async def api_keys_revoke(
        self,
        tenant_id: uuid.UUID,
        key_id: uuid.UUID,
        *,
        actor: Actor | None = None,
        reason: str | None = None,
        now: datetime | None = None,
    ) -> ApiKey:
        mine = sa.and_(api_keys.c.id == key_id, api_keys.c.tenant_id == tenant_id)
        async with self._write() as conn:
            at = await self._now(conn, now)
            row = (
                await conn.execute(
                    api_keys.update()
                    .where(mine, api_keys.c.revoked_at.is_(None))
                    .values(revoked_at=at)
                    .returning(*api_keys.c)
                )
            ).first()
            if row is None:  # unknown, another tenant's, or revoked already
                existing = (await conn.execute(api_keys.select().where(mine))).first()
                if existing is None:
                    raise self._not_found("api_key", key_id)
                return _key_from(existing)
            await self._insert_events(
                conn,
                [
                    event_row(
                        at=at,
                        kind="api_key.revoked",
                        tenant_id=tenant_id,
                        actor=name_of(actor),
                        reason=reason,
                        data={"key_id": str(row.id), "role": row.role, "prefix": row.prefix},
                    )
                ],
            )
            await self._audit(
                conn,
                actor,
                at=at,
                tenant_id=tenant_id,
                action="key.revoke",
                target_kind="key",
                target_id=row.id,
                reason=reason,
                before={"revoked_at": None},
                after={"revoked_at": at},
            )
            await self._notify(conn, CHANNEL_KEYS_REVOKED, [key_revoked(row.id)])
        return _key_from(row)


def _key_from(row: Any) -> ApiKey:
    return ApiKey(
        id=row.id,
        tenant_id=row.tenant_id,
        role=row.role,
        prefix=row.prefix,
        created_at=row.created_at,
        revoked_at=row.revoked_at,
    )

"""Dashboard sessions: one row per signed-in browser, by the hash of its token.

A session's look-up is one read by primary key; the dashboard moves its expiry forward
only when its last use is a minute old, so a page view does not cost a write. Expired rows are
purged when someone signs in, by the expiry index, a bounded batch at a time.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

import sqlalchemy as sa

from cronwheel.store.schema import ui_sessions
from cronwheel.store.sql.core import SqlCore
from cronwheel.store.values import UiSession

__all__ = ["PURGE_BATCH", "UiSessionsMixin"]

# Expired sessions deleted at most per sign-in.
PURGE_BATCH = 1000


def _session_from(row: sa.Row[tuple[object, ...]]) -> UiSession:
    return UiSession(
        token_hash=row.token_hash,
        key_hash=row.key_hash,
        tenant_id=row.tenant_id,
        created_at=row.created_at,
        last_seen_at=row.last_seen_at,
        expires_at=row.expires_at,
    )


class UiSessionsMixin(SqlCore):
    async def ui_sessions_create(
        self,
        *,
        token_hash: str,
        key_hash: str,
        tenant_id: uuid.UUID | None,
        idle: float,
        lifetime: float,
        now: datetime | None = None,
    ) -> UiSession:
        async with self._write() as conn:
            at = await self._now(conn, now)
            expired = (
                sa.select(ui_sessions.c.token_hash)
                .where(ui_sessions.c.expires_at <= at)
                .limit(PURGE_BATCH)
                .scalar_subquery()
            )
            await conn.execute(ui_sessions.delete().where(ui_sessions.c.token_hash.in_(expired)))
            row = (
                await conn.execute(
                    ui_sessions.insert()
                    .values(
                        token_hash=token_hash,
                        key_hash=key_hash,
                        tenant_id=tenant_id,
                        created_at=at,
                        last_seen_at=at,
                        expires_at=at + timedelta(seconds=min(idle, lifetime)),
                    )
                    .returning(*ui_sessions.c)
                )
            ).one()
        return _session_from(row)

    async def ui_sessions_get(
        self, *, token_hash: str, now: datetime | None = None
    ) -> UiSession | None:
        async with self._read() as conn:
            at = await self._now(conn, now)
            row = (
                await conn.execute(
                    sa.select(*ui_sessions.c).where(
                        ui_sessions.c.token_hash == token_hash, ui_sessions.c.expires_at > at
                    )
                )
            ).first()
        return None if row is None else _session_from(row)

    async def ui_sessions_touch(
        self,
        *,
        token_hash: str,
        idle: float,
        lifetime: float,
        now: datetime | None = None,
    ) -> None:
        async with self._write() as conn:
            at = await self._now(conn, now)
            row = (
                await conn.execute(
                    sa.select(ui_sessions.c.created_at).where(
                        ui_sessions.c.token_hash == token_hash, ui_sessions.c.expires_at > at
                    )
                )
            ).first()
            if row is None:
                return
            end_of_life = row.created_at + timedelta(seconds=lifetime)
            await conn.execute(
                ui_sessions.update()
                .where(ui_sessions.c.token_hash == token_hash)
                .values(
                    last_seen_at=at,
                    expires_at=min(at + timedelta(seconds=idle), end_of_life),
                )
            )

    async def ui_sessions_set_tenant(self, *, token_hash: str, tenant_id: uuid.UUID | None) -> None:
        async with self._write() as conn:
            await conn.execute(
                ui_sessions.update()
                .where(ui_sessions.c.token_hash == token_hash)
                .values(tenant_id=tenant_id)
            )

    async def ui_sessions_delete(self, *, token_hash: str) -> None:
        async with self._write() as conn:
            await conn.execute(ui_sessions.delete().where(ui_sessions.c.token_hash == token_hash))

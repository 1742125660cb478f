"""The audit trail (``domain/audit.py``): reading it, and retention. Records are
appended by the rooms that make the changes (``SqlCore._audit``), in the changes' own
transactions."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from cronwheel.domain.audit import AuditRecord
from cronwheel.domain.errors import ValidationError
from cronwheel.domain.model import Page
from cronwheel.store.rows import audit_from, int_cursor
from cronwheel.store.schema import audit
from cronwheel.store.sql.core import SqlCore

__all__ = ["AuditMixin"]

# Records removed per statement by retention: a long trail goes in bounded bites.
_EXPIRE_BATCH = 5_000


class AuditMixin(SqlCore):
    async def audit_list(
        self,
        tenant_id: uuid.UUID | None,
        *,
        actor: str | None = None,
        action: str | None = None,
        target_kind: str | None = None,
        target_id: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        cursor: str | None = None,
        limit: int = 100,
    ) -> Page[AuditRecord]:
        if since is not None and until is not None and until <= since:
            raise ValidationError("until must be after since", field="until")
        stmt = audit.select()
        if tenant_id is not None:
            stmt = stmt.where(audit.c.tenant_id == tenant_id)
        for column, value in (
            (audit.c.actor, actor),
            (audit.c.action, action),
            (audit.c.target_kind, target_kind),
            (audit.c.target_id, target_id),
        ):
            if value is not None:
                stmt = stmt.where(column == value)
        if since is not None:
            stmt = stmt.where(audit.c.at >= since)
        if until is not None:
            stmt = stmt.where(audit.c.at < until)
        before = int_cursor(cursor)
        if before is not None:
            stmt = stmt.where(audit.c.id < before)
        stmt = stmt.order_by(audit.c.id.desc()).limit(limit + 1)
        async with self._read() as conn:
            rows = (await conn.execute(stmt)).all()
        items = [audit_from(r) for r in rows[:limit]]
        return Page(items, str(items[-1].id) if len(rows) > limit else None)

    async def audit_expire(self, *, retention_days: int, now: datetime | None = None) -> int:
        if retention_days < 1:
            raise ValueError("retention_days must be at least 1")
        removed = 0
        while True:
            async with self._write() as conn:
                before = await self._now(conn, now) - timedelta(days=retention_days)
                went = await self.driver.audit_delete(conn, before=before, limit=_EXPIRE_BATCH)
            removed += went
            if went < _EXPIRE_BATCH:
                return removed

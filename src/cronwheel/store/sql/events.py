"""Events, the append-only history of every transition and operation (appended by the
rooms that make them, through the driver's ``events_insert``): reading it."""

from __future__ import annotations

import uuid

import sqlalchemy as sa

from cronwheel.domain.model import Event, Page
from cronwheel.store.rows import (
    event_from,
    int_cursor,
)
from cronwheel.store.schema import events
from cronwheel.store.sql.core import SqlCore

__all__ = ["EventsMixin"]


class EventsMixin(SqlCore):
    async def events_list(
        self,
        tenant_id: uuid.UUID | None,
        *,
        run_id: uuid.UUID | None = None,
        job_id: uuid.UUID | None = None,
        cursor: str | None = None,
        limit: int = 100,
    ) -> Page[Event]:
        after = int_cursor(cursor)
        stmt = events.select()
        if tenant_id is not None:
            stmt = stmt.where(events.c.tenant_id == tenant_id)
        if run_id is not None:
            stmt = stmt.where(events.c.run_id == run_id)
        if job_id is not None:
            stmt = stmt.where(events.c.job_id == job_id)
        if after is not None:
            stmt = stmt.where(events.c.id > after)
        stmt = stmt.order_by(events.c.id).limit(limit + 1)
        async with self._read() as conn:
            rows = (await conn.execute(stmt)).all()
        items = [event_from(r) for r in rows[:limit]]
        return Page(items, str(items[-1].id) if len(rows) > limit else None)

    async def events_transitions(self) -> dict[tuple[str | None, str], int]:
        stmt = (
            sa.select(events.c.from_state, events.c.to_state, sa.func.count())
            .where(events.c.kind == "run.transition")
            .group_by(events.c.from_state, events.c.to_state)
        )
        async with self._read() as conn:
            rows = (await conn.execute(stmt)).all()
        return {(r[0], r[1]): int(r[2]) for r in rows}

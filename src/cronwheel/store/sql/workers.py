"""Workers: registration, reading and listing them, deregistration, and why one cannot
lease."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from cronwheel.domain.errors import NotFoundError, ValidationError, WorkerDeregisteredError
from cronwheel.domain.model import Page, Worker, WorkerStatus
from cronwheel.ids import new_id
from cronwheel.store.rows import uuid_cursor, worker_from
from cronwheel.store.schema import workers
from cronwheel.store.sql.core import SqlCore
from cronwheel.store.sql.statements import workers_held, workers_live

__all__ = ["WorkersMixin"]


class WorkersMixin(SqlCore):
    async def workers_register(
        self,
        tenant_id: uuid.UUID | None,
        *,
        pool: str,
        capabilities: Sequence[str],
        tags: Sequence[str],
        capacity: int,
        name: str | None = None,
        webhooks_only: bool = False,
        tasks: Sequence[str] | None = None,
        now: datetime | None = None,
    ) -> Worker:
        if capacity < 1:
            raise ValidationError("capacity must be at least 1", field="capacity")
        async with self._write() as conn:
            at = await self._now(conn, now)
            if tenant_id is not None:  # a key cached past its tenant's deletion
                await self._require_tenant(conn, tenant_id)
            row = (
                await conn.execute(
                    workers.insert()
                    .values(
                        id=new_id(),
                        tenant_id=tenant_id,
                        name=name,
                        pool=pool,
                        capabilities=sorted(set(capabilities)),
                        tags=sorted(set(tags)),
                        capacity=capacity,
                        webhooks_only=webhooks_only,
                        tasks=None if tasks is None else sorted(set(tasks)),
                        registered_at=at,
                        last_seen_at=at,
                    )
                    .returning(*workers.c)
                )
            ).one()
        return worker_from(row)

    async def workers_get(self, worker_id: uuid.UUID) -> Worker:
        async with self._read() as conn:
            row = (await conn.execute(workers.select().where(workers.c.id == worker_id))).first()
        if row is None:
            raise self._not_found("worker", worker_id)
        return worker_from(row)

    async def workers_list(
        self,
        tenant_id: uuid.UUID | None,
        *,
        pool: str | None = None,
        worker_ttl: float = 30.0,
        cursor: str | None = None,
        limit: int = 100,
        now: datetime | None = None,
    ) -> Page[WorkerStatus]:
        after = uuid_cursor(cursor)
        running, reserved = workers_held(tenant_id)
        async with self._read() as conn, self.driver.planned_each(conn):
            at = await self._now(conn, now)
            stmt = (
                sa.select(
                    *workers.c,
                    running.label("running"),
                    reserved.label("reserved"),
                    workers_live(at, worker_ttl).label("live"),
                )
                .order_by(workers.c.id)
                .limit(limit + 1)
            )
            if tenant_id is not None:  # its own workers and the shared ones
                stmt = stmt.where(
                    sa.or_(workers.c.tenant_id == tenant_id, workers.c.tenant_id.is_(None))
                )
            if pool is not None:
                stmt = stmt.where(workers.c.pool == pool)
            if after is not None:
                stmt = stmt.where(workers.c.id > after)
            rows: list[Any] = list((await conn.execute(stmt)).all())
        items = [
            WorkerStatus(
                worker=worker_from(r),
                running=int(r.running),
                reserved=int(r.reserved),
                live=bool(r.live),
            )
            for r in rows[:limit]
        ]
        return Page(items, str(items[-1].worker.id) if len(rows) > limit else None)

    async def _worker_gone(
        self, conn: AsyncConnection, worker_id: uuid.UUID
    ) -> WorkerDeregisteredError | NotFoundError:
        """Why a worker found not live cannot lease: deregistered, or not there at all
        (only on that failure path: one read by primary key)."""
        row = (await conn.execute(sa.select(workers.c.id).where(workers.c.id == worker_id))).first()
        if row is None:
            return self._not_found("worker", worker_id)
        return WorkerDeregisteredError(
            f"worker {worker_id} was deregistered: it leases and starts nothing any more; "
            "register again for a new worker id"
        )

    async def workers_deregister(
        self, worker_id: uuid.UUID, *, now: datetime | None = None
    ) -> None:
        async with self._write() as conn:
            at = await self._now(conn, now)
            await conn.execute(
                workers.update()
                .where(workers.c.id == worker_id, workers.c.deregistered_at.is_(None))
                .values(deregistered_at=at)
            )

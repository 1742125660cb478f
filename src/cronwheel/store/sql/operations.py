"""The ``operations`` table (``domain/bulk.py``): reading operations, claiming them
under a lease, renewing and failing them, and retention. Accepting one and its steps
are ``store/sql/bulk.py``.

Claims go fairly between tenants: each tenant's oldest open operation before any
tenant's second, so one tenant's pile of operations cannot keep another's waiting for a
node (``api/operations.py`` then takes turns between the ones a node holds). A tenant
has at most ``max_open`` operations open at once (``settings.max_open_operations``),
and finished ones leave after ``operation_retention_days``: the audit trail keeps who
asked for what (``bulk.<action>``) as long as its own retention.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from cronwheel.domain.bulk import Operation, OperationState
from cronwheel.domain.errors import TenantLimitError
from cronwheel.domain.model import Page
from cronwheel.store.rows import operation_from, uuid_cursor
from cronwheel.store.schema import OPEN_OPERATION, operations
from cronwheel.store.sql.core import SqlCore

__all__ = ["OperationsMixin"]

_EXPIRE_BATCH = 5_000  # finished operations removed per statement by retention
_OPEN_LIMIT = "max_open_operations"


class OperationsMixin(SqlCore):
    async def operations_get(self, tenant_id: uuid.UUID, operation_id: uuid.UUID) -> Operation:
        async with self._read() as conn:
            row = (
                await conn.execute(
                    operations.select().where(
                        operations.c.tenant_id == tenant_id, operations.c.id == operation_id
                    )
                )
            ).first()
        if row is None:
            raise self._not_found("operation", operation_id)
        return operation_from(row)

    async def operations_list(
        self, tenant_id: uuid.UUID, *, cursor: str | None = None, limit: int = 100
    ) -> Page[Operation]:
        before = uuid_cursor(cursor)
        stmt = operations.select().where(operations.c.tenant_id == tenant_id)
        if before is not None:
            stmt = stmt.where(operations.c.id < before)
        stmt = stmt.order_by(operations.c.id.desc()).limit(limit + 1)
        async with self._read() as conn:
            rows = (await conn.execute(stmt)).all()
        items = [operation_from(r) for r in rows[:limit]]
        return Page(items, str(items[-1].id) if len(rows) > limit else None)

    async def operations_claim(
        self, *, owner: str, ttl: float, now: datetime | None = None
    ) -> Operation | None:
        # Nearly always there is none: a read (the open ones' small index) says so
        # without a write transaction, for every API node, every few seconds.
        async with self._read() as conn:
            anything = (
                await conn.execute(
                    sa.select(operations.c.id).where(sa.text(OPEN_OPERATION)).limit(1)
                )
            ).first()
        if anything is None:
            return None
        async with self._write() as conn:
            at = await self._now(conn, now)
            # Each open operation's place in its tenant's line: a tenant's first before
            # any tenant's second, however many it opened first.
            turn = (
                sa.select(
                    operations.c.id,
                    sa.func.row_number()
                    .over(
                        partition_by=operations.c.tenant_id,
                        order_by=(operations.c.accepted_at, operations.c.id),
                    )
                    .label("turn"),
                )
                .where(sa.text(OPEN_OPERATION))
                .subquery()
            )
            free = (
                sa.select(operations.c.id)
                .join(turn, turn.c.id == operations.c.id)
                .where(
                    sa.or_(
                        operations.c.lease_expires_at.is_(None),
                        operations.c.lease_expires_at < at,
                    ),
                )
                .order_by(turn.c.turn, operations.c.accepted_at, operations.c.id)
                .limit(1)
                # OF: the window function's rows cannot be locked, the operation's can.
                .with_for_update(of=operations, skip_locked=True)
            )
            found = (await conn.execute(free)).scalar()
            if found is None:
                return None
            row = (
                await conn.execute(
                    operations.update()
                    .where(operations.c.id == found)
                    .values(
                        owner=owner,
                        lease_expires_at=at + timedelta(seconds=ttl),
                        state=OperationState.RUNNING.value,
                        started_at=sa.func.coalesce(operations.c.started_at, at),
                    )
                    .returning(*operations.c)
                )
            ).one()
        return operation_from(row)

    async def operations_renew(
        self, *, owner: str, ttl: float, now: datetime | None = None
    ) -> list[uuid.UUID]:
        async with self._write() as conn:
            at = await self._now(conn, now)
            renewed = await conn.execute(
                operations.update()
                .where(
                    sa.text(OPEN_OPERATION),  # the open operations' index: a few rows
                    operations.c.owner == owner,
                    operations.c.state == OperationState.RUNNING.value,
                )
                .values(lease_expires_at=at + timedelta(seconds=ttl))
                .returning(operations.c.id)
            )
            return sorted(renewed.scalars())

    async def operations_fail(
        self, operation_id: uuid.UUID, *, owner: str, error: str, now: datetime | None = None
    ) -> None:
        async with self._write() as conn:
            at = await self._now(conn, now)
            await conn.execute(
                operations.update()
                .where(operations.c.id == operation_id, operations.c.owner == owner)
                .values(state=OperationState.FAILED.value, finished_at=at, owner=None, error=error)
            )

    async def operations_expire(self, *, retention_days: int, now: datetime | None = None) -> int:
        if retention_days < 1:
            raise ValueError("retention_days must be at least 1")
        removed = 0
        while True:
            async with self._write() as conn:
                before = await self._now(conn, now) - timedelta(days=retention_days)
                # No index on finished_at: the table holds a few operations a tenant a
                # day, and this runs hourly.
                old = (
                    sa.select(operations.c.id)
                    .where(
                        operations.c.state.in_(
                            [OperationState.DONE.value, OperationState.FAILED.value]
                        ),
                        operations.c.finished_at < before,
                    )
                    .limit(_EXPIRE_BATCH)
                )
                went = int(
                    (
                        await conn.execute(operations.delete().where(operations.c.id.in_(old)))
                    ).rowcount
                )
            removed += went
            if went < _EXPIRE_BATCH:
                return removed

    async def _operations_admit(
        self, conn: AsyncConnection, tenant_id: uuid.UUID, max_open: int
    ) -> None:
        """Refuse (:class:`TenantLimitError`) a new operation of a tenant that has
        ``max_open`` open already (the caller holds the tenant's row)."""
        capped = (
            sa.select(operations.c.id)
            .where(operations.c.tenant_id == tenant_id, sa.text(OPEN_OPERATION))
            .limit(max_open)
            .subquery()
        )
        found = int(
            (await conn.execute(sa.select(sa.func.count()).select_from(capped))).scalar_one()
        )
        if found < max_open:
            return
        raise TenantLimitError(
            f"the tenant has {found} bulk operations not finished yet, and a limit of {max_open} "
            f"({_OPEN_LIMIT}): wait for one to end (GET /v1/operations) before starting another",
            limit=_OPEN_LIMIT,
            open=found,
            max=max_open,
        )

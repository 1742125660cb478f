"""Worker logs in the database (``log_chunks``): the bytes of each attempt's log, one
row per append, zlib-compressed. What the bytes say — JSON lines, the cap and its
marker — is the log store's (``cronwheel.logstore``); this room keeps them in order,
one append per attempt at a time, and makes and drops the days they are kept by."""

from __future__ import annotations

import uuid
import zlib
from collections.abc import Callable, Sequence
from datetime import date, datetime, timedelta

import sqlalchemy as sa

from cronwheel.store.schema import log_chunks
from cronwheel.store.sql.core import SqlCore
from cronwheel.store.values import LogChunk, LogHead, LogWrite

__all__ = ["LogsMixin"]

_c = log_chunks.c
# Runs named in one DELETE (SQLite bounds a statement's parameters).
_DELETE_BATCH = 1000


def _attempt_of(tenant_id: uuid.UUID, run_id: uuid.UUID, attempt: int) -> sa.ColumnElement[bool]:
    return sa.and_(_c.tenant_id == tenant_id, _c.run_id == run_id, _c.attempt == attempt)


class LogsMixin(SqlCore):
    async def log_chunks_append(
        self,
        tenant_id: uuid.UUID,
        *,
        run_id: uuid.UUID,
        attempt: int,
        plan: Callable[[LogHead], LogWrite],
        now: datetime | None = None,
    ) -> int:
        async with self._write() as conn:
            at = await self._now(conn, now)
            # Appends to one attempt take turns, whichever process makes them.
            await self.driver.lock(conn, f"cw_log:{run_id}:{attempt}")
            head = (
                await conn.execute(
                    sa.select(_c.seq, _c.day, _c.end_offset, _c.marker, _c.data)
                    .where(_attempt_of(tenant_id, run_id, attempt))
                    .order_by(_c.seq.desc())
                    .limit(1)
                )
            ).first()
            size = 0 if head is None else int(head.end_offset)
            seq = 0 if head is None else int(head.seq)
            marker = zlib.decompress(head.data) if head is not None and head.marker else None
            write = plan(LogHead(size=size, marker=marker))
            rows = []
            if write.lines and marker is None:
                seq += 1
                rows.append((seq, size, write.lines, False))
                size += len(write.lines)
            if write.marker is not None and marker is not None and head is not None:
                await conn.execute(
                    log_chunks.update()
                    .where(
                        _attempt_of(tenant_id, run_id, attempt),
                        _c.seq == head.seq,
                        _c.day == head.day,
                    )
                    .values(data=zlib.compress(write.marker))
                )
            elif write.marker is not None:
                seq += 1
                rows.append((seq, size, write.marker, True))
                size += len(write.marker)
            if rows:
                await conn.execute(
                    log_chunks.insert(),
                    [
                        {
                            "tenant_id": tenant_id,
                            "run_id": run_id,
                            "attempt": attempt,
                            "seq": n,
                            "day": at.date(),
                            "start_offset": start,
                            "end_offset": start + len(data),
                            "marker": is_marker,
                            "data": zlib.compress(data),
                        }
                        for n, start, data, is_marker in rows
                    ],
                )
        return size

    async def log_chunks_read(
        self,
        tenant_id: uuid.UUID,
        *,
        run_id: uuid.UUID,
        after: tuple[int, int] = (0, 0),
        attempt: int | None = None,
        limit: int = 100,
    ) -> list[LogChunk]:
        first, offset = after
        stmt = (
            sa.select(_c.attempt, _c.start_offset, _c.end_offset, _c.data)
            .where(
                _c.tenant_id == tenant_id,
                _c.run_id == run_id,
                sa.or_(_c.attempt > first, sa.and_(_c.attempt == first, _c.end_offset > offset)),
            )
            .order_by(_c.attempt, _c.seq)
            .limit(limit)
        )
        if attempt is not None:
            stmt = stmt.where(_c.attempt == attempt)
        async with self._read() as conn:
            rows = (await conn.execute(stmt)).all()
        return [
            LogChunk(
                attempt=int(r.attempt),
                start=int(r.start_offset),
                end=int(r.end_offset),
                data=zlib.decompress(r.data),
            )
            for r in rows
        ]

    async def log_chunks_size(
        self, tenant_id: uuid.UUID, *, run_id: uuid.UUID, attempt: int
    ) -> int:
        async with self._read() as conn:
            size = (
                await conn.execute(
                    sa.select(sa.func.max(_c.end_offset)).where(
                        _attempt_of(tenant_id, run_id, attempt)
                    )
                )
            ).scalar()
        return int(size or 0)

    async def log_chunks_delete(
        self, tenant_id: uuid.UUID, *, run_ids: Sequence[uuid.UUID] | None = None
    ) -> int:
        of_tenant = _c.tenant_id == tenant_id
        if run_ids is None:
            batches: list[sa.ColumnElement[bool]] = [of_tenant]
        else:
            ids = list(run_ids)
            batches = [
                sa.and_(of_tenant, self.driver.id_in(_c.run_id, ids[i : i + _DELETE_BATCH]))
                for i in range(0, len(ids), _DELETE_BATCH)
            ]
        deleted = 0
        async with self._write() as conn:
            for where in batches:
                deleted += (await conn.execute(log_chunks.delete().where(where))).rowcount
        return deleted

    async def log_chunks_maintain(
        self, *, retention_days: int, now: datetime | None = None
    ) -> list[date]:
        if retention_days < 1:
            raise ValueError("retention_days must be at least 1")
        async with self._write() as conn:
            today = (await self._now(conn, now)).date()
            # Nodes maintaining at once make and drop each day once.
            await self.driver.lock(conn, "cw_log_days")
            await self.driver.log_days_prepare(
                conn, [today + timedelta(days=d) for d in (-1, 0, 1)]
            )
            return await self.driver.log_days_drop(
                conn, before=today - timedelta(days=retention_days)
            )

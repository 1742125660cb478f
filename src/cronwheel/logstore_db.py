"""Worker logs in the database: :class:`DatabaseLogStore`, the log store of API nodes
that share a PostgreSQL database, so that every node reads every line.

The lines and their cap are exactly the file store's (``cronwheel.logstore``): the same
JSON lines, the same marker, the same byte offsets, so the same cursors. Only where the
bytes go differs: each append is one row of ``log_chunks`` — its lines, compressed —
holding bytes ``[start, end)`` of the attempt's log, and the marker of a capped log is
a row of its own, rewritten in place. Appends to one attempt take turns under a lock in
the database, so API processes on any machine may append to it at once.

Rows are kept by the day they were appended: on PostgreSQL the table is partitioned by
day; whoever writes makes the partitions of yesterday, today and tomorrow (once a day
per process) and drops the days past the retention (``log_retention_days``) whole.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from datetime import UTC, date, datetime

from cronwheel.domain.errors import ValidationError
from cronwheel.logstore import (
    AppendResult,
    LogEntry,
    LogLine,
    LogPage,
    LogStore,
    bad_cursor,
    decode_cursor,
    decode_line,
    encode_cursor,
    encode_line,
    marker_counts,
    plan_append,
)
from cronwheel.store.base import Store
from cronwheel.store.values import LogHead, LogWrite

__all__ = ["DatabaseLogStore"]

# Chunks fetched per statement while a page fills (each holds at least one line).
_CHUNKS_PER_READ = 64


class DatabaseLogStore(LogStore):
    """Worker logs in the store's database (``log_chunks``); see the module docstring."""

    def __init__(
        self, store: Store, *, max_bytes_per_attempt: int = 1 << 20, retention_days: int = 30
    ) -> None:
        if max_bytes_per_attempt < 1:
            raise ValueError("max_bytes_per_attempt must be positive")
        if retention_days < 1:
            raise ValueError("retention_days must be at least 1")
        self.store = store
        self.max_bytes_per_attempt = max_bytes_per_attempt
        self.retention_days = retention_days
        self._maintained: date | None = None
        self._maintaining = asyncio.Lock()

    async def maintain(self) -> list[date]:
        """Make the days around today ready for appends and drop those past the
        retention (appends do it once a day by themselves); the days dropped."""
        async with self._maintaining:
            dropped = await self.store.log_chunks_maintain(retention_days=self.retention_days)
            self._maintained = datetime.now(UTC).date()
        return dropped

    async def append(
        self,
        tenant_id: uuid.UUID,
        *,
        run_id: uuid.UUID,
        attempt: int,
        lines: Sequence[LogEntry],
    ) -> AppendResult:
        if attempt < 1:
            raise ValueError("attempt numbers start at 1")
        if self._maintained != datetime.now(UTC).date():
            await self.maintain()
        encoded = [encode_line(line, attempt) for line in lines]
        stamps = [line.ts for line in lines]
        results: list[AppendResult] = []

        def plan(head: LogHead) -> LogWrite:
            out, marker, result = plan_append(
                size=head.size,
                marker=None if head.marker is None else marker_counts(head.marker),
                encoded=encoded,
                stamps=stamps,
                attempt=attempt,
                cap=self.max_bytes_per_attempt,
            )
            results.append(result)
            return LogWrite(lines=out, marker=marker)

        await self.store.log_chunks_append(tenant_id, run_id=run_id, attempt=attempt, plan=plan)
        return results[-1]

    async def read(
        self,
        tenant_id: uuid.UUID,
        *,
        run_id: uuid.UUID,
        attempt: int | None = None,
        cursor: str | None = None,
        limit: int = 500,
    ) -> LogPage:
        if limit < 1:
            raise ValidationError("limit: at least 1", field="limit")
        position = decode_cursor(cursor)
        lines: list[LogLine] = []
        first = True
        while len(lines) < limit:
            chunks = await self.store.log_chunks_read(
                tenant_id, run_id=run_id, after=position, attempt=attempt, limit=_CHUNKS_PER_READ
            )
            if first and position[1] and not any(c.attempt == position[0] for c in chunks):
                # Nothing of the cursor's attempt from its offset on: it must be that
                # log's end, not past it (a cursor this store did not make).
                size = await self.size(tenant_id, run_id=run_id, attempt=position[0])
                if position[1] > size:
                    raise bad_cursor(position[1])
            first = False
            for chunk in chunks:
                offset = position[1] if chunk.attempt == position[0] else 0
                got, end = _lines_of(
                    chunk.data, chunk.start, max(offset, chunk.start), limit - len(lines)
                )
                lines += [decode_line(raw, chunk.attempt) for raw in got]
                position = (chunk.attempt, end)
                if len(lines) >= limit:
                    break
            if len(chunks) < _CHUNKS_PER_READ:
                break
        more = len(lines) >= limit and bool(
            await self.store.log_chunks_read(
                tenant_id, run_id=run_id, after=position, attempt=attempt, limit=1
            )
        )
        end_cursor = encode_cursor(*position)
        return LogPage(lines, end_cursor if more else None, end_cursor)

    async def size(self, tenant_id: uuid.UUID, *, run_id: uuid.UUID, attempt: int) -> int:
        return await self.store.log_chunks_size(tenant_id, run_id=run_id, attempt=attempt)

    async def delete(
        self, tenant_id: uuid.UUID, *, run_ids: Sequence[uuid.UUID] | None = None
    ) -> None:
        await self.store.log_chunks_delete(tenant_id, run_ids=run_ids)


def _lines_of(data: bytes, start: int, offset: int, limit: int) -> tuple[list[bytes], int]:
    """Up to ``limit`` lines of a chunk holding bytes ``[start, …)`` of a log, from
    ``offset``: the raw lines, and the offset after them. (Blank lines are skipped,
    as in a file.)"""
    out: list[bytes] = []
    position = offset - start
    if position > len(data) or (position > 0 and data[position - 1 : position] != b"\n"):
        raise bad_cursor(offset)  # chunks hold whole lines: a cursor names a line's start
    while len(out) < limit and position < len(data):
        newline = data.find(b"\n", position)
        if newline < 0:  # chunks hold whole lines: only a cursor into one gets here
            break
        raw = data[position:newline]
        position = newline + 1
        if raw:
            out.append(raw)
    return out, start + position

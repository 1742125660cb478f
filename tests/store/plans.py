"""What one store operation costs the database, measured two ways on PostgreSQL.

Counters: the operation runs through the real store (a pool of one connection), then
the server's per-table statistics (``pg_stat_user_tables``, ``pg_statio_user_tables``)
are read again; the difference is what it did to each table — sequential scans, rows
they read, rows fetched through indexes, buffers touched (hit or read, heap and index).
Every path counts, raw asyncpg statements included. The database must be the test's own
(nothing else may touch it meanwhile), and both connections flush their statistics
(``pg_stat_force_next_flush``, PostgreSQL 15) before each reading.

Plans: every statement the operation sent (SQLAlchemy's, caught as the cursor executes
them, and raw asyncpg's, caught as the connection sends them) is run again with its
own parameters under ``EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)`` in a transaction rolled
back: each plan's scans (which table, which index) and buffers.
"""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import pytest
import sqlalchemy as sa
from sqlalchemy import event

from cronwheel.store import Store
from cronwheel.store.sql import SqlStore

__all__ = ["HOT_TABLES", "Cost", "Plan", "Probe"]

# The tables one tenant's volume fills.
HOT_TABLES = ("runs", "attempts", "events", "jobs")
_MENTIONS_HOT = re.compile(r"\b(" + "|".join(HOT_TABLES) + r")\b", re.IGNORECASE)

_COUNTERS = """
SELECT s.relname, s.seq_scan, s.seq_tup_read, COALESCE(s.idx_tup_fetch, 0) AS idx_tup_fetch,
       io.heap_blks_read + io.heap_blks_hit
       + COALESCE(io.idx_blks_read, 0) + COALESCE(io.idx_blks_hit, 0) AS buffers
FROM pg_stat_user_tables s JOIN pg_statio_user_tables io USING (relid)
WHERE s.relname = ANY($1::text[])
"""


@dataclass(frozen=True, slots=True)
class Plan:
    """One statement's plan as it ran: its scans and the buffers it touched."""

    sql: str
    scans: list[tuple[str, str, str | None]]  # (node type, table, index)
    buffers: int
    ms: float

    @property
    def seq_scans(self) -> list[str]:
        return [table for node, table, _ in self.scans if node == "Seq Scan"]

    def brief(self) -> str:
        scans = ", ".join(f"{n} {t}" + (f" ({i})" if i else "") for n, t, i in self.scans)
        return f"{self.buffers} buffers, {self.ms:.2f} ms: {scans} <- {self.sql[:160]!r}"


@dataclass(slots=True)
class Cost:
    """What one operation did to each hot table (counters) and its statements' plans."""

    seq_scans: dict[str, int] = field(default_factory=dict)
    seq_rows: dict[str, int] = field(default_factory=dict)
    index_rows: dict[str, int] = field(default_factory=dict)
    buffers: dict[str, int] = field(default_factory=dict)
    plans: list[Plan] = field(default_factory=list)

    @property
    def total_buffers(self) -> int:
        return sum(self.buffers.values())

    def seq_scanned(self) -> list[str]:
        """Tables read by a sequential scan, by the counters or by a plan."""
        counted = {t for t, n in self.seq_scans.items() if n}
        planned = {t for p in self.plans for t in p.seq_scans if t in HOT_TABLES}
        return sorted(counted | planned)

    def report(self) -> str:
        lines = [f"buffers {self.buffers} seq_scans {self.seq_scans} seq_rows {self.seq_rows}"]
        lines += [f"  {p.brief()}" for p in self.plans]
        return "\n".join(lines)


def _walk(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from _walk(child)


def _plan(sql: str, doc: Any) -> Plan:
    top = (json.loads(doc) if isinstance(doc, str) else doc)[0]
    root = top["Plan"]
    scans = [
        (n["Node Type"], n["Relation Name"], n.get("Index Name"))
        for n in _walk(root)
        if "Relation Name" in n
        and n["Node Type"] != "ModifyTable"
        and n["Node Type"] not in ("Insert", "Update", "Delete")
    ]
    buffers = int(root.get("Shared Hit Blocks", 0)) + int(root.get("Shared Read Blocks", 0))
    return Plan(" ".join(sql.split()), scans, buffers, float(top.get("Execution Time", 0.0)))


class Probe:
    """Measures operations of ``store`` (a pool of one connection, so that the one
    connection's statistics are the operation's) from ``reader``, a connection of its
    own to the same database."""

    def __init__(self, store: Store, reader: asyncpg.Connection) -> None:
        assert isinstance(store, SqlStore)
        self.store = store
        self.engine = store.engine
        self.reader = reader

    async def _flush(self) -> None:
        # Every connection the pool holds, not one of them: the operation may have run
        # on any, and a backend keeps its counts until told to flush them.
        async with contextlib.AsyncExitStack() as stack:
            for _ in range(max(1, self.engine.pool.checkedin())):  # type: ignore[attr-defined]
                conn = await stack.enter_async_context(self.engine.connect())
                await conn.execute(sa.text("SELECT pg_stat_force_next_flush()"))
                await conn.commit()
        # Answered only once the backend has gone idle, which is when it flushes.
        await self.reader.execute("SELECT pg_stat_force_next_flush()")

    async def _counters(self) -> dict[str, tuple[int, int, int, int]]:
        rows = await self.reader.fetch(_COUNTERS, list(HOT_TABLES))
        return {r["relname"]: tuple(r[1:]) for r in rows}  # type: ignore[misc]

    @contextlib.asynccontextmanager
    async def _captured(self, into: list[tuple[str, tuple[Any, ...]]]) -> AsyncIterator[None]:
        def on_execute(
            _conn: Any, _cursor: Any, statement: str, params: Any, _ctx: Any, many: bool
        ) -> None:
            if not many and _MENTIONS_HOT.search(statement):
                into.append((statement, tuple(params or ())))

        reader = self.reader
        originals = {
            name: getattr(asyncpg.Connection, name) for name in ("fetch", "fetchrow", "execute")
        }

        def spy(name: str) -> Callable[..., Awaitable[Any]]:
            original = originals[name]

            async def call(conn: asyncpg.Connection, query: str, *args: Any, **kw: Any) -> Any:
                if conn is not reader and _MENTIONS_HOT.search(query):
                    into.append((query, args))
                return await original(conn, query, *args, **kw)

            return call

        sync_engine = self.engine.sync_engine
        event.listen(sync_engine, "before_cursor_execute", on_execute)
        with pytest.MonkeyPatch.context() as mp:
            for name in originals:
                mp.setattr(asyncpg.Connection, name, spy(name))
            try:
                yield
            finally:
                event.remove(sync_engine, "before_cursor_execute", on_execute)

    async def explain(self, sql: str, args: tuple[Any, ...] = ()) -> Plan:
        """``sql`` run with ``args`` under EXPLAIN ANALYZE, rolled back. A statement that
        inserts rows under ids its caller chose (the lease's attempts) is replayed with
        fresh ones: the ids it used are taken by the rows it committed."""
        if "INSERT INTO attempts" in sql and "($8::uuid[])" in sql:  # the lease
            args = (*args[:7], _fresh_ids(args[7]), *args[8:])
        tx = self.reader.transaction()
        await tx.start()
        try:
            doc = await self.reader.fetchval(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, *args
            )
        finally:
            await tx.rollback()
        return _plan(sql, doc)

    async def measure(self, operation: Callable[[], Awaitable[Any]]) -> Cost:
        """Run ``operation`` once; what it cost."""
        await self._flush()
        before = await self._counters()
        statements: list[tuple[str, tuple[Any, ...]]] = []
        async with self._captured(statements):
            await operation()
        await self._flush()
        after = await self._counters()
        cost = Cost()
        for table in HOT_TABLES:
            delta = [a - b for a, b in zip(after[table], before[table], strict=True)]
            cost.seq_scans[table], cost.seq_rows[table] = delta[0], delta[1]
            cost.index_rows[table], cost.buffers[table] = delta[2], delta[3]
        for sql, args in statements:
            cost.plans.append(await self.explain(sql, args))
        await self.reader.execute("SELECT pg_stat_force_next_flush()")
        return cost


def _fresh_ids(ids: list[uuid.UUID]) -> list[uuid.UUID]:
    return [uuid.uuid4() for _ in ids]

"""The SQLite driver (aiosqlite): the embedded single-machine default.

SQLite has one writer at a time. Write transactions start with ``BEGIN IMMEDIATE`` (so
a read-then-write transaction never fails to upgrade its lock) and are serialised in
process by a lock; WAL lets readers go on meanwhile. Notifications are in-process only:
a second process on the same file learns of changes by polling. Its hot statements
are SQLAlchemy Core, a few statements per batch (``sqlite_firing.py``,
``sqlite_jobs.py``, ``sqlite_leasing.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.dialects import sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from cronwheel import jsontext
from cronwheel.store.drivers.sqlite_firing import CoreFiring
from cronwheel.store.drivers.sqlite_jobs import CoreJobs
from cronwheel.store.drivers.sqlite_leasing import CoreLeasing
from cronwheel.store.schema import UtcDateTime, counters, runs

__all__ = ["SqliteDriver"]


class SqliteDriver(CoreFiring, CoreJobs, CoreLeasing):
    dialect = "sqlite"

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self._write_lock = asyncio.Lock()

    def make_engine(self) -> AsyncEngine:
        path = sa.make_url(self.url).database
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_async_engine(
            self.url, connect_args={"timeout": 30}, json_deserializer=jsontext.loads
        )

        @event.listens_for(engine.sync_engine, "connect")
        def _connect(dbapi_connection: Any, _record: Any) -> None:
            # Let us issue BEGIN ourselves (the driver's implicit BEGIN is DEFERRED).
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            for pragma in (
                "journal_mode=WAL",
                "synchronous=NORMAL",
                "foreign_keys=ON",
                "busy_timeout=30000",
            ):
                cursor.execute(f"PRAGMA {pragma}")
            cursor.close()

        @event.listens_for(engine.sync_engine, "begin")
        def _begin(conn: sa.Connection) -> None:
            write = conn.get_execution_options().get("cw_write", False)
            conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

        return engine

    @contextlib.asynccontextmanager
    async def begin_write(self, engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
        async with self._writer(engine) as conn, conn.begin():
            yield conn

    @contextlib.asynccontextmanager
    async def _writer(self, engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
        """The one connection that writes (this process's lock held), its transactions
        begun IMMEDIATE."""
        async with self._write_lock, engine.connect() as conn:
            yield await conn.execution_options(cw_write=True)

    @contextlib.asynccontextmanager
    async def begin_migration(self, engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
        """A write transaction with foreign keys off, as SQLite's own procedure for
        changing a table asks: a migration that rebuilds a table (batch mode: create the
        new one, copy, drop the old) would otherwise cascade the drop to every row that
        refers to it — a job's runs, say. The keys are checked before the commit (a
        migration that broke one fails and changes nothing) and on again after. (The
        setting can only change outside a transaction.)"""

        def foreign_keys(sync_conn: sa.Connection, on: bool) -> None:
            cursor = sync_conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
            cursor.execute(f"PRAGMA foreign_keys={'ON' if on else 'OFF'}")
            cursor.close()

        async with self._writer(engine) as conn:
            await conn.run_sync(foreign_keys, False)
            try:
                async with conn.begin():
                    yield conn
                    broken = (await conn.exec_driver_sql("PRAGMA foreign_key_check")).all()
                    if broken:
                        raise RuntimeError(
                            f"a migration broke {len(broken)} foreign key(s), first: {broken[0]}"
                        )
            finally:
                await conn.run_sync(foreign_keys, True)

    async def db_now(self, conn: AsyncConnection) -> datetime:
        # The embedded database's clock is this process's clock.
        return datetime.now(UTC)

    async def notify(self, conn: AsyncConnection, channel: str, payloads: Sequence[str]) -> None:
        pending = conn.info.get("cw_pending")
        if pending is not None:
            pending.append((channel, list(payloads)))

    def id_in(self, column: sa.ColumnElement[Any], ids: Sequence[Any]) -> sa.ColumnElement[bool]:
        return column.in_(list(ids))

    def json_has(self, column: sa.ColumnElement[Any], value: str) -> sa.ColumnElement[bool]:
        each = sa.func.json_each(column).table_valued("value")
        return sa.select(sa.literal(1)).select_from(each).where(each.c.value == value).exists()

    def json_subset(
        self, column: sa.ColumnElement[Any], values: Sequence[str]
    ) -> sa.ColumnElement[bool]:
        each = sa.func.json_each(column).table_valued("value")
        return (
            ~sa.select(sa.literal(1))
            .select_from(each)
            .where(each.c.value.not_in(list(values)))
            .exists()
        )

    def json_equals(self, column: sa.ColumnElement[Any], value: Any) -> sa.ColumnElement[bool]:
        # SQLite compares JSON as text: ``json()`` brings both sides to one spelling.
        stored = list(value) if isinstance(value, tuple) else value
        bound = sa.bindparam(None, stored, type_=runs.c.requires.type)
        return sa.func.json(column) == sa.func.json(bound)

    def late_past(
        self,
        instant: sa.ColumnElement[datetime],
        seconds: sa.ColumnElement[float],
        now: datetime,
    ) -> sa.ColumnElement[bool]:
        # Instants are ISO text here: compared as Julian days (a day is 86,400 s).
        at = sa.bindparam(None, now, type_=UtcDateTime)
        return sa.func.julianday(instant) + seconds / 86400.0 < sa.func.julianday(at)

    def starts_with(self, column: sa.ColumnElement[str], prefix: str) -> sa.ColumnElement[bool]:
        # SQLite's LIKE ignores case.
        return sa.func.substr(column, 1, len(prefix)) == prefix

    def insert_ignore(self, table: sa.Table, rows: list[dict[str, Any]]) -> Any:
        stmt = sqlite.insert(table)
        return (stmt.values(rows) if rows else stmt).on_conflict_do_nothing()

    def upsert(self, table: sa.Table, rows: list[dict[str, Any]], update: Sequence[str]) -> Any:
        stmt = sqlite.insert(table).values(rows)
        return stmt.on_conflict_do_update(
            index_elements=list(table.primary_key.columns),
            set_={name: stmt.excluded[name] for name in update},
        )

    async def fencing_tokens(self, conn: AsyncConnection, count: int) -> list[int]:
        top = (
            await conn.execute(
                counters.update()
                .where(counters.c.name == "fencing_token")
                .values(value=counters.c.value + count)
                .returning(counters.c.value)
            )
        ).scalar_one()
        return list(range(int(top) - count + 1, int(top) + 1))

"""The PostgreSQL driver's statement for creating jobs: the tenant's row, the jobs, their
runs and their events in one statement — one round trip for one job or a thousand.

The rows travel as three JSON documents (``jsonb_populate_recordset`` turns each into
rows of its table's type): one parameter per table whatever the batch's size, the
columns named once. The limit decides in the statement::

    tenant ─ FOR KEY SHARE (a deletion waits until the statement's transaction ends)
      │ no such tenant ────────────────────────────────▶ "no_tenant", nothing inserted
      │ has max_pending_runs, not admitted by the caller ▶ "limited", nothing inserted
      ▼
    jobs ─▶ runs ─▶ events                               "inserted"

A large batch goes in by COPY instead, in a transaction of its own unless the caller
began one: the tenant's row locked and its limit read first (the same three outcomes),
then one COPY per table. A few round trips more, but the rows travel in binary and
PostgreSQL inserts them many at a time: a batch of 1,000 jobs took its statement 61 ms
and takes the COPYs 48 (binary values need no parsing; the JSON columns are sent as
text, one value at a time, and parsed as the documents were). A batch that comes in
parts (:func:`insert_job_parts`) is still one transaction, its parts COPYed one after
the other while the store makes the next: the API's Python and PostgreSQL's inserts
overlap instead of following each other.

The count behind ``max_pending_runs`` cannot be taken here: it must see what a creator
that held the tenant's lock committed, and a statement's snapshot is taken before it
waits for a lock. So a limited tenant's creators lock, count and then call this again,
admitted, in their transaction (``store/sql/pending.py``).

The schedulers' notices are not sent here but after the commit, by :class:`Notices`,
on a connection of their own. A transaction that notifies takes a lock that every
notifying transaction of the database takes until it has committed — its commit
record flushed, under synchronous commit — so creates that notified committed one at
a time and could not share a flush (group commit). A transaction that only notifies
writes no record of its own worth flushing: it commits at once. And all the notices
that come while one is being sent go in the next, in one statement.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import asyncpg
import orjson
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.util import greenlet_spawn

from cronwheel.store.driver import JobsInserted, NewJobRows
from cronwheel.store.drivers.postgres_copy import copy_data, json_plain

__all__ = [
    "COPY_FROM",
    "CommittedNotices",
    "bare_connection",
    "insert_job_parts",
    "insert_jobs",
    "notify_chunks",
]

log = logging.getLogger("cronwheel.store.postgres")

# What leaves a connection unusable: it is dropped from the pool, not handed back.
_BROKEN = (
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    ConnectionError,
    OSError,
    asyncio.CancelledError,  # a statement cut off halfway
)

# A NOTIFY payload must stay under 8000 bytes.
_NOTIFY_CHUNK = 7000

_LIMIT = "max_pending_runs"


def notify_chunks(payloads: Sequence[str]) -> list[str]:
    """``payloads`` joined by newlines into as few NOTIFY payloads as fit."""
    chunks: list[str] = []
    current: list[str] = []
    size = 0
    for p in payloads:
        if current and size + len(p) + 1 > _NOTIFY_CHUNK:
            chunks.append("\n".join(current))
            current, size = [], 0
        current.append(p)
        size += len(p) + 1
    if current:
        chunks.append("\n".join(current))
    return chunks


def _json_text(value: Any) -> str:
    # orjson writes UUIDs and instants itself, twenty times faster than ``json`` (a
    # batch of 1,000 jobs is 4,000 rows), and asks ``json_plain`` only about what it does
    # not know (asyncpg's own UUID type, which a tenant id read from the database has);
    # what it refuses (an integer past 64 bits in a payload, a key that is not text)
    # goes the slow way.
    try:
        return orjson.dumps(value, default=json_plain).decode()
    except orjson.JSONEncodeError:
        return json.dumps(value, default=json_plain, separators=(",", ":"))


def _document(rows: Sequence[dict[str, Any]]) -> str:
    return _json_text(list(rows))


def _insert(table: str, columns: tuple[str, ...]) -> str:
    names = ", ".join(columns)
    return f"""INSERT INTO {table} ({names})
        SELECT {names} FROM jsonb_populate_recordset(NULL::{table}, ${{param}}::jsonb)
        WHERE EXISTS (SELECT 1 FROM go)"""


@functools.lru_cache(maxsize=16)
def _statement(
    job_columns: tuple[str, ...],
    run_columns: tuple[str, ...],
    event_columns: tuple[str, ...],
    audit_columns: tuple[str, ...],
) -> str:
    parts = [
        "tenant AS (SELECT limits FROM tenants WHERE id = $1 FOR KEY SHARE)",
        f"go AS (SELECT 1 FROM tenant WHERE $2 OR limits ->> '{_LIMIT}' IS NULL)",
    ]
    param = 3
    for name, table, columns in (
        ("j", "jobs", job_columns),
        ("r", "runs", run_columns),
        ("e", "events", event_columns),
        ("a", "audit", audit_columns),
    ):
        if columns:
            parts.append(f"{name} AS ({_insert(table, columns).format(param=param)})")
            param += 1
    return (
        "WITH "
        + ",\n".join(parts)
        + "\nSELECT EXISTS (SELECT 1 FROM tenant) AS found, EXISTS (SELECT 1 FROM go) AS go"
    )


async def insert_jobs(
    conn: Any, *, tenant_id: uuid.UUID, rows: NewJobRows, admitted: bool
) -> JobsInserted:
    """:meth:`Driver.jobs_insert` on the raw asyncpg connection ``conn``."""
    if len(rows.jobs) >= COPY_FROM:
        if conn.is_in_transaction():
            return await _copy_jobs(conn, tenant_id=tenant_id, rows=rows, admitted=admitted)
        async with conn.transaction():
            return await _copy_jobs(conn, tenant_id=tenant_id, rows=rows, admitted=admitted)
    tables = rows.tables()
    columns = {name: names for name, names, _ in tables}
    sql = _statement(*(columns.get(name, ()) for name in NewJobRows.TABLES))
    found = await conn.fetchrow(
        sql, tenant_id, admitted, *(_document(rows.dicts(name)) for name, _, _ in tables)
    )
    if not found["found"]:
        return "no_tenant"
    return "inserted" if found["go"] else "limited"


# From this many jobs on, a batch goes in by COPY (see the module's docstring): below it
# the round trips of a transaction cost more than the documents' parsing saves.
COPY_FROM = 64

_TENANT = f"""SELECT limits ->> '{_LIMIT}' IS NOT NULL AS limited FROM tenants
    WHERE id = $1 FOR KEY SHARE"""


async def _copy_jobs(
    conn: Any, *, tenant_id: uuid.UUID, rows: NewJobRows, admitted: bool
) -> JobsInserted:
    """:func:`insert_jobs` by COPY, inside the transaction ``conn`` is in."""
    tenant = await conn.fetchrow(_TENANT, tenant_id)
    if tenant is None:
        return "no_tenant"
    if tenant["limited"] and not admitted:
        return "limited"
    await _copy(conn, _copies(rows))
    return "inserted"


# A table's name, columns and binary COPY data.
_Copy = tuple[str, tuple[str, ...], bytes]


def _copies(rows: NewJobRows) -> list[_Copy]:
    return [
        (table, columns, copy_data(table, columns, records))
        for table, columns, records in rows.tables()
    ]


async def _copy(conn: Any, copies: Sequence[_Copy]) -> None:
    for table, columns, data in copies:
        # A memoryview: asyncpg would take bytes for a file's path.
        await conn.copy_to_table(table, source=memoryview(data), columns=columns, format="binary")


async def insert_job_parts(
    conn: Any, *, tenant_id: uuid.UUID, parts: AsyncIterator[NewJobRows]
) -> JobsInserted:
    """:func:`insert_jobs`, not admitted, of rows that come in parts, in one transaction:
    each part's COPYs go on in a task of their own while the caller makes the next part
    (it yields to the loop as it does), so that this process's Python and PostgreSQL's
    inserts overlap instead of following each other. A part's COPYs start once the part
    before is in. Any failure leaves nothing: the transaction rolls back."""
    async with conn.transaction():
        tenant = await conn.fetchrow(_TENANT, tenant_id)
        if tenant is None:
            return "no_tenant"
        if tenant["limited"]:
            return "limited"
        copying: asyncio.Task[None] | None = None
        try:
            async for part in parts:
                copies = _copies(part)  # while the part before is being copied
                if copying is not None:
                    await copying
                copying = asyncio.create_task(_copy(conn, copies), name="cw-copy-jobs")
            if copying is not None:
                await copying
        except BaseException as exc:
            # Not left running on the connection that is about to roll back: finished
            # when the maker failed (a job of the batch refused), cut off when this was
            # cancelled (the connection is dropped then).
            if copying is not None:
                if not copying.done():
                    if isinstance(exc, asyncio.CancelledError):
                        copying.cancel()
                    await asyncio.wait([copying])
                if not copying.cancelled():
                    copying.exception()  # read: what is raised is the first failure
            raise
    return "inserted"


@contextlib.asynccontextmanager
async def bare_connection(engine: AsyncEngine) -> AsyncIterator[Any]:
    """An asyncpg connection of ``engine``'s pool, in autocommit (each statement its own
    transaction), without SQLAlchemy's connection and transaction around it: those cost
    a single create a third of its time in this process."""
    raw = await engine.raw_connection()
    try:
        yield raw.driver_connection
    except _BROKEN:
        await greenlet_spawn(raw.invalidate)
        raise
    finally:
        await greenlet_spawn(raw.close)


class CommittedNotices:
    """Notifications about what has committed, sent outside the writers' transactions
    (see the module's docstring) on the connection that listens — idle otherwise, and
    needing no pool checkout: every channel's notices queued while one statement is
    under way go together in the next one. Notices that may wait (``within``) wait that
    long for others to go with: one client creating jobs one after the other sent a
    statement per job, a sixth of each create's time. Lost when that connection is down
    or the process ends first: they are wake-ups, never the truth."""

    def __init__(self, connection: Callable[[], asyncpg.Connection | None]) -> None:
        self._connection = connection
        self._queued: dict[str, list[str]] = {}
        self._task: asyncio.Task[None] | None = None
        self._waiting: asyncio.TimerHandle | None = None  # notices that may wait, queued
        self._closed = False
        self._failing = False  # one log line per run of failures

    def send(self, channel: str, payloads: Sequence[str], *, within: float = 0.0) -> None:
        """Queue ``payloads``, to be sent at once, or within ``within`` seconds."""
        if self._closed or not payloads:
            return
        self._queued.setdefault(channel, []).extend(payloads)
        if self._task is not None:
            return  # sent next, with whatever else queued meanwhile
        if within <= 0:
            self._start()
        elif self._waiting is None:
            self._waiting = asyncio.get_running_loop().call_later(within, self._start)

    def _start(self) -> None:
        if self._waiting is not None:
            self._waiting.cancel()
            self._waiting = None
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="cw-notices")

    async def close(self) -> None:
        """Send what is queued (for at most a moment), then send nothing more."""
        self._closed = True
        if self._waiting is not None:
            self._start()
        if self._task is not None:
            with contextlib.suppress(Exception, TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._task), 2.0)

    async def _run(self) -> None:
        try:
            while self._queued:
                queued, self._queued = self._queued, {}
                channels: list[str] = []
                chunks: list[str] = []
                for channel, payloads in queued.items():
                    joined = notify_chunks(payloads)
                    channels += [channel] * len(joined)
                    chunks += joined
                conn = self._connection()
                try:
                    if conn is None:
                        raise ConnectionError("not connected")
                    await conn.execute(
                        "SELECT pg_notify(c, p) FROM unnest($1::text[], $2::text[]) AS n(c, p)",
                        channels,
                        chunks,
                    )
                except Exception as exc:
                    if not self._failing:
                        log.warning(
                            "notices not sent",
                            extra={"event": "notices_lost", "error": str(exc)},
                        )
                    self._failing = True
                else:
                    self._failing = False
        finally:
            self._task = None

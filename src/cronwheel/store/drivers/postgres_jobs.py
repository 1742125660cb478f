"""The PostgreSQL driver's statement for creating jobs: the tenant's row, the jobs, their
runs, their events and the schedulers' notices, in one statement — one round trip for
one job or a thousand.

The rows travel as three JSON documents (``jsonb_populate_recordset`` turns each into
rows of its table's type): one parameter per table whatever the batch's size, the
columns named once. The limit decides in the statement::

    tenant ─ FOR KEY SHARE (a deletion waits until the statement's transaction ends)
      │ no such tenant ────────────────────────────────▶ "no_tenant", nothing inserted
      │ has max_pending_runs, not admitted by the caller ▶ "limited", nothing inserted
      ▼
    jobs ─▶ runs ─▶ events ─▶ pg_notify                  "inserted"

The count behind ``max_pending_runs`` cannot be taken here: it must see what a creator
that held the tenant's lock committed, and a statement's snapshot is taken before it
waits for a lock. So a limited tenant's creators lock, count and then call this again,
admitted, in their transaction (``store/sql/pending.py``).
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import orjson

from cronwheel.store.driver import JobsInserted, NewJobRows
from cronwheel.store.notices import CHANNEL_RUNS_NEW

__all__ = ["insert_jobs", "notify_chunks"]

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


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


def _document(rows: Sequence[dict[str, Any]]) -> str:
    # orjson writes UUIDs and instants itself, twenty times faster than ``json`` (a
    # batch of 1,000 jobs is 4,000 rows), and asks ``_plain`` only about what it does
    # not know (asyncpg's own UUID type, which a tenant id read from the database has);
    # what it refuses (an integer past 64 bits in a payload, a key that is not text)
    # goes the slow way.
    try:
        return orjson.dumps(list(rows), default=_plain).decode()
    except orjson.JSONEncodeError:
        return json.dumps(list(rows), default=_plain, separators=(",", ":"))


def _insert(table: str, columns: tuple[str, ...]) -> str:
    names = ", ".join(columns)
    return f"""INSERT INTO {table} ({names})
        SELECT {names} FROM jsonb_populate_recordset(NULL::{table}, ${{param}}::jsonb)
        WHERE EXISTS (SELECT 1 FROM go)"""


@functools.lru_cache(maxsize=16)
def _statement(
    job_columns: tuple[str, ...], run_columns: tuple[str, ...], event_columns: tuple[str, ...]
) -> str:
    parts = [
        "tenant AS (SELECT limits FROM tenants WHERE id = $1 FOR KEY SHARE)",
        f"go AS (SELECT 1 FROM tenant WHERE $2 OR limits ->> '{_LIMIT}' IS NULL)",
        "notified AS (SELECT pg_notify($3, p) FROM unnest($4::text[]) AS p"
        " WHERE EXISTS (SELECT 1 FROM go))",
    ]
    param = 5
    for name, table, columns in (
        ("j", "jobs", job_columns),
        ("r", "runs", run_columns),
        ("e", "events", event_columns),
    ):
        if columns:
            parts.append(f"{name} AS ({_insert(table, columns).format(param=param)})")
            param += 1
    # A SELECT in WITH runs only when read: the notices are counted to be sent.
    return (
        "WITH "
        + ",\n".join(parts)
        + "\nSELECT EXISTS (SELECT 1 FROM tenant) AS found, EXISTS (SELECT 1 FROM go) AS go,"
        " (SELECT count(*) FROM notified) AS notified"
    )


def _columns(rows: Sequence[dict[str, Any]]) -> tuple[str, ...]:
    return tuple(rows[0]) if rows else ()


async def insert_jobs(
    conn: Any, *, tenant_id: uuid.UUID, rows: NewJobRows, admitted: bool
) -> JobsInserted:
    """:meth:`Driver.jobs_insert` on the raw asyncpg connection ``conn``."""
    tables = [t for t in (rows.jobs, rows.runs, rows.events) if t]
    sql = _statement(_columns(rows.jobs), _columns(rows.runs), _columns(rows.events))
    found = await conn.fetchrow(
        sql,
        tenant_id,
        admitted,
        CHANNEL_RUNS_NEW,
        notify_chunks(rows.notices),
        *(_document(t) for t in tables),
    )
    if not found["found"]:
        return "no_tenant"
    return "inserted" if found["go"] else "limited"

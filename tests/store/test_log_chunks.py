"""Worker logs in the database (``log_chunks``), on both backends: chunks in order per
attempt, appends to one attempt taking turns, the days they are kept by (a partition a
day on PostgreSQL) made ahead and dropped by retention."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from datetime import date, timedelta

import sqlalchemy as sa

from cronwheel.store import Store, create_store
from cronwheel.store.values import LogChunk, LogHead, LogWrite

from .helpers import T0, engine_of

TENANT = uuid.UUID("00000000-0000-0000-0000-00000000000a")


def appending(
    data: bytes, marker: bytes | None = None
) -> tuple[list[LogHead], Callable[[LogHead], LogWrite]]:
    """A plan that appends ``data`` (and ``marker``), remembering the heads it saw."""
    seen: list[LogHead] = []

    def plan(head: LogHead) -> LogWrite:
        seen.append(head)
        return LogWrite(lines=data, marker=marker)

    return seen, plan


async def partitions(store: Store) -> list[str]:
    """The partitions of log_chunks (PostgreSQL), by name."""
    async with engine_of(store).connect() as conn:
        rows = await conn.execute(
            sa.text(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
                " WHERE i.inhparent = 'log_chunks'::regclass ORDER BY 1"
            )
        )
        return [str(r[0]) for r in rows]


async def days_of(store: Store, run: uuid.UUID) -> list[date]:
    async with engine_of(store).connect() as conn:
        rows = await conn.execute(
            sa.text("SELECT day FROM log_chunks WHERE run_id = :run ORDER BY seq"),
            {"run": run if store.dialect == "postgresql" else run.hex},
        )
        return [r[0] if isinstance(r[0], date) else date.fromisoformat(r[0]) for r in rows]


async def test_chunks_hold_an_attempts_bytes_in_order(store: Store) -> None:
    await store.log_chunks_maintain(retention_days=30, now=T0)
    run = uuid.uuid4()
    seen, plan = appending(b"a\nb\n")
    assert await store.log_chunks_append(TENANT, run_id=run, attempt=1, plan=plan, now=T0) == 4
    assert seen == [LogHead(size=0, marker=None)]
    seen, plan = appending(b"c\n", marker=b"M\n")
    assert await store.log_chunks_append(TENANT, run_id=run, attempt=1, plan=plan, now=T0) == 8
    assert seen == [LogHead(size=4, marker=None)]
    # Once a marker ends the log, a plan's marker replaces it in place.
    seen, plan = appending(b"", marker=b"N\n")
    assert await store.log_chunks_append(TENANT, run_id=run, attempt=1, plan=plan, now=T0) == 8
    assert seen == [LogHead(size=8, marker=b"M\n")]
    seen, plan = appending(b"x\n")
    await store.log_chunks_append(TENANT, run_id=run, attempt=2, plan=plan, now=T0)

    assert await store.log_chunks_read(TENANT, run_id=run) == [
        LogChunk(1, 0, 4, b"a\nb\n"),
        LogChunk(1, 4, 6, b"c\n"),
        LogChunk(1, 6, 8, b"N\n"),
        LogChunk(2, 0, 2, b"x\n"),
    ]
    # Past a position: that attempt's chunks ending after it, then later attempts.
    after = await store.log_chunks_read(TENANT, run_id=run, after=(1, 5), limit=2)
    assert [(c.attempt, c.start) for c in after] == [(1, 4), (1, 6)]
    assert [c.attempt for c in await store.log_chunks_read(TENANT, run_id=run, attempt=2)] == [2]
    assert await store.log_chunks_read(TENANT, run_id=run, after=(2, 2)) == []
    assert await store.log_chunks_size(TENANT, run_id=run, attempt=1) == 8
    assert await store.log_chunks_size(TENANT, run_id=run, attempt=3) == 0
    # Another tenant's id finds nothing.
    assert await store.log_chunks_read(uuid.uuid4(), run_id=run) == []
    assert await store.log_chunks_size(uuid.uuid4(), run_id=run, attempt=1) == 0


async def test_appends_to_one_attempt_take_turns_across_processes(store_url: str) -> None:
    """Two stores (two API processes) append to one attempt at once: every plan sees
    the head the previous append left, so no byte range is handed out twice."""
    stores = [create_store(store_url) for _ in range(2)]
    for s in stores:
        await s.open()
    try:
        await stores[0].log_chunks_maintain(retention_days=30, now=T0)
        run = uuid.uuid4()

        async def writer(s: Store, name: str) -> None:
            for i in range(15):
                _seen, plan = appending(f"{name}{i:02d}\n".encode())
                await s.log_chunks_append(TENANT, run_id=run, attempt=1, plan=plan, now=T0)

        await asyncio.gather(*(writer(s, n) for s, n in zip(stores, "pq", strict=True)))
        chunks = await stores[1].log_chunks_read(TENANT, run_id=run, limit=100)
        assert len(chunks) == 30
        assert [c.start for c in chunks] == [4 * i for i in range(30)]
        assert all(c.end - c.start == len(c.data) == 4 for c in chunks)
        for name in "pq":  # each writer's lines in its own order
            mine = [c.data for c in chunks if c.data.startswith(name.encode())]
            assert mine == [f"{name}{i:02d}\n".encode() for i in range(15)]
    finally:
        for s in stores:
            await s.close()


async def test_an_attempts_log_goes_on_across_a_day_boundary(store: Store) -> None:
    before_midnight = T0.replace(hour=23, minute=59, second=59)
    after_midnight = before_midnight + timedelta(seconds=2)
    day = before_midnight.date()
    assert await store.log_chunks_maintain(retention_days=30, now=before_midnight) == []
    if store.dialect == "postgresql":  # yesterday, today and tomorrow, made ahead
        assert await partitions(store) == [
            f"log_chunks_p{d:%Y%m%d}" for d in (day - timedelta(days=1), day, day + timedelta(1))
        ]
    run = uuid.uuid4()
    _seen, plan = appending(b"late\n")
    await store.log_chunks_append(TENANT, run_id=run, attempt=1, plan=plan, now=before_midnight)
    # Past midnight the next day's partition is there already: nothing waits for it.
    _seen, plan = appending(b"early\n")
    await store.log_chunks_append(TENANT, run_id=run, attempt=1, plan=plan, now=after_midnight)
    assert await days_of(store, run) == [day, day + timedelta(days=1)]
    assert [c.data for c in await store.log_chunks_read(TENANT, run_id=run)] == [
        b"late\n",
        b"early\n",
    ]
    # The next day's maintenance makes the day after it; making a day twice is harmless.
    await store.log_chunks_maintain(retention_days=30, now=after_midnight)
    await store.log_chunks_maintain(retention_days=30, now=after_midnight)
    if store.dialect == "postgresql":
        assert (await partitions(store))[-1] == f"log_chunks_p{day + timedelta(days=2):%Y%m%d}"


async def test_retention_drops_whole_old_days(store: Store) -> None:
    old, kept = uuid.uuid4(), uuid.uuid4()
    first = T0 - timedelta(days=10)
    await store.log_chunks_maintain(retention_days=30, now=first)
    _seen, plan = appending(b"old\n")
    await store.log_chunks_append(TENANT, run_id=old, attempt=1, plan=plan, now=first)
    await store.log_chunks_maintain(retention_days=30, now=T0)
    _seen, plan = appending(b"kept\n")
    await store.log_chunks_append(TENANT, run_id=kept, attempt=1, plan=plan, now=T0)

    # Ten days on, a retention of eleven days keeps everything...
    assert await store.log_chunks_maintain(retention_days=11, now=T0) == []
    assert len(await store.log_chunks_read(TENANT, run_id=old)) == 1
    # ... and nine days drop the first day, and the empty one before it, whole.
    dropped = await store.log_chunks_maintain(retention_days=9, now=T0)
    first_day = first.date()
    if store.dialect == "postgresql":
        assert dropped == [first_day - timedelta(days=1), first_day]
        cutoff = f"log_chunks_p{T0.date() - timedelta(days=9):%Y%m%d}"
        assert min(await partitions(store)) == cutoff
    else:
        assert dropped == [first_day]
    assert await store.log_chunks_read(TENANT, run_id=old) == []
    assert await store.log_chunks_size(TENANT, run_id=old, attempt=1) == 0
    assert [c.data for c in await store.log_chunks_read(TENANT, run_id=kept)] == [b"kept\n"]

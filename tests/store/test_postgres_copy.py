"""The binary COPY data of a creation (``store/drivers/postgres_copy.py``) stores what
asyncpg's own encoding of the same records stores, value for value — including the
values a column encoded once must not merge: equal in Python, written apart."""

from __future__ import annotations

import dataclasses
import json
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa

from cronwheel.domain.sharding import shard_of
from cronwheel.domain.template import RunTemplate
from cronwheel.store import Store
from cronwheel.store.drivers.postgres_copy import copy_data
from cronwheel.store.rows import EVENT_COLUMNS, NEW_RUN_COLUMNS, event_record, new_run_record
from cronwheel.store.schema import events, runs
from cronwheel.store.sql import SqlStore

from .helpers import T0, create_job, make_tenant

_TEMPLATE = RunTemplate(
    task="t",
    webhook=None,
    payload={},
    pool="default",
    requires=[],
    tags=[],
    priority=2,
    retry={"max_attempts": 3},
    timeout=60.0,
    heartbeat_timeout=25.0,
)

# Each pair is equal in Python but not the same value stored.
_PAYLOADS: list[dict[str, Any]] = [
    {"v": 1},
    {"v": 1.0},
    {"v": True},
    {"v": 2**70},  # past 64 bits: written by ``json``
    {"v": -0.0},
    {"v": 0.0},
    {"v": 'é☃\\"\n', "nested": {"a": [1, None, {"b": []}]}},
]


async def _store_both(
    store: Store,
    table: sa.Table,
    columns: tuple[str, ...],
    ours: list[tuple[Any, ...]],
    theirs: list[tuple[Any, ...]],
) -> None:
    """``ours`` by :func:`copy_data`, ``theirs`` by asyncpg (their JSON values as
    ``json`` writes them), in one transaction."""
    json_columns = {c.name for c in table.c if isinstance(c.type, sa.JSON)}
    records = [
        [
            json.dumps(v) if name in json_columns and v is not None else v
            for name, v in zip(columns, row, strict=True)
        ]
        for row in theirs
    ]
    assert isinstance(store, SqlStore)
    async with store.engine.begin() as conn:
        raw: Any = (await conn.get_raw_connection()).driver_connection
        await raw.copy_to_table(
            table.name,
            source=memoryview(copy_data(table.name, columns, ours)),
            columns=columns,
            format="binary",
        )
        await raw.copy_records_to_table(table.name, records=records, columns=columns)


async def _column_texts(
    store: Store, table: sa.Table, ids: list[Any], key: str, columns: list[str]
) -> list[tuple[str | None, ...]]:
    """The stored values of ``columns`` as PostgreSQL writes them, row by row in the
    order of ``ids`` (values of ``key``)."""
    assert isinstance(store, SqlStore)
    selected = [sa.cast(table.c[c], sa.Text).label(c) for c in columns]
    async with store.engine.connect() as conn:
        found = {
            row[0]: tuple(row[1:])
            for row in await conn.execute(
                sa.select(table.c[key], *selected).where(table.c[key].in_(ids))
            )
        }
    return [found[i] for i in ids]


async def test_runs_copied_by_either_encoding_are_the_same(store: Store) -> None:
    if store.dialect != "postgresql":
        pytest.skip("COPY is PostgreSQL's")
    tenant = await make_tenant(store)
    job, _run = await create_job(store, tenant.id, due_at=T0)
    plus5 = timezone(timedelta(hours=5))

    def record(i: int, payload: dict[str, Any], timeout: float, due: datetime) -> tuple[Any, ...]:
        template = dataclasses.replace(_TEMPLATE, payload=payload, timeout=timeout)
        return new_run_record(
            run_id=uuid.uuid4(),
            tenant_id=tenant.id,
            job_id=job.id,
            name=job.name,
            template=template,
            due_at=due + timedelta(minutes=i),
            due_local=None if i % 2 else "2030-01-01T10:00:00+05:00",
            shard=shard_of(tenant.id, job.id),
            at=T0.astimezone(plus5),  # an offset other than UTC's
            origin="once",
        )

    # Timeouts of 0.0 and -0.0: equal, and one column must not become the other.
    ours = [
        record(i, p, -0.0 if i % 2 else 0.0, T0 + timedelta(hours=1))
        for i, p in enumerate(_PAYLOADS)
    ]
    theirs = [
        record(i, p, -0.0 if i % 2 else 0.0, T0 + timedelta(days=1))
        for i, p in enumerate(_PAYLOADS)
    ]
    # A column of one value in every row is encoded once: the same, and NULL.
    same = [record(i, {"v": 1}, 30.0, T0 + timedelta(days=2)) for i in range(3)]
    same_theirs = [record(i, {"v": 1}, 30.0, T0 + timedelta(days=3)) for i in range(3)]
    # A column whose values are all equal in Python, yet each written otherwise.
    alike = [{"v": 1}, {"v": 1.0}, {"v": True}]
    alike_ours = [record(i, p, 30.0, T0 + timedelta(days=4)) for i, p in enumerate(alike)]
    alike_theirs = [record(i, p, 30.0, T0 + timedelta(days=5)) for i, p in enumerate(alike)]
    await _store_both(store, runs, NEW_RUN_COLUMNS, ours + same, theirs + same_theirs)
    await _store_both(store, runs, NEW_RUN_COLUMNS, alike_ours, alike_theirs)
    ours += alike_ours
    theirs += alike_theirs
    # All but what tells the two sets apart (each its own id and due instant).
    compared = [c for c in NEW_RUN_COLUMNS if c not in ("id", "due_at", "fire_at")]
    mine = await _column_texts(store, runs, [r[0] for r in ours + same], "id", compared)
    asyncpg_s = await _column_texts(
        store, runs, [r[0] for r in theirs + same_theirs], "id", compared
    )
    assert mine == asyncpg_s
    payloads = [row[compared.index("payload")] for row in mine[: len(_PAYLOADS)]]
    assert payloads[:6] == [
        '{"v": 1}',
        '{"v": 1.0}',
        '{"v": true}',
        '{"v": 1180591620717411303424}',
        '{"v": 0.0}',  # jsonb has no negative zero
        '{"v": 0.0}',
    ]
    assert [row[compared.index("timeout")] for row in mine[:2]] == ["0", "-0"]
    assert [row[compared.index("payload")] for row in mine[len(_PAYLOADS) :][:3]] == [
        '{"v": 1}',
        '{"v": 1.0}',
        '{"v": true}',
    ]


async def test_events_copied_by_either_encoding_are_the_same(store: Store) -> None:
    if store.dialect != "postgresql":
        pytest.skip("COPY is PostgreSQL's")
    tenant = await make_tenant(store)
    job, run = await create_job(store, tenant.id, due_at=T0)
    assert run is not None

    def pair(actor: str) -> list[tuple[Any, ...]]:
        # Two kinds of rows, as a creation writes them: text that repeats, NULLs among
        # values, data on one of them.
        return [
            event_record(
                at=T0,
                kind="job.created",
                tenant_id=tenant.id,
                actor=actor,
                job_id=job.id,
                data={"name": job.name, "schedule": "at"},
            ),
            event_record(
                at=T0 + timedelta(microseconds=1),
                kind="run.transition",
                tenant_id=tenant.id,
                to_state="SCHEDULED",
                actor=actor,
                reason="job created",
                job_id=job.id,
                run_id=run.id,
            ),
        ] * 5

    ours, theirs = pair("ours"), pair("theirs")
    await _store_both(store, events, EVENT_COLUMNS, ours, theirs)
    compared = [c for c in EVENT_COLUMNS if c != "actor"]
    assert isinstance(store, SqlStore)

    async def by_actor(actor: str) -> list[tuple[Any, ...]]:
        selected = [sa.cast(events.c[c], sa.Text) for c in compared]
        async with store.engine.connect() as conn:
            rows = await conn.execute(
                sa.select(*selected).where(events.c.actor == actor).order_by(events.c.id)
            )
            return [tuple(r) for r in rows]

    assert await by_actor("ours") == await by_actor("theirs")
    assert len(await by_actor("ours")) == 10

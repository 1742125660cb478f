"""Migration 0007: stored cron expressions that the cron bounds refuse are rewritten
to ones that fire as croniter read them before, and each rewrite is on the audit
trail; everything else is left as it was."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from croniter import croniter
from sqlalchemy.ext.asyncio import create_async_engine

import cronwheel.store
from cronwheel.api.routers.jobs import preview_items
from cronwheel.domain.errors import InvalidScheduleError
from cronwheel.domain.spec import MAX_CRON_LENGTH
from cronwheel.store import create_store
from cronwheel.store.schema import jobs, tenants
from cronwheel.timing import parse_cron

MIGRATIONS = Path(cronwheel.store.__file__).parent / "migrations"
T0 = datetime(2999, 1, 1, tzinfo=UTC)
PROBE = ",".join(["1"] * 15_000) + " */5 * * *"  # the outside probe's 30 KB

# (stored, state, rewritten to; None: left alone)
CASES: list[tuple[str, str, str | None]] = [
    ("0 22-2 * * *", "active", "0 0-2,22-23 * * *"),
    ("0 9 * * fri-mon", "paused", "0 9 * * 0-1,5-6"),
    ("*/61 * * * *", "active", "*/60 * * * *"),
    ("0 0 */40 * mon", "active", "0 0 */31 * mon"),  # '*' leads: the day rule holds
    ("58-2/3 * * * *", "active", "2,58 * * * *"),  # croniter's reading, odd as it is
    ("30-10/100 0 12 * * *", "active", "30 0 12 * * *"),
    ("0 9 * * MON,*/9", "active", "0 9 * * 0-1"),
    ("*/5,50-10 * * * *", "active", "*/60,1-10,15,20,25,30,35,40,45,50-59 * * * *"),
    (PROBE, "active", "1 */5 * * *"),
    ("0 9 * * mon", "active", None),
    ("@hourly", "active", None),
    ("5-1 * * * *", "cancelled", None),  # never parsed again
]


async def _alembic(url: str, revision: str) -> None:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    engine = create_async_engine(url)
    try:
        async with engine.begin() as conn:

            def downgrade(sync_conn: sa.Connection) -> None:
                config.attributes["connection"] = sync_conn
                command.downgrade(config, revision)

            await conn.run_sync(downgrade)
    finally:
        await engine.dispose()


async def _insert(url: str, crons: list[tuple[str, str]]) -> tuple[uuid.UUID, list[uuid.UUID]]:
    tenant_id = uuid.uuid4()
    ids = [uuid.uuid4() for _ in crons]
    engine = create_async_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.execute(
                tenants.insert().values(
                    id=tenant_id, name="t", limits={}, webhook_secret="s", created_at=T0
                )
            )
            rows = [
                {
                    "id": job_id,
                    "tenant_id": tenant_id,
                    "name": f"job-{i}",
                    "state": state,
                    "kind": "cron",
                    "schedule": {"cron": cron, "timezone": "UTC", "overlap": "allow"},
                    "template": {"task": "t"},
                    "tags": [],
                    "version": 1,
                    "next_due_at": T0,
                    "created_at": T0,
                    "updated_at": T0,
                }
                for i, (job_id, (cron, state)) in enumerate(zip(ids, crons, strict=True))
            ]
            await conn.execute(jobs.insert(), rows)
    finally:
        await engine.dispose()
    return tenant_id, ids


def _read_before(expr: str) -> tuple[Any, ...]:
    """What the parser before the bounds made of ``expr``: croniter's value sets, and
    the day rule from the day fields' first characters."""
    fields = expr.split()
    expanded = croniter.expand(expr, second_at_beginning=len(fields) == 6)[0]
    named = expanded[5:6] + expanded[:5] if len(fields) == 6 else [[0], *expanded]
    bounds = [(0, 59), (0, 59), (0, 23), (1, 31), (1, 12), (0, 6)]
    sets = [
        frozenset(range(low, high + 1)) if v == ["*"] else frozenset(int(x) for x in v)
        for v, (low, high) in zip(named, bounds, strict=True)
    ]
    sets[5] = frozenset(v % 7 for v in sets[5])
    day_or = not fields[-3].startswith(("*", "?")) and not fields[-1].startswith(("*", "?"))
    return (*sets, day_or)


def _read_now(expr: str) -> tuple[Any, ...]:
    p = parse_cron(expr)
    return (p.seconds, p.minutes, p.hours, p.days, p.months, p.weekdays, p.day_or)


async def test_crons_out_of_bounds_are_rewritten_to_fire_as_before(store_url: str) -> None:
    await _alembic(store_url, "0006")
    tenant_id, ids = await _insert(store_url, [(cron, state) for cron, state, _ in CASES])
    store = create_store(store_url)
    await store.open()
    try:
        await store.migrate()
        events = (await store.events_list(tenant_id, limit=100)).items
        for job_id, (old, _state, new) in zip(ids, CASES, strict=True):
            job = await store.jobs_get(tenant_id, job_id)
            stored = job.schedule["cron"]
            if new is None:
                assert (stored, job.version) == (old, 1)
                assert not [e for e in events if e.job_id == job_id]
                continue
            assert stored == new
            assert len(stored) <= MAX_CRON_LENGTH
            assert job.version == 2 and job.updated_at != T0
            assert job.schedule == {"cron": new, "timezone": "UTC", "overlap": "allow"}
            with pytest.raises(InvalidScheduleError):
                parse_cron(old)
            assert _read_now(new) == _read_before(old), old[:40]
            # What the scheduler and the preview do with a stored schedule works again.
            assert len(preview_items(job, T0, 2)) == 2
            [event] = [e for e in events if e.job_id == job_id]
            assert (event.kind, event.actor) == ("job.schedule_rewritten", "migration 0007")
            assert event.data == {"from": old, "to": new}
    finally:
        await store.close()


async def test_a_cron_that_cannot_be_rewritten_stops_the_upgrade(store_url: str) -> None:
    # Each field breaks a bound, and the values it was read as, written out, are
    # longer than the whole expression may be (274 characters).
    odd = ",".join(str(v) for v in range(1, 60, 2))
    expr = f"{odd},0-1/99 {odd},0-1/99 0-22/2,23-0 1-31/2,31-1 1-11/2,12-1 0-6/2,6-0"
    assert len(expr) <= MAX_CRON_LENGTH
    await _alembic(store_url, "0006")
    _tenant, [job_id] = await _insert(store_url, [(expr, "active")])
    store = create_store(store_url)
    await store.open()
    try:
        with pytest.raises(RuntimeError, match=f"job {job_id}"):
            await store.migrate()
        # Nothing was changed: the upgrade is one transaction. (Read by hand: the
        # store reads the columns of the newest schema, which this one stopped short of.)
        engine = create_async_engine(store_url)
        try:
            async with engine.connect() as conn:
                row = (
                    await conn.execute(
                        sa.select(jobs.c.schedule, jobs.c.version).where(jobs.c.id == job_id)
                    )
                ).one()
        finally:
            await engine.dispose()
        assert (row.schedule["cron"], row.version) == (expr, 1)
    finally:
        await store.close()

"""Migration 0021: runs gain ``missed_at``, jobs ``schedule_stalled_at`` and two
indexes; it goes down and up again cleanly, and a job stored before it reads the
default lateness budget."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from cronwheel.store import create_store
from cronwheel.store.schema import jobs, tenants

from .test_migration_cron_bounds import _alembic
from .test_migrations import _compare

T0 = datetime(2999, 1, 1, tzinfo=UTC)


async def _columns(url: str) -> tuple[set[str], set[str], set[str]]:
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:

            def read(sync: sa.Connection) -> tuple[set[str], set[str], set[str]]:
                inspector = sa.inspect(sync)
                return (
                    {c["name"] for c in inspector.get_columns("runs")},
                    {c["name"] for c in inspector.get_columns("jobs")},
                    {i["name"] for i in inspector.get_indexes("jobs")},
                )

            return await conn.run_sync(read)
    finally:
        await engine.dispose()


async def test_the_migration_goes_down_and_up(store_url: str) -> None:
    await _alembic(store_url, "0020")
    run_columns, job_columns, job_indexes = await _columns(store_url)
    assert "missed_at" not in run_columns and "schedule_stalled_at" not in job_columns
    assert not {"ix_jobs_stalled", "ix_jobs_recurring"} & job_indexes

    # A job stored before 0021: its template has no lateness budget.
    tenant_id, job_id = uuid.uuid4(), uuid.uuid4()
    engine = create_async_engine(store_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(
                tenants.insert().values(
                    id=tenant_id, name="t", limits={}, webhook_secret="s", created_at=T0
                )
            )
            await conn.execute(
                jobs.insert().values(
                    id=job_id,
                    tenant_id=tenant_id,
                    name="old",
                    state="active",
                    kind="cron",
                    schedule={"cron": "0 * * * *", "timezone": "UTC"},
                    template={"task": "t"},
                    tags=[],
                    version=1,
                    created_at=T0,
                    updated_at=T0,
                )
            )
    finally:
        await engine.dispose()

    store = create_store(store_url)
    await store.migrate()
    try:
        await store.open()
        diff, _revision = await _compare(store_url)
        assert diff == []
        run_columns, job_columns, job_indexes = await _columns(store_url)
        assert "missed_at" in run_columns and "schedule_stalled_at" in job_columns
        assert {"ix_jobs_stalled", "ix_jobs_recurring"} <= job_indexes
        job = await store.jobs_get(tenant_id, job_id)
        assert job.template.lateness_budget == 30.0
        assert await store.jobs_stalled(tenant_id) == []
    finally:
        await store.close()

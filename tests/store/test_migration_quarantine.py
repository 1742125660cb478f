"""Migration 0009: runs gain ``quarantined_at``; a stored catch-up window past its new
bound (366 days) is held to it, on the audit trail, so that the job keeps firing
rather than being quarantined at its next firing; nothing else changes."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from cronwheel.api.routers.jobs import preview_items
from cronwheel.domain.bounds import CATCH_UP_WINDOW_MAX
from cronwheel.store import create_store
from cronwheel.store.schema import jobs, tenants

from .test_migration_cron_bounds import _alembic

T0 = datetime(2999, 1, 1, tzinfo=UTC)


def _numbers(schedule: dict[str, object]) -> dict[str, object]:
    """(PostgreSQL's JSON gives 1e300 back as the integer it is.)"""
    return {k: float(v) if isinstance(v, int | float) else v for k, v in schedule.items()}


# (kind, schedule, state, window afterwards; None: left as stored)
CASES: list[tuple[str, dict[str, object], str, float | None]] = [
    ("cron", {"cron": "0 * * * *", "catch_up_window": 1e300}, "active", CATCH_UP_WINDOW_MAX),
    ("interval", {"interval": 60, "catch_up_window": 400 * 86400.0}, "paused", CATCH_UP_WINDOW_MAX),
    ("cron", {"cron": "0 * * * *", "catch_up_window": 7200.0}, "active", None),
    ("cron", {"cron": "0 * * * *"}, "active", None),
    ("cron", {"cron": "0 * * * *", "catch_up_window": 1e300}, "cancelled", None),
]


async def test_catch_up_windows_past_the_bound_are_held_to_it(store_url: str) -> None:
    await _alembic(store_url, "0008")
    tenant_id = uuid.uuid4()
    ids = [uuid.uuid4() for _ in CASES]
    engine = create_async_engine(store_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(
                tenants.insert().values(
                    id=tenant_id, name="t", limits={}, webhook_secret="s", created_at=T0
                )
            )
            await conn.execute(
                jobs.insert(),
                [
                    {
                        "id": job_id,
                        "tenant_id": tenant_id,
                        "name": f"job-{i}",
                        "state": state,
                        "kind": kind,
                        "schedule": schedule,
                        "template": {"task": "t"},
                        "tags": [],
                        "version": 1,
                        "next_due_at": T0,
                        "created_at": T0,
                        "updated_at": T0,
                    }
                    for i, (job_id, (kind, schedule, state, _)) in enumerate(
                        zip(ids, CASES, strict=True)
                    )
                ],
            )
    finally:
        await engine.dispose()

    store = create_store(store_url)
    await store.open()
    try:
        await store.migrate()
        events = (await store.events_list(tenant_id, limit=100)).items
        for job_id, (_kind, schedule, _state, window) in zip(ids, CASES, strict=True):
            job = await store.jobs_get(tenant_id, job_id)
            if window is None:
                assert (_numbers(job.schedule), job.version) == (_numbers(schedule), 1)
                assert not [e for e in events if e.job_id == job_id]
                continue
            assert job.schedule == {**schedule, "catch_up_window": window}, job.schedule
            assert job.version == 2
            assert len(preview_items(job, T0, 2)) == 2  # the stored schedule validates
            [event] = [e for e in events if e.job_id == job_id]
            assert (event.kind, event.actor) == ("job.schedule_rewritten", "migration 0009")
            change = event.data["catch_up_window"]
            assert float(change["before"]) == schedule["catch_up_window"]
            assert change["after"] == window
        # The new column is there and empty.
        engine = create_async_engine(store_url)
        try:
            async with engine.connect() as conn:
                count = (
                    await conn.execute(
                        sa.text("SELECT count(*) FROM runs WHERE quarantined_at IS NOT NULL")
                    )
                ).scalar_one()
        finally:
            await engine.dispose()
        assert count == 0
    finally:
        await store.close()

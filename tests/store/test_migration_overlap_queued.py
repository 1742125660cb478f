"""Migration 0010: runs gain ``overlap_queued``; the runs waiting behind a running one
of their job (marked until then only by their reason's text) are marked once."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from cronwheel.domain.states import RunState
from cronwheel.domain.template import RunTemplate
from cronwheel.store import create_store
from cronwheel.store.rows import new_run_row
from cronwheel.store.schema import jobs, runs, tenants

from .test_migration_cron_bounds import _alembic

T0 = datetime(2999, 1, 1, tzinfo=UTC)
TEMPLATE = {
    "task": "t",
    "priority": 2,
    "pool": "default",
    "requires": [],
    "tags": [],
    "payload": {},
    "retry": {"max_attempts": 1},
    "timeout": 60.0,
    "heartbeat_timeout": 25.0,
}
# (state, reason, marked afterwards)
CASES = [
    (RunState.SCHEDULED, "queued behind the run still going (overlap=queue_one)", True),
    (RunState.SCHEDULED, "job paused", False),
    (RunState.SCHEDULED, None, False),
    (RunState.DISPATCHED, "queued behind the run still going (overlap=queue_one)", False),
]


async def test_waiting_runs_are_marked_from_their_reason(store_url: str) -> None:
    await _alembic(store_url, "0009")
    tenant_id, job_id = uuid.uuid4(), uuid.uuid4()
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
                jobs.insert().values(
                    id=job_id,
                    tenant_id=tenant_id,
                    name="j",
                    state="active",
                    kind="cron",
                    schedule={"cron": "0 * * * *", "overlap": "queue_one"},
                    template=TEMPLATE,
                    tags=[],
                    version=1,
                    next_due_at=T0,
                    created_at=T0,
                    updated_at=T0,
                )
            )
            for i, (run_id, (state, reason, _)) in enumerate(zip(ids, CASES, strict=True)):
                row = new_run_row(
                    run_id=run_id,
                    tenant_id=tenant_id,
                    job_id=job_id,
                    name="j",
                    template=RunTemplate.from_json(TEMPLATE),
                    due_at=T0.replace(hour=i),
                    due_local=None,
                    shard=0,
                    at=T0,
                    origin="schedule",
                    state=state,
                )
                del row["route_tags"]  # a later column than this revision's
                dispatched = T0 if state is RunState.DISPATCHED else None
                await conn.execute(
                    runs.insert().values(**{**row, "reason": reason, "dispatched_at": dispatched})
                )
        await create_store(store_url).migrate()
        async with engine.connect() as conn:
            marked = {
                r.id: r.overlap_queued
                for r in await conn.execute(sa.select(runs.c.id, runs.c.overlap_queued))
            }
    finally:
        await engine.dispose()
    assert [marked[i] for i in ids] == [want for _, _, want in CASES]

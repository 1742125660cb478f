"""Migration 0011: workers gain ``tasks`` and runs ``route_tags``. A worker registered
before declares no tasks (it takes any, as it did), a run made before has no route tags,
and a job stored before reads as having none: every one of them routes as before."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from sqlalchemy.ext.asyncio import create_async_engine

from cronwheel.domain.states import RunState
from cronwheel.domain.template import RunTemplate
from cronwheel.store import create_store
from cronwheel.store.rows import new_run_row
from cronwheel.store.schema import jobs, runs, tenants, workers

from .test_migration_cron_bounds import _alembic

T0 = datetime(2999, 1, 1, tzinfo=UTC)
TEMPLATE = {
    "task": "t",
    "priority": 2,
    "pool": "default",
    "requires": [],
    "tags": ["red"],
    "payload": {},
    "retry": {"max_attempts": 1},
    "timeout": 60.0,
    "heartbeat_timeout": 25.0,
}


async def test_older_workers_take_any_task_and_older_runs_have_no_route_tags(
    store_url: str,
) -> None:
    await _alembic(store_url, "0010")
    tenant_id, job_id, run_id, worker_id = (uuid.uuid4() for _ in range(4))
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
                    kind="at",
                    schedule={"at": T0.isoformat()},
                    template=TEMPLATE,
                    tags=["red"],
                    version=1,
                    next_due_at=T0,
                    created_at=T0,
                    updated_at=T0,
                )
            )
            row = new_run_row(
                run_id=run_id,
                tenant_id=tenant_id,
                job_id=job_id,
                name="j",
                template=RunTemplate.from_json(TEMPLATE),
                due_at=T0,
                due_local=None,
                shard=0,
                at=T0,
                state=RunState.DISPATCHED,
            )
            del row["route_tags"]  # not a column yet
            await conn.execute(runs.insert().values(**row, dispatched_at=T0))
            await conn.execute(
                workers.insert().values(
                    id=worker_id,
                    tenant_id=tenant_id,
                    pool="default",
                    capabilities=[],
                    tags=[],
                    capacity=1,
                    registered_at=T0,
                    last_seen_at=T0,
                )
            )
    finally:
        await engine.dispose()

    store = create_store(store_url)
    await store.open()
    try:
        await store.migrate()
        worker = await store.workers_get(worker_id)
        assert worker.tasks is None
        run = await store.runs_get(tenant_id, run_id)
        assert (run.route_tags, run.tags) == ([], ["red"])
        assert (await store.jobs_get(tenant_id, job_id)).template.route_tags == []
        # The job's tags are labels only: the untagged worker leases its run.
        [leased] = await store.attempts_lease(worker=worker, max=1, now=T0)
        assert leased.run_id == run_id
    finally:
        await store.close()

"""A recurring job end to end on real processes: created through the HTTP API, fired by
a separate scheduler process occurrence after occurrence, run by a separate worker."""

from __future__ import annotations

import itertools
import uuid
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from cronwheel.store import RunFilter, create_store
from cronwheel.testing import Cluster

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

HERE = Path(__file__).resolve().parent


async def test_every_second_cron_job_keeps_running(pg_url: str, tmp_path: Path) -> None:
    cluster = Cluster(database_url=pg_url, workdir=tmp_path, python_path=[HERE])
    store = create_store(pg_url)
    await store.open()
    try:
        cluster.start("api", "api", "--port", str(cluster.port))
        cluster.start("scheduler", "scheduler", "--node-id", "e2e-cron")
        await cluster.wait_ready()
        tenant_id, operator_key, worker_key = await cluster.tenant("e2e-cron")
        cluster.start_workers(1, worker_key, pool="e2e", module="e2e_tasks", concurrency=10)
        headers = {"Authorization": f"Bearer {operator_key}"}
        async with httpx.AsyncClient(base_url=cluster.url, headers=headers) as client:
            r = await client.post(
                "/v1/jobs",
                json={
                    "name": "every-second",
                    "schedule": {"cron": "* * * * * *", "timezone": "Asia/Kolkata"},
                    "task": "e2e.echo",
                    "payload": {"n": 1},
                    "pool": "e2e",
                },
            )
            assert r.status_code == 201, r.text
            job_id = uuid.UUID(r.json()["id"])

        tenant = uuid.UUID(tenant_id)
        succeeded: list[int] = [0]

        async def five_succeeded() -> bool:
            done = await store.runs_list(
                tenant, filter=RunFilter(job_id=job_id, states=["SUCCESS"]), limit=100
            )
            succeeded[0] = len(done.items)
            return succeeded[0] >= 5

        await cluster.wait_until(
            five_succeeded, 60, what=lambda: f"5 runs succeeded (only {succeeded[0]})", interval=0.2
        )

        every = await store.runs_list(tenant, filter=RunFilter(job_id=job_id), limit=1000)
        runs = sorted(every.items, key=lambda r: r.due_at)
        gaps = {b.due_at - a.due_at for a, b in itertools.pairwise(runs)}
        assert gaps == {timedelta(seconds=1)}, gaps  # consecutive seconds, none twice
        assert all(r.origin == "schedule" and r.attempt <= 1 for r in runs)
        assert all(r.due_local and r.due_local.endswith("+05:30") for r in runs)
        pending = await store.runs_list(
            tenant, filter=RunFilter(job_id=job_id, states=["SCHEDULED"]), limit=10
        )
        assert len(pending.items) == 1  # exactly one occurrence ahead
    finally:
        cluster.stop()
        await store.close()

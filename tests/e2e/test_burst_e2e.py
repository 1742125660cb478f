"""A burst through real processes with the default settings: ``cronwheel api``, two
``cronwheel scheduler`` nodes and two ``cronwheel worker`` processes on PostgreSQL.

300 runs due at one instant are a burst on each node: dispatched ahead, reserved by the
workers, started at the instant. Ten of them are cancelled while reserved, before the
instant: those never start. Every other run starts once, never before its instant."""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from cronwheel.store import Store, create_store
from cronwheel.store.schema import runs as runs_table
from cronwheel.store.sql import SqlStore
from cronwheel.testing import Cluster

from . import history

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

HERE = Path(__file__).resolve().parent
RUNS = 300
CANCELLED = 10
AHEAD = 14.0  # seconds from creating the runs to their instant (the lead is 5 s)


async def _create(cluster: Cluster, key: str, due: datetime) -> list[str]:
    """The jobs due at ``due``, in one batch; returns their first runs' ids."""
    body = {
        "jobs": [
            {
                "name": f"burst-{n}",
                "schedule": {"at": due.isoformat()},
                "task": "e2e.echo",
                "payload": {"n": n},
                "pool": "e2e",
            }
            for n in range(RUNS)
        ]
    }
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=cluster.url, headers=headers, timeout=60) as client:
        r = await client.post("/v1/jobs/batch", json=body)
        assert r.status_code == 201, r.text
        return [job["first_run_id"] for job in r.json()["items"]]


async def _reserved(store: Store, run_ids: list[uuid.UUID]) -> int:
    """How many of ``run_ids`` are held by a worker's reservation right now."""
    assert isinstance(store, SqlStore)
    async with store.engine.connect() as conn:
        stmt = sa.select(sa.func.count()).where(
            runs_table.c.id.in_(run_ids),
            runs_table.c.state == "DISPATCHED",
            runs_table.c.reserved_token.is_not(None),
        )
        return int((await conn.execute(stmt)).scalar_one())


async def test_a_burst_is_reserved_ahead_and_a_cancel_before_the_instant_wins(
    pg_url: str, tmp_path: Path
) -> None:
    cluster = Cluster(database_url=pg_url, workdir=tmp_path, python_path=[HERE])
    store = create_store(pg_url)
    await store.open()
    try:
        cluster.start("api", "api", "--port", str(cluster.port))
        cluster.start_scheduler("node-a")
        cluster.start_scheduler("node-b")
        await cluster.wait_ready()
        tenant_id, operator_key, worker_key = await cluster.tenant("burst")
        cluster.start_workers(2, worker_key, pool="e2e", module="e2e_tasks", concurrency=RUNS)
        due = (await store.db_now() + timedelta(seconds=AHEAD)).replace(microsecond=0)
        run_ids = [uuid.UUID(r) for r in await _create(cluster, operator_key, due)]
        tenant = uuid.UUID(tenant_id)

        # Dispatched ahead and reserved by the workers, well before the instant.
        async def all_reserved() -> bool:
            return await _reserved(store, run_ids) == RUNS

        await cluster.wait_until(all_reserved, AHEAD - 2, what="every run reserved")
        assert await store.db_now() < due - timedelta(seconds=1)
        victims = run_ids[:CANCELLED]
        headers = {"Authorization": f"Bearer {operator_key}"}
        async with httpx.AsyncClient(base_url=cluster.url, headers=headers) as client:
            for run_id in victims:
                r = await client.post(f"/v1/runs/{run_id}/cancel")
                assert r.status_code == 200, r.text
                assert r.json()["state"] == "CANCELLED"
        assert await store.db_now() < due  # every cancel came before the instant

        async def all_finished() -> bool:
            counts = await store.runs_count_by_state()
            return counts["SUCCESS"] + counts["CANCELLED"] >= RUNS

        await cluster.wait_until(all_finished, 60, what="every run finished")
        await asyncio.sleep(0.5)  # nothing further may happen to them

        runs = {run_id: await store.runs_get(tenant, run_id) for run_id in run_ids}
        for run_id in victims:
            run = runs[run_id]
            assert (run.state.value, run.attempt, run.started_at) == ("CANCELLED", 0, None)
            assert await store.attempts_list(tenant, run_id=run_id) == []
        ran = [runs[run_id] for run_id in run_ids[CANCELLED:]]
        assert all(r.state.value == "SUCCESS" and r.attempt == 1 for r in ran)
        assert all(r.result == {"echo": r.payload["n"]} for r in ran)
        # Dispatched ahead (a burst), started at or after the instant, never before.
        for r in ran:
            assert r.dispatched_at is not None and r.dispatched_at < due, r
            assert r.started_at is not None and r.started_at >= due, r
            [attempt] = await store.attempts_list(tenant, run_id=r.id)
            assert attempt.started_at >= due and attempt.state.value == "SUCCEEDED"

        transitions = await history.transitions(store, tenant)
        fired = [(None, "SCHEDULED"), ("SCHEDULED", "DISPATCHED")]
        for run_id in victims:
            assert transitions[run_id] == [*fired, ("DISPATCHED", "CANCELLED")]
        for r in ran:
            assert transitions[r.id] == [
                *fired,
                ("DISPATCHED", "RUNNING"),
                ("RUNNING", "SUCCESS"),
            ]
    finally:
        cluster.stop()
        await store.close()

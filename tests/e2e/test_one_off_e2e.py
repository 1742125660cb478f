"""Real processes end to end: ``cronwheel api`` and ``cronwheel scheduler`` on PostgreSQL,
a separate ``cronwheel worker``; 1,000 one-off jobs through the HTTP API, each reaching
SUCCESS exactly once with its events in order."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from cronwheel.store import Store, create_store
from cronwheel.testing import Cluster

from . import history

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

HERE = Path(__file__).resolve().parent
JOBS = 1000


async def _create_jobs(cluster: Cluster, key: str, store: Store) -> list[str]:
    now = await store.db_now()
    headers = {"Authorization": f"Bearer {key}"}
    gate = asyncio.Semaphore(16)
    ids: list[str] = []

    async with httpx.AsyncClient(base_url=cluster.url, headers=headers, timeout=30) as client:

        async def create(n: int) -> None:
            due = now + timedelta(seconds=4 + (n % 40) / 10)  # spread over 4 s
            body = {
                "name": f"e2e-{n}",
                "schedule": {"at": due.isoformat()},
                "task": "e2e.echo",
                "payload": {"n": n},
                "pool": "e2e",
            }
            async with gate:
                r = await client.post("/v1/jobs", json=body)
            assert r.status_code == 201, r.text
            ids.append(r.json()["id"])

        await asyncio.gather(*(create(n) for n in range(JOBS)))
    return ids


async def _finished(store: Store, counts: dict[str, int]) -> bool:
    """Whether every run has finished; ``counts`` gets the count of each state."""
    counts.update(await store.runs_count_by_state())
    return counts["SUCCESS"] + counts["FAILED"] + counts["DEAD_LETTER"] >= JOBS


async def test_thousand_one_off_jobs_run_exactly_once(pg_url: str, tmp_path: Path) -> None:
    # No rate limit: the jobs are created one request each, faster than an operator key
    # may on a quick machine, and a 429 would stand in for the answer under test.
    cluster = Cluster(
        database_url=pg_url,
        workdir=tmp_path,
        python_path=[HERE],
        extra_env={"CRONWHEEL_RATE_LIMIT": "0"},
    )
    store = create_store(pg_url)
    await store.open()
    try:
        cluster.start("api", "api", "--port", str(cluster.port))
        cluster.start("scheduler", "scheduler", "--node-id", "e2e-node")
        await cluster.wait_ready()
        tenant_id, operator_key, worker_key = await cluster.tenant("e2e")
        cluster.start_workers(1, worker_key, pool="e2e", module="e2e_tasks", concurrency=100)
        job_ids = await _create_jobs(cluster, operator_key, store)
        assert len(set(job_ids)) == JOBS
        counts: dict[str, int] = {}
        await cluster.wait_until(
            lambda: _finished(store, counts),
            120,
            what=lambda: f"every run to finish: {counts}",
            interval=0.2,
        )

        tenant = uuid.UUID(tenant_id)
        runs = []
        cursor = None
        while True:
            page = await store.runs_list(tenant, cursor=cursor, limit=500)
            runs += page.items
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        assert len(runs) == JOBS
        assert {str(r.job_id) for r in runs} == set(job_ids)
        assert all(r.state.value == "SUCCESS" for r in runs)
        assert all(r.attempt == 1 for r in runs)
        assert all(r.result == {"echo": r.payload["n"]} for r in runs)
        # Dispatched (and reserved) ahead of their instant, but never begun before it.
        early = min((r.started_at - r.due_at).total_seconds() for r in runs if r.started_at)
        assert early >= 0, f"started {-early:.3f} s early"

        transitions = await history.transitions(store, tenant)
        expected = [
            (None, "SCHEDULED"),
            ("SCHEDULED", "DISPATCHED"),
            ("DISPATCHED", "RUNNING"),
            ("RUNNING", "SUCCESS"),
        ]
        wrong = {run_id: t for run_id, t in transitions.items() if t != expected}
        assert not wrong, (
            f"{len(wrong)} runs with other histories, e.g. {next(iter(wrong.items()))}"
        )
        assert set(transitions) == {r.id for r in runs}
    finally:
        cluster.stop()
        await store.close()

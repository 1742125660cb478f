"""What ``max_pending_runs`` costs a create: a tenant with P pending runs (one-off jobs
due a day ahead, loaded through the store in batches of 1,000, then vacuumed), and N
single-job creates (``jobs_create_many`` with one job, as ``POST /v1/jobs`` does) timed
three ways: without the limit, with a limit above the count (the count runs to the
end of the tenant's pending runs), and at the limit (refused); and the count's plan
(EXPLAIN ANALYZE), which reads the index (tenant_id, state, id) alone.

    python bench/pending_limit.py --pending 100000 --creates 200
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from datetime import datetime, timedelta
from pathlib import Path

import asyncpg
from harness import console, fresh_database, open_store, percentiles

from cronwheel.domain.errors import TenantLimitError
from cronwheel.domain.model import NewJob
from cronwheel.domain.spec import JobSpec
from cronwheel.store import Store


def one_job(i: int, due: datetime) -> NewJob:
    spec = JobSpec.model_validate(
        {"name": f"j{i}", "schedule": {"delay": 86_400}, "task": "bench.noop"}
    )
    return NewJob(spec=spec, first_due_at=due, idempotency_key=None, actor="bench")


async def timed_creates(
    store: Store, tenant_id: uuid.UUID, n: int, *, refused: bool
) -> list[float]:
    due = await store.db_now() + timedelta(days=1)
    out: list[float] = []
    for i in range(n):
        start = time.perf_counter()
        try:
            await store.jobs_create_many(tenant_id, jobs=[one_job(i, due)])
            assert not refused
        except TenantLimitError:
            assert refused
        out.append((time.perf_counter() - start) * 1000)
    return out


async def main(args: argparse.Namespace) -> dict[str, object]:
    async with fresh_database("postgresql", Path(".")) as url:
        store = await open_store(url)
        await store.migrate()
        try:
            tenant = await store.tenants_create(name="big", limits={})
            due = await store.db_now() + timedelta(days=1)
            for start in range(0, args.pending, 1000):
                size = min(1000, args.pending - start)
                batch = [one_job(start + i, due) for i in range(size)]
                await store.jobs_create_many(tenant.id, jobs=batch)
            conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
            await conn.execute("VACUUM ANALYZE runs")
            # The count the limit runs (store.sql.pending.pending_admit), as the planner does it.
            plan = await conn.fetch(
                "EXPLAIN (ANALYZE, BUFFERS) SELECT count(*) FROM (SELECT runs.id FROM runs"
                " WHERE runs.tenant_id = $1 AND runs.state IN ('SCHEDULED', 'DISPATCHED')"
                " LIMIT $2) AS capped",
                tenant.id,
                100_000_001,
            )
            await conn.close()
            explained = [row[0] for row in plan]
            console.print("\n".join(explained))
            phases: dict[str, list[float]] = {}
            phases["no limit"] = await timed_creates(store, tenant.id, args.creates, refused=False)
            await store.tenants_update(tenant.id, limits={"max_pending_runs": 100_000_000})
            phases["limit above"] = await timed_creates(
                store, tenant.id, args.creates, refused=False
            )
            pending = args.pending + 2 * args.creates
            await store.tenants_update(tenant.id, limits={"max_pending_runs": pending})
            phases["at the limit"] = await timed_creates(
                store, tenant.id, args.creates, refused=True
            )
        finally:
            await store.close()
    result: dict[str, object] = {
        "pending": args.pending,
        "creates": args.creates,
        "count_plan": explained,
    }
    for name, samples in phases.items():
        result[name] = percentiles(samples)
        console.print(f"{name}: ms per create {percentiles(samples)}")
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pending", type=int, default=100_000)
    parser.add_argument("--creates", type=int, default=200)
    print(json.dumps(asyncio.run(main(parser.parse_args()))), file=sys.stdout)

"""Pool status: what ``GET /v1/pools`` and the backlog gauges cost with a large backlog.

Tenant A has R ready runs (DISPATCHED, not reserved) and D due ones (SCHEDULED, fire
time come) in pool ``default``, and F SCHEDULED runs due later; tenant B has 200 P0
runs ready and 200 due in the same pool; W workers are live. Times ``pools_status``
as the admin sees it and as B sees it, and ``pools_capacity`` (what a dispatcher reads),
each ``--repeat`` times after a VACUUM ANALYZE, and shows the plans of the backlog
statements with the buffers they read (B's must read B's rows, not A's).

    python bench/pool_status.py --ready 100000 --due 100000 --future 1000000
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
from harness import PG_ADMIN, console, fresh_database, open_store, report, workdir
from sqlalchemy.dialects import postgresql

from cronwheel.domain.audit import Actor
from cronwheel.domain.new_job import JobLimits, new_job
from cronwheel.domain.spec import JobSpec
from cronwheel.store import Store
from cronwheel.store.sql import SqlStore
from cronwheel.store.sql.pools import backlog_statements

NOW = datetime(2031, 1, 6, 9, 0, tzinfo=UTC)


async def seed(store: Store, url: str, args: argparse.Namespace) -> tuple[uuid.UUID, uuid.UUID]:
    """Two tenants with one job each, then their runs copied from the job's first run."""
    ids = []
    templates: dict[uuid.UUID, uuid.UUID] = {}
    for name in ("tenant-a", "tenant-b"):
        tenant = await store.tenants_create(name=name, limits={}, now=NOW)
        spec = JobSpec.model_validate(
            {"name": "j", "schedule": {"at": NOW.isoformat()}, "task": "t"}
        )
        job = new_job(
            spec, now=NOW - timedelta(seconds=1), limits=JobLimits(), actor=Actor("bench")
        )
        [(_job, run, _created)] = await store.jobs_create_many(tenant.id, jobs=[job], now=NOW)
        assert run is not None
        ids.append(tenant.id)
        templates[tenant.id] = run.id
    for _ in range(args.workers):
        await store.workers_register(
            None, pool="default", capabilities=[], tags=[], capacity=50, now=NOW
        )
    conn = await asyncpg.connect(url.replace("postgresql+asyncpg", "postgresql"))
    try:
        cols = [
            r["column_name"]
            for r in await conn.fetch(
                "SELECT column_name FROM information_schema.columns WHERE table_name = 'runs'"
            )
        ]
        made = {"id", "shard", "state", "due_at", "fire_at", "priority", "dispatched_at"}
        kept = [c for c in cols if c not in made]
        copy = ", ".join(kept)

        async def add(
            tenant: uuid.UUID, count: int, state: str, priority: int, ahead: float
        ) -> None:
            await conn.execute(
                f"""INSERT INTO runs (id, shard, state, due_at, fire_at, priority, dispatched_at,
                                      {copy})
                    SELECT gen_random_uuid(), i % 256, $2::varchar,
                           $3::timestamptz + i * interval '1 millisecond',
                           $3::timestamptz + i * interval '1 millisecond', $4,
                           CASE WHEN $2::varchar = 'DISPATCHED' THEN $3::timestamptz END, {copy}
                    FROM runs, generate_series(1, $5) AS i
                    WHERE runs.id = $1""",
                templates[tenant],
                state,
                NOW + timedelta(seconds=ahead) - timedelta(milliseconds=count + 1),
                priority,
                count,
            )

        a, b = ids
        await add(a, args.ready, "DISPATCHED", 2, 0)
        await add(a, args.due, "SCHEDULED", 2, -3600)
        await add(a, args.future, "SCHEDULED", 2, 86400 * 30)
        await add(b, 200, "DISPATCHED", 0, -7200)
        await add(b, 200, "SCHEDULED", 0, -10800)
        await conn.execute("VACUUM ANALYZE runs")
        await conn.execute("VACUUM ANALYZE workers")
    finally:
        await conn.close()
    return a, b


async def timed(call: Callable[[], Awaitable[Any]], repeat: int) -> dict[str, float]:
    await call()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        await call()
        times.append((time.perf_counter() - started) * 1000)
    times.sort()
    return {
        "median_ms": round(statistics.median(times), 2),
        "p95_ms": round(times[int(0.95 * (len(times) - 1))], 2),
        "max_ms": round(times[-1], 2),
    }


async def plans(store: SqlStore, tenant: uuid.UUID | None, names: list[str] | None) -> list[str]:
    out = []
    for stmt in backlog_statements(store.driver, tenant, None, NOW, ready_pools=names):
        compiled = stmt.compile(
            dialect=postgresql.asyncpg.dialect(),  # type: ignore[attr-defined]
            compile_kwargs={"render_postcompile": True},
        )
        values = compiled.construct_params()
        params = tuple(values[k] for k in compiled.positiontup or [])
        async with store.engine.connect() as conn:
            rows = await conn.exec_driver_sql(
                "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + str(compiled), params
            )
            out.append("\n".join(r[0] for r in rows))
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ready", type=int, default=100_000)
    parser.add_argument("--due", type=int, default=100_000)
    parser.add_argument("--future", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    with workdir() as wd:
        async with fresh_database("postgresql", wd) as url:
            store = await open_store(url)
            try:
                await store.migrate()
                a, b = await seed(store, url, args)
                now = NOW + timedelta(seconds=1)
                result: dict[str, Any] = {"args": vars(args), "postgres": PG_ADMIN.split("@")[-1]}
                result["status_admin"] = await timed(
                    lambda: store.pools_status(None, now=now), args.repeat
                )
                result["status_tenant_b"] = await timed(
                    lambda: store.pools_status(b, now=now), args.repeat
                )
                result["status_tenant_a"] = await timed(
                    lambda: store.pools_status(a, now=now), args.repeat
                )
                result["capacity"] = await timed(lambda: store.pools_capacity(now=now), args.repeat)
                [status] = await store.pools_status(None, now=now)
                result["backlog"] = {
                    f"{x.tenant_name} P{x.priority}": [x.ready, x.due] for x in status.backlog
                }
                assert isinstance(store, SqlStore)
                result["plans_tenant_b"] = await plans(store, b, ["default"])
                result["plans_admin"] = await plans(store, None, None)
            finally:
                await store.close()
    for name in ("plans_tenant_b", "plans_admin"):
        for plan in result[name]:
            console.print(f"[bold]{name}[/bold]\n{plan}")
    report(
        "pool status",
        result,
        [
            (k, str(v["median_ms"]), str(v["p95_ms"]), str(v["max_ms"]))
            for k, v in result.items()
            if isinstance(v, dict) and "median_ms" in v
        ],
        ("call", "median ms", "p95 ms", "max ms"),
    )


if __name__ == "__main__":
    asyncio.run(main())

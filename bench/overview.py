"""The overview: what ``GET /v1/overview`` costs with a large history of runs.

N runs over T tenants (run *i* belongs to tenant *i* mod T), due uniformly over the
last ``--days`` days up to now (mostly SUCCESS, some FAILED, DEAD_LETTER, CANCELLED,
SKIPPED, with dispatch and start lateness drawn at random), plus ``--future`` SCHEDULED
runs due over the next ``--days`` days; then one ``cronwheel api`` process (PostgreSQL)
and ``GET /v1/overview`` timed at the client, ``--repeat`` times each, as the admin
(every tenant), with the admin naming one tenant, and with a tenant's key, for
``--minutes`` (repeatable) windows. Also times ``store.runs_overview`` alone and prints
the plan of its statement for one tenant (it must read the window's rows through an
index range, not the table).

The window's ranges need an index on ``runs (tenant_id, due_at)``: if the schema has
none, the bench creates ``ix_runs_tenant_due (tenant_id, due_at, id)`` (and says so).

    python bench/overview.py --runs 1000000 --tenants 10 --minutes 60 --minutes 1440
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from harness import PG_ADMIN, console, fresh_database, open_store, report, workdir
from sqlalchemy.dialects import postgresql

from cronwheel.api.auth import generate_key
from cronwheel.domain.new_job import JobLimits, new_job
from cronwheel.domain.spec import JobSpec
from cronwheel.store import Store
from cronwheel.store.schema import runs as runs_table
from cronwheel.store.sql import SqlStore

ADMIN_KEY = "bench-overview-admin-key"
INDEX = "CREATE INDEX IF NOT EXISTS ix_runs_tenant_due ON runs (tenant_id, due_at, id)"

# State by i % 100, and whether a run in it was dispatched and started.
STATE_OF = """CASE WHEN i % 100 < 88 THEN 'SUCCESS' WHEN i % 100 < 93 THEN 'FAILED'
                   WHEN i % 100 < 95 THEN 'DEAD_LETTER' WHEN i % 100 < 98 THEN 'CANCELLED'
                   ELSE 'SKIPPED' END"""
RAN = "i % 100 < 95"


async def seed(store: Store, url: str, args: argparse.Namespace, now: datetime) -> list[str]:
    """T tenants with one job each and an operator key; the runs copied from each job's
    first run in one INSERT … SELECT per tenant and kind. Returns the tenants' keys."""
    keys: list[str] = []
    templates: dict[uuid.UUID, uuid.UUID] = {}
    for t in range(args.tenants):
        tenant = await store.tenants_create(name=f"tenant-{t}", limits={}, now=now)
        key, key_hash, prefix = generate_key()
        await store.api_keys_create(
            tenant.id, role="operator", key_hash=key_hash, prefix=prefix, now=now
        )
        keys.append(key)
        first = now + timedelta(days=365)  # a first run far off, never in a window
        spec = JobSpec.model_validate(
            {"name": "j", "schedule": {"at": first.isoformat()}, "task": "t"}
        )
        job = new_job(spec, now=now, limits=JobLimits(), actor=None)
        [(_job, run, _created)] = await store.jobs_create_many(tenant.id, jobs=[job], now=now)
        assert run is not None
        templates[tenant.id] = run.id
    conn = await asyncpg.connect(url.replace("postgresql+asyncpg", "postgresql"))
    try:
        cols = [
            r["column_name"]
            for r in await conn.fetch(
                "SELECT column_name FROM information_schema.columns WHERE table_name = 'runs'"
            )
        ]
        made = {
            "id",
            "shard",
            "state",
            "due_at",
            "fire_at",
            "dispatched_at",
            "started_at",
            "finished_at",
            "attempt",
        }
        copy = ", ".join(c for c in cols if c not in made)
        span = timedelta(days=args.days).total_seconds()
        per_tenant = args.runs // args.tenants
        future = args.future // args.tenants
        started = time.perf_counter()
        for template in templates.values():
            # History: due from now - days to now, every span / count seconds.
            await conn.execute(
                f"""INSERT INTO runs (id, shard, state, due_at, fire_at, dispatched_at,
                                      started_at, finished_at, attempt, {copy})
                    SELECT gen_random_uuid(), i % 256, {STATE_OF}, due, due,
                           CASE WHEN {RAN} THEN due + random() * interval '200 ms' END,
                           CASE WHEN {RAN} THEN due + interval '200 ms'
                                + random() * interval '2 s' END,
                           due + interval '3 s', CASE WHEN {RAN} THEN 1 ELSE 0 END, {copy}
                    FROM runs,
                         LATERAL (SELECT i, $2::timestamptz + i * ($3 * interval '1 s')
                                  AS due FROM generate_series(0, $4 - 1) AS i) AS g
                    WHERE runs.id = $1""",
                template,
                now - timedelta(seconds=span),
                span / per_tenant,
                per_tenant,
            )
            if future:
                await conn.execute(
                    f"""INSERT INTO runs (id, shard, state, due_at, fire_at, attempt, {copy})
                        SELECT gen_random_uuid(), i % 256, 'SCHEDULED', due, due, 0, {copy}
                        FROM runs,
                             LATERAL (SELECT i, $2::timestamptz + i * ($3 * interval '1 s')
                                      AS due FROM generate_series(1, $4) AS i) AS g
                        WHERE runs.id = $1""",
                    template,
                    now + timedelta(minutes=5),
                    span / future,
                    future,
                )
        console.print(f"seeded in {time.perf_counter() - started:.1f} s")
        await conn.execute("VACUUM ANALYZE runs")
    finally:
        await conn.close()
    return keys


async def ensure_index(url: str) -> str | None:
    """The index the window's ranges read, created when the schema has none."""
    conn = await asyncpg.connect(url.replace("postgresql+asyncpg", "postgresql"))
    try:
        found = await conn.fetchval(
            "SELECT indexname FROM pg_indexes WHERE tablename = 'runs' "
            "AND indexdef LIKE '%(tenant_id, due_at%'"
        )
        if found is None:
            await conn.execute(INDEX)
            return "ix_runs_tenant_due (created by the bench)"
        return str(found)
    finally:
        await conn.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_api(url: str, wd: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {
        **os.environ,
        "CRONWHEEL_DATABASE_URL": url,
        "CRONWHEEL_ADMIN_KEY": ADMIN_KEY,
        "CRONWHEEL_DATA_DIR": str(wd / "api"),
        "CRONWHEEL_RATE_LIMIT": "0",
    }
    args = [sys.executable, "-m", "cronwheel", "api", "--port", str(port), "--log-level", "warning"]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                return proc, base
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("the API did not become ready")


async def timed(call: Callable[[], Awaitable[Any]], repeat: int) -> dict[str, float]:
    await call()  # warm: connections, plans
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        await call()
        times.append((time.perf_counter() - started) * 1000)
    times.sort()
    return {
        "median_ms": round(statistics.median(times), 1),
        "p95_ms": round(times[int(0.95 * (len(times) - 1))], 1),
        "max_ms": round(times[-1], 1),
    }


async def plan(store: SqlStore, tenant: uuid.UUID, now: datetime, minutes: int) -> str:
    since = now.replace(second=0, microsecond=0) - timedelta(minutes=minutes - 1)
    window = (
        store.driver.id_in(runs_table.c.tenant_id, [tenant])
        & (runs_table.c.due_at >= since)
        & (runs_table.c.due_at < now)
    )
    compiled = store._overview_sql(window, since).compile(
        dialect=postgresql.asyncpg.dialect(),  # type: ignore[attr-defined]
        compile_kwargs={"render_postcompile": True},
    )
    values = compiled.construct_params()
    params = tuple(values[k] for k in compiled.positiontup or [])
    async with store.engine.connect() as conn:
        rows = await conn.exec_driver_sql(
            "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + str(compiled), params
        )
        return "\n".join(r[0] for r in rows)


async def measure(
    store: SqlStore, base: str, keys: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    tenants = await store.tenants_list(limit=args.tenants)
    first = next(t for t in tenants.items if t.name == "tenant-0")
    key = keys[0]
    out: dict[str, Any] = {}
    async with httpx.AsyncClient(base_url=base, timeout=60) as http:
        for minutes in args.minutes:
            who = {
                "admin, every tenant": {"Authorization": f"Bearer {ADMIN_KEY}"},
                "admin, one tenant": {
                    "Authorization": f"Bearer {ADMIN_KEY}",
                    "Cronwheel-Tenant": str(first.id),
                },
                "tenant key": {"Authorization": f"Bearer {key}"},
            }
            for name, headers in who.items():

                async def get(headers: dict[str, str] = headers, minutes: int = minutes) -> Any:
                    r = await http.get("/v1/overview", params={"minutes": minutes}, headers=headers)
                    r.raise_for_status()
                    return r.json()

                body = await get()
                out[f"GET {minutes} min, {name}"] = {
                    **await timed(get, args.repeat),
                    "runs": body["total"]["runs"],
                }
            now = await store.db_now()
            since = now.replace(second=0, microsecond=0) - timedelta(minutes=minutes - 1)
            for name, tid in (("every tenant", None), ("one tenant", first.id)):

                async def read(
                    tid: uuid.UUID | None = tid,
                    since: datetime = since,
                    minutes: int = minutes,
                    now: datetime = now,
                ) -> Any:
                    return await store.runs_overview(tid, since=since, minutes=minutes, until=now)

                out[f"store {minutes} min, {name}"] = await timed(read, args.repeat)
            out[f"plan {minutes} min, one tenant"] = await plan(store, first.id, now, minutes)
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1_000_000, help="runs in the history")
    parser.add_argument("--future", type=int, default=0, help="SCHEDULED runs due later")
    parser.add_argument("--tenants", type=int, default=10)
    parser.add_argument("--days", type=float, default=7.0, help="the history's span")
    parser.add_argument("--minutes", type=int, action="append", help="windows (default 60)")
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    args.minutes = args.minutes or [60]
    with workdir() as wd:
        async with fresh_database("postgresql", wd) as url:
            store = await open_store(url)
            assert isinstance(store, SqlStore)
            proc = None
            try:
                await store.migrate()
                index = await ensure_index(url)
                now = await store.db_now()
                keys = await seed(store, url, args, now)
                proc, base = start_api(url, wd)
                result: dict[str, Any] = {
                    "args": vars(args),
                    "postgres": PG_ADMIN.split("@")[-1],
                    "index": index,
                    **await measure(store, base, keys, args),
                }
            finally:
                if proc is not None:
                    proc.terminate()
                    proc.wait(timeout=30)
                await store.close()
    for name, value in result.items():
        if name.startswith("plan"):
            console.print(f"[bold]{name}[/bold]\n{value}")
    report(
        "overview",
        result,
        [
            (
                k,
                str(v["median_ms"]),
                str(v["p95_ms"]),
                str(v["max_ms"]),
                str(v.get("runs", "")),
            )
            for k, v in result.items()
            if isinstance(v, dict) and "median_ms" in v
        ],
        ("call", "median ms", "p95 ms", "max ms", "runs in window"),
    )


if __name__ == "__main__":
    asyncio.run(main())

"""What partitioning ``runs`` by shard would buy: a tenant with N runs beside one with
100 (the volume of ``tests/store/test_tenant_plans.py``), then a copy of ``runs``
partitioned by shard (P range partitions of the 256 shards, the same indexes), and on
both tables the small tenant's hot reads under EXPLAIN ANALYZE (buffers, milliseconds,
median of R) and the write cost of a batch of new runs (milliseconds per run).

    python bench/partitioning.py --runs 1000000 --partitions 16

Prints JSON on stdout and a table on stderr. Creates and drops its own database.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from pg_server import pg_admin, pg_connect, pg_url
from store.tenant_volume import two_tenants

# The small tenant's reads, each by its table: {t} is runs or its partitioned copy.
READS = {
    "list, newest 100": "SELECT * FROM {t} WHERE tenant_id = $1 ORDER BY id DESC LIMIT 101",
    "by state": (
        "SELECT * FROM {t} WHERE tenant_id = $1 AND state = 'DISPATCHED' ORDER BY id DESC LIMIT 101"
    ),
    "get one": "SELECT * FROM {t} WHERE tenant_id = $1 AND id = $2",
    "ready queue head": (
        "SELECT id FROM {t} WHERE state = 'DISPATCHED' AND reserved_token IS NULL"
        " AND pool = 'default' AND tenant_id = $1 ORDER BY priority, fire_at LIMIT 10"
    ),
}


async def _partitioned_copy(conn: Any, partitions: int) -> float:
    """``runs_part``: runs by shard range, with runs' indexes (keys gain the shard: a
    partitioned table's unique keys must hold its partition key)."""
    started = time.monotonic()
    await conn.execute(
        "CREATE TABLE runs_part (LIKE runs INCLUDING DEFAULTS) PARTITION BY RANGE (shard)"
    )
    step = 256 // partitions
    for p in range(partitions):
        await conn.execute(
            f"CREATE TABLE runs_part_{p} PARTITION OF runs_part"
            f" FOR VALUES FROM ({p * step}) TO ({(p + 1) * step})"
        )
    await conn.execute("ALTER TABLE runs_part ADD PRIMARY KEY (id, shard)")
    await conn.execute("ALTER TABLE runs_part ADD UNIQUE (tenant_id, job_id, due_at, shard)")
    for row in await conn.fetch(
        "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'runs'"
        " AND indexname NOT IN ('pk_runs', 'uq_runs_tenant_id_job_id_due_at')"
    ):
        definition = row["indexdef"].replace(" ON public.runs ", " ON runs_part ")
        definition = definition.replace("UNIQUE INDEX ix_runs_tenant_id", "INDEX ix_runs_tenant_id")
        await conn.execute(definition.replace(row["indexname"], f"p_{row['indexname']}", 1))
    await conn.execute("SET maintenance_work_mem = '256MB'")
    await conn.execute("INSERT INTO runs_part SELECT * FROM runs")
    await conn.execute("VACUUM ANALYZE runs_part")
    return time.monotonic() - started


async def _explain(conn: Any, sql: str, args: list[Any], repeat: int) -> dict[str, float]:
    buffers, ms = [], []
    for _ in range(repeat):
        doc = await conn.fetchval("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, *args)
        top = json.loads(doc)[0]
        plan = top["Plan"]
        buffers.append(plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0))
        ms.append(top["Execution Time"])
    return {"buffers": statistics.median(buffers), "ms": round(statistics.median(ms), 3)}


_COLUMNS = (
    "id, tenant_id, job_id, job_name, origin, shard, state, due_at, fire_at, priority, pool,"
    " requires, tags, route_tags, task, webhook, payload, attempt, max_attempts, retry,"
    " timeout, heartbeat_timeout, progress_timeout, reason, wait_reason, reserved_by,"
    " reserved_attempt, reserved_token, reserved_until, cancel_requested, overlap_queued,"
    " quarantined_at, result, last_error, created_at, dispatched_at, started_at, finished_at"
)


async def _write_cost(conn: Any, table: str, tenant_id: uuid.UUID, batch: int) -> float:
    """Milliseconds per run of inserting ``batch`` new runs of the tenant, rolled back."""
    tx = conn.transaction()
    await tx.start()
    try:
        started = time.monotonic()
        await conn.execute(
            f"INSERT INTO {table} ({_COLUMNS}) SELECT (lpad(to_hex(i), 12, '0') || '7fff8'"
            " || lpad(to_hex(i), 15, '0'))::uuid, tenant_id, job_id, job_name, origin,"
            " (i % 256)::smallint, state, due_at + make_interval(secs => i),"
            " fire_at + make_interval(secs => i), priority, pool, requires, tags, route_tags,"
            " task, webhook, payload, attempt, max_attempts, retry, timeout,"
            " heartbeat_timeout, progress_timeout, reason, wait_reason, reserved_by,"
            " reserved_attempt, reserved_token, reserved_until, cancel_requested,"
            " overlap_queued, quarantined_at, result, last_error, created_at, dispatched_at,"
            " started_at, finished_at"
            f" FROM {table}, generate_series(1, $2) AS i"
            f" WHERE {table}.id = (SELECT id FROM {table} WHERE tenant_id = $1 LIMIT 1)",
            tenant_id,
            batch,
        )
        return (time.monotonic() - started) * 1000 / batch
    finally:
        await tx.rollback()


async def main(args: argparse.Namespace) -> dict[str, Any]:
    name = f"cw_bench_part_{uuid.uuid4().hex[:8]}"
    await pg_admin(f'CREATE DATABASE "{name}"')
    try:
        url = pg_url(name)
        started = time.monotonic()
        big, small = await two_tenants(url, args.runs)
        out: dict[str, Any] = {"runs": args.runs, "load_s": round(time.monotonic() - started, 1)}
        conn = await pg_connect(url.replace("postgresql+asyncpg://", "postgresql://", 1))
        try:
            await conn.execute("SET jit = off")
            out["copy_s"] = round(await _partitioned_copy(conn, args.partitions), 1)
            one = await conn.fetchval("SELECT id FROM runs WHERE tenant_id = $1 LIMIT 1", small)
            out["partitions"] = args.partitions
            out["reads"] = {}
            for label, sql in READS.items():
                params = [small, one] if "$2" in sql else [small]
                out["reads"][label] = {
                    table: await _explain(conn, sql.format(t=table), params, args.repeat)
                    for table in ("runs", "runs_part")
                }
            out["write_ms_per_run"] = {
                table: round(
                    statistics.median(
                        [await _write_cost(conn, table, big, args.batch) for _ in range(3)]
                    ),
                    4,
                )
                for table in ("runs", "runs_part")
            }
        finally:
            await conn.close()
        return out
    finally:
        await pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--batch", type=int, default=10_000)
    result = asyncio.run(main(parser.parse_args()))
    print(json.dumps(result, indent=2))
    for label, by_table in result["reads"].items():
        cells = "  ".join(f"{t}: {v['buffers']:.0f} buf {v['ms']} ms" for t, v in by_table.items())
        print(f"{label:20} {cells}", file=sys.stderr)
    print(f"write ms/run {result['write_ms_per_run']}", file=sys.stderr)

"""Idle cost: N one-off runs due over the next M months plus C cron jobs, nothing due
soon: what the scheduler nodes cost while they wait (PostgreSQL).

Two phases on one fresh database, each with S fresh ``cronwheel scheduler`` processes
(and nothing else connected to the database):

1. *few*: the C cron jobs (each with its next run materialised, 11 to 12 hours away) and
   ``--few-runs`` one-off runs;
2. *many*: the same plus the rest of the N one-off runs.

The one-off runs are due uniformly from one day to M months ahead; the data are loaded
through the store (``jobs_create_many``, batches of 1,000 — the API would take hours
for a million), then vacuumed and analysed so no autovacuum runs during the
measurement. Once the nodes hold their shards and have settled, each phase measures
over ``--measure-seconds``:

- round trips to the database per node: client-to-server TCP data segments of each
  node's connections (``ss -ti``, ``data_segs_out``); every statement, BEGIN and COMMIT
  included, is one (the nodes' statements are all prepared and cached by then);
- transactions: ``xact_commit + xact_rollback`` of the database in
  ``pg_stat_database`` (read from another database, so the measuring adds none);
- CPU: per node, and of the nodes' PostgreSQL backends (``/proc/<pid>/stat``);
- memory: each node's RSS at the start and end of the measurement, and compared
  between the phases.

    python bench/idle.py --runs 1000000 --cron-jobs 10000 --schedulers 3 \\
        --measure-seconds 60 --months 6
"""

from __future__ import annotations

import argparse
import asyncio
import random
import subprocess
import time
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

import asyncpg
from harness import (
    PG_ADMIN,
    Cluster,
    ProcSample,
    bench_cluster,
    console,
    open_store,
    proc_sample,
    progress_bar,
    report,
    wait_shards_balanced,
)

from cronwheel.domain.model import NewJob
from cronwheel.domain.new_job import JobLimits, new_job
from cronwheel.domain.spec import JobSpec
from cronwheel.store import Store

# The targets, for all scheduler nodes together.
QUERIES_PER_S_TARGET = 20.0
CPU_PERCENT_TARGET = 5.0
# Holding a million runs in memory would take well over 100 MB; a node whose RSS moves
# by less than this between the phases holds none of them.
RSS_GROWTH_BOUND_MB = 10.0
BATCH = 1000
MONTH = timedelta(days=30.44)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1_000_000, help="one-off runs in all")
    parser.add_argument("--cron-jobs", type=int, default=10_000)
    parser.add_argument("--schedulers", type=int, default=3)
    parser.add_argument("--measure-seconds", type=float, default=60.0)
    parser.add_argument("--months", type=float, default=6.0, help="the runs are due within")
    parser.add_argument(
        "--few-runs", type=int, default=None, help="one-off runs of the first phase [N/1000]"
    )
    parser.add_argument(
        "--settle-seconds",
        type=float,
        default=10.0,
        help="wait this long after the nodes hold their shards before measuring",
    )
    args = parser.parse_args()
    if args.few_runs is None:
        args.few_runs = args.runs // 1000
    if args.runs < 0 or args.cron_jobs < 0 or not 0 <= args.few_runs <= args.runs:
        parser.error("--runs and --cron-jobs must not be negative, --few-runs at most --runs")
    if args.schedulers < 1 or args.measure_seconds <= 0 or args.settle_seconds < 0:
        parser.error("--schedulers must be at least 1, --measure-seconds positive")
    if not 0.1 <= args.months <= 36:
        parser.error("--months must be between 0.1 and 36 (the horizon of a one-off run)")
    async with bench_cluster("postgresql") as cluster:
        result = await run_idle(cluster, args)
    summarise(args, result)


async def run_idle(cluster: Cluster, args: argparse.Namespace) -> dict[str, Any]:
    console.print(
        f"[bold]idle[/]: {args.runs} one-off runs over {args.months} months, "
        f"{args.cron_jobs} cron jobs, {args.schedulers} scheduler node(s); "
        f"first phase with {args.few_runs} one-off runs"
    )
    store = await open_store(cluster.database_url)
    try:
        await store.migrate()
        tenant = await store.tenants_create(name="idle", limits={})
        now = await store.db_now()
        t0 = time.monotonic()
        await create_cron_jobs(store, tenant.id, args.cron_jobs, now)
        dues = one_off_dues(args.runs, now, args.months)
        await create_one_off(store, tenant.id, dues[: args.few_runs], now)
    finally:
        await store.close()
    await vacuum(cluster.database_url)
    loaded_few = time.monotonic() - t0
    few = await phase(cluster, args, "few")

    store = await open_store(cluster.database_url)
    try:
        t0 = time.monotonic()
        await create_one_off(store, tenant.id, dues[args.few_runs :], now)
        counts = await store.runs_count_by_state()
    finally:
        await store.close()
    await vacuum(cluster.database_url)
    loaded_many = time.monotonic() - t0
    console.print(
        f"loaded {args.runs - args.few_runs} more one-off runs in {loaded_many:.0f} s "
        f"({(args.runs - args.few_runs) / max(loaded_many, 1e-3):.0f}/s, vacuum included)"
    )
    many = await phase(cluster, args, "many")
    return {
        "scheduled_runs": counts.get("SCHEDULED", 0),
        "load_seconds": {"few": round(loaded_few, 1), "many": round(loaded_many, 1)},
        "few": few,
        "many": many,
    }


# -- the data --------------------------------------------------------------------------


def one_off_dues(count: int, now: datetime, months: float) -> list[datetime]:
    """``count`` instants uniformly from one day to ``months`` months after ``now``
    (whole milliseconds), in random order so both phases spread over the whole span."""
    rng = random.Random(1)
    lo = now + timedelta(days=1)
    span = (now + months * MONTH - lo).total_seconds()
    return [lo + timedelta(milliseconds=round(rng.uniform(0, span) * 1000)) for _ in range(count)]


async def create_cron_jobs(store: Store, tenant_id: uuid.UUID, count: int, now: datetime) -> None:
    """Daily cron jobs at a minute of the hour 12 hours from now (UTC), so their next
    runs, materialised now, are 11 to 12 hours away."""
    hour = (now.hour + 12) % 24
    specs = [
        JobSpec.model_validate(
            {"name": f"daily-{m:02d}", "schedule": {"cron": f"{m} {hour} * * *"}, "task": "noop"}
        )
        for m in range(60)
    ]
    limits = JobLimits(max_horizon=timedelta(days=2))
    made = [new_job(s, now=now, limits=limits) for s in specs]
    jobs = [made[i % 60] for i in range(count)]
    await create_jobs(store, tenant_id, jobs, "creating cron jobs")


async def create_one_off(
    store: Store, tenant_id: uuid.UUID, dues: Sequence[datetime], now: datetime
) -> None:
    limits = JobLimits(max_horizon=max(dues, default=now) - now + timedelta(days=1))

    def job(at: datetime) -> NewJob:
        spec = JobSpec.model_validate(
            {"name": "later", "schedule": {"at": at.isoformat()}, "task": "noop", "pool": "bench"}
        )
        made = new_job(spec, now=now, limits=limits)
        assert made.first_due_at == at
        return made

    await create_jobs(store, tenant_id, [job(at) for at in dues], "creating one-off runs")


async def create_jobs(
    store: Store, tenant_id: uuid.UUID, jobs: Sequence[NewJob], description: str
) -> None:
    """Through the store, in batches of 1,000, two in flight."""
    gate = asyncio.Semaphore(2)
    with progress_bar() as progress:
        bar = progress.add_task(description, total=len(jobs))

        async def send(batch: Sequence[NewJob]) -> None:
            async with gate:
                await store.jobs_create_many(tenant_id, jobs=batch)
            progress.advance(bar, len(batch))

        await asyncio.gather(*(send(jobs[i : i + BATCH]) for i in range(0, len(jobs), BATCH)))


async def vacuum(url: str) -> None:
    """VACUUM ANALYZE the fresh data, so autovacuum has nothing to do while we measure."""
    with console.status("vacuum analyse"):
        conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            await conn.execute("VACUUM ANALYZE")
        finally:
            await conn.close()


# -- one phase -------------------------------------------------------------------------


async def phase(cluster: Cluster, args: argparse.Namespace, label: str) -> dict[str, Any]:
    names = [f"scheduler-{i}" for i in range(args.schedulers)]
    for i, name in enumerate(names):
        cluster.start(name, "scheduler", "--node-id", f"idle-{label}-{i}")
    store = await open_store(cluster.database_url)
    try:
        held = await wait_shards_balanced(store, args.schedulers, timeout=120)
    finally:
        await store.close()
    console.print(f"[bold]{label}[/]: shards per node {sorted(held.values())}")
    with console.status(f"settling for {args.settle_seconds:.0f} s"):
        await asyncio.sleep(args.settle_seconds)
    cluster.check_alive()
    measured = await measure(cluster, names, args.measure_seconds)
    cluster.stop(names)
    return measured


async def measure(cluster: Cluster, names: list[str], seconds: float) -> dict[str, Any]:
    database = cluster.database_url.rsplit("/", 1)[1]
    pids = {name: cluster.pid(name) for name in names}
    admin = await asyncpg.connect(PG_ADMIN)  # another database: adds nothing to the counts
    try:
        procs0 = {name: proc_sample(pid) for name, pid in pids.items()}
        segs0 = segments_out(pids.values())
        db0 = await database_stats(admin, database)
        backends0 = {pid: proc_cpu(pid) for pid in await backend_pids(admin, database)}
        autovacuum = 0
        with progress_bar() as progress:
            bar = progress.add_task(f"measuring for {seconds:.0f} s", total=round(seconds))
            deadline = time.monotonic() + seconds
            while (left := deadline - time.monotonic()) > 0:
                await asyncio.sleep(min(1.0, left))
                autovacuum += await admin.fetchval(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = $1 AND backend_type = 'autovacuum worker'",
                    database,
                )
                progress.update(bar, completed=round(seconds - max(0.0, left - 1)))
        procs1 = {name: proc_sample(pid) for name, pid in pids.items()}
        segs1 = segments_out(pids.values())
        db1 = await database_stats(admin, database)
        backends1 = {pid: proc_cpu(pid) for pid in await backend_pids(admin, database)}
    finally:
        await admin.close()
    elapsed = procs1[names[0]].at - procs0[names[0]].at
    nodes: dict[str, dict[str, Any]] = {}
    for name, pid in pids.items():
        # A connection opened meanwhile counts from zero; one closed meanwhile is lost
        # (the pools keep theirs open).
        before = segs0.get(pid, {})
        sent = sum(n - before.get(port, 0) for port, n in segs1.get(pid, {}).items())
        nodes[name] = node_figures(procs0[name], procs1[name], sent / elapsed)
    backend_cpu = sum(cpu - backends0.get(pid, 0.0) for pid, cpu in backends1.items())
    return {
        "seconds": round(elapsed, 1),
        "round_trips_per_s": round(sum(n["round_trips_per_s"] for n in nodes.values()), 2),
        "transactions_per_s": round((db1["xacts"] - db0["xacts"]) / elapsed, 2),
        "rows_read_per_s": round((db1["rows_read"] - db0["rows_read"]) / elapsed, 1),
        "rows_written_per_s": round((db1["rows_written"] - db0["rows_written"]) / elapsed, 1),
        "db_busy_ms_per_s": round((db1["active_ms"] - db0["active_ms"]) / elapsed, 2),
        "scheduler_cpu_percent": round(sum(n["cpu_percent"] for n in nodes.values()), 2),
        "backend_cpu_percent": round(100 * backend_cpu / elapsed, 2),
        "backends": len(backends1),
        "autovacuum_seen_s": autovacuum,
        "nodes": nodes,
    }


def node_figures(first: ProcSample, last: ProcSample, round_trips: float) -> dict[str, Any]:
    mb = 1 / (1 << 20)
    return {
        "cpu_percent": round(last.cpu_percent_since(first), 2),
        "round_trips_per_s": round(round_trips, 2),
        "rss_mb_start": round(first.rss_bytes * mb, 1),
        "rss_mb_end": round(last.rss_bytes * mb, 1),
        "peak_rss_mb": round(last.peak_rss_bytes * mb, 1),
    }


def segments_out(pids: Iterable[int]) -> dict[int, dict[int, int]]:
    """Data segments each process has sent to PostgreSQL, per connection (local port)."""
    wanted = set(pids)
    out = subprocess.run(
        ["ss", "-tinpH", "state", "established", "( dport = :5432 )"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found: dict[int, dict[int, int]] = {}
    pid = port = None
    for line in out.splitlines():
        if not line.startswith((" ", "\t")):
            parts = line.split()
            port = int(parts[2].rsplit(":", 1)[1])
            owner = line.split("pid=", 1)[1].split(",", 1)[0] if "pid=" in line else None
            pid = int(owner) if owner and int(owner) in wanted else None
        elif pid is not None and port is not None:
            segs = next((f for f in line.split() if f.startswith("data_segs_out:")), None)
            found.setdefault(pid, {})[port] = int(segs.split(":")[1]) if segs else 0
    return found


async def database_stats(conn: asyncpg.Connection, database: str) -> dict[str, float]:
    row = await conn.fetchrow(
        "SELECT xact_commit + xact_rollback AS xacts, tup_returned + tup_fetched AS rows_read,"
        " tup_inserted + tup_updated + tup_deleted AS rows_written, active_time AS active_ms"
        " FROM pg_stat_database WHERE datname = $1",
        database,
    )
    assert row is not None
    return {k: float(v) for k, v in row.items()}


async def backend_pids(conn: asyncpg.Connection, database: str) -> list[int]:
    rows = await conn.fetch(
        "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND backend_type = 'client backend'",
        database,
    )
    return [r["pid"] for r in rows]


def proc_cpu(pid: int) -> float:
    try:
        return proc_sample(pid).cpu_s
    except OSError:  # gone meanwhile
        return 0.0


# -- the report ------------------------------------------------------------------------


def summarise(args: argparse.Namespace, result: dict[str, Any]) -> None:
    few, many = result["few"], result["many"]
    growth = {
        name: round(many["nodes"][name]["rss_mb_end"] - few["nodes"][name]["rss_mb_end"], 1)
        for name in many["nodes"]
    }
    result = {
        "benchmark": "idle",
        "runs": args.runs,
        "few_runs": args.few_runs,
        "cron_jobs": args.cron_jobs,
        "months": args.months,
        "schedulers": args.schedulers,
        **result,
        "rss_growth_mb_few_to_many": growth,
        "targets": {
            "queries_per_s": QUERIES_PER_S_TARGET,
            "cpu_percent": CPU_PERCENT_TARGET,
            "queries_met": many["round_trips_per_s"] <= QUERIES_PER_S_TARGET,
            "cpu_met": many["scheduler_cpu_percent"] <= CPU_PERCENT_TARGET,
            "memory_flat": all(abs(g) <= RSS_GROWTH_BOUND_MB for g in growth.values()),
        },
    }
    t = result["targets"]

    def verdict(ok: bool) -> str:
        return "met" if ok else "MISSED"

    def both(key: str) -> tuple[str, str]:
        return str(few[key]), str(many[key])

    rows = [
        (
            "round trips/s, all nodes",
            *both("round_trips_per_s"),
            f"≤ 20 {verdict(t['queries_met'])}",
        ),
        ("transactions/s", *both("transactions_per_s"), ""),
        ("rows read/s", *both("rows_read_per_s"), ""),
        ("rows written/s", *both("rows_written_per_s"), ""),
        ("database busy ms/s", *both("db_busy_ms_per_s"), ""),
        ("CPU %, all nodes", *both("scheduler_cpu_percent"), f"≤ 5 {verdict(t['cpu_met'])}"),
        ("CPU %, their backends", *both("backend_cpu_percent"), ""),
        ("autovacuum seen (s)", *both("autovacuum_seen_s"), "0"),
    ]
    for name in many["nodes"]:
        a, b = few["nodes"][name], many["nodes"][name]
        rows += [
            (
                f"{name}: round trips/s",
                str(a["round_trips_per_s"]),
                str(b["round_trips_per_s"]),
                "",
            ),
            (f"{name}: CPU %", str(a["cpu_percent"]), str(b["cpu_percent"]), ""),
            (
                f"{name}: RSS MB start → end",
                f"{a['rss_mb_start']} → {a['rss_mb_end']}",
                f"{b['rss_mb_start']} → {b['rss_mb_end']}",
                f"Δ {growth[name]:+} {verdict(abs(growth[name]) <= RSS_GROWTH_BOUND_MB)}",
            ),
        ]
    report(
        f"idle: {args.cron_jobs} cron jobs; {args.few_runs} vs {args.runs} one-off runs "
        f"over {args.months} months",
        result,
        rows,
        ("measure", f"few ({args.few_runs})", f"many ({args.runs})", "target"),
    )


if __name__ == "__main__":
    asyncio.run(main())

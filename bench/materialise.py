"""Materialise: N cron jobs due at one instant; fire them all the way a scheduler node
does (batches of 1,000, two in flight) and time it. Firing a recurring job's run
creates its next occurrence in the same transaction, so this is the cost of keeping N
cron jobs going at the top of the hour.

    python bench/materialise.py --jobs 100000 --backend postgresql
"""

from __future__ import annotations

import argparse
import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from harness import console, fresh_database, open_store, report, workdir
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from cronwheel.domain.new_job import JobLimits, new_job
from cronwheel.domain.sharding import NUM_SHARDS
from cronwheel.domain.spec import JobSpec
from cronwheel.store import Store

INSTANT = datetime(2031, 1, 6, 0, 0, tzinfo=UTC)  # a Monday midnight, UTC
# Typical schedules that all fire at INSTANT, in zones with whole-hour offsets.
SCHEDULES = [
    {"cron": "0 * * * *"},
    {"cron": "*/15 * * * *", "timezone": "Europe/Berlin"},
    {"cron": "0 1 * * *", "timezone": "Europe/Paris"},
    {"cron": "0 19 * * SUN", "timezone": "America/New_York"},
    {"cron": "0 9 * * 1-5", "timezone": "Asia/Tokyo"},
    {"cron": "0 0 1,6 * *", "timezone": "UTC", "catch_up": "replay"},
]


async def create_jobs(store: Store, jobs: int) -> list[object]:
    tenant = await store.tenants_create(name="materialise", limits={}, now=INSTANT)
    specs = [
        JobSpec.model_validate({"name": f"m{i}", "schedule": s, "task": "noop"})
        for i, s in enumerate(SCHEDULES)
    ]
    before = INSTANT - timedelta(seconds=1)
    limits = JobLimits(max_horizon=timedelta(days=400))
    new = [new_job(s, now=before, limits=limits) for s in specs]
    assert all(n.first_due_at == INSTANT for n in new), new
    run_ids: list[object] = []
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), console=console
    ) as progress:
        bar = progress.add_task("creating jobs", total=jobs)
        for start in range(0, jobs, 1000):
            batch = [new[i % len(specs)] for i in range(start, min(jobs, start + 1000))]
            made = await store.jobs_create_many(tenant.id, jobs=batch, now=before)
            run_ids += [run.id for _, run, _ in made if run is not None]
            progress.update(bar, completed=start + len(batch))
    return run_ids


async def fire_all(store: Store, run_ids: list[object]) -> tuple[float, int]:
    await store.shard_leases_acquire(
        node_id="bench", shards=range(NUM_SHARDS), ttl=3600, now=INSTANT
    )
    gate = asyncio.Semaphore(2)
    fired = 0

    async def fire(batch: list[object]) -> None:
        nonlocal fired
        async with gate:
            done = await store.runs_fire(run_ids=batch, node_id="bench", now=INSTANT)  # type: ignore[arg-type]
            fired += len(done)

    t0 = time.perf_counter()
    await asyncio.gather(*(fire(run_ids[i : i + 1000]) for i in range(0, len(run_ids), 1000)))
    return time.perf_counter() - t0, fired


async def measure(jobs: int, backend: str) -> dict[str, Any]:
    """Create ``jobs`` cron jobs due at one instant on a fresh database, fire them all
    and time it; the figures as a JSON-able dict."""
    with workdir() as wd:
        async with fresh_database(backend, wd) as url:
            store = await open_store(url)
            await store.migrate()
            try:
                run_ids = await create_jobs(store, jobs)
                console.print(f"firing {len(run_ids)} runs due at {INSTANT.isoformat()}")
                seconds, fired = await fire_all(store, run_ids)
                counts = await store.runs_count_by_state()
            finally:
                await store.close()
    return {
        "benchmark": "materialise",
        "backend": backend,
        "jobs": jobs,
        "fired": fired,
        "next_runs_created": counts["SCHEDULED"],
        "seconds": round(seconds, 2),
        "runs_per_s": round(fired / seconds),
    }


def rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        ("fired", str(result["fired"])),
        ("next runs created", str(result["next_runs_created"])),
        ("seconds", f"{result['seconds']:.2f}"),
        ("runs/s", str(result["runs_per_s"])),
    ]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--backend", choices=["sqlite", "postgresql"], default="postgresql")
    args = parser.parse_args()
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    result = await measure(args.jobs, args.backend)
    report(
        f"materialise: {args.jobs} cron jobs firing at one instant ({args.backend})",
        result,
        rows(result),
        ("measure", "value"),
    )


if __name__ == "__main__":
    asyncio.run(main())

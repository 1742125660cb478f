"""Spike: N one-off runs due at one instant, idle no-op workers waiting.

Starts real processes (``cronwheel server`` on SQLite; ``cronwheel api`` plus scheduler
nodes on PostgreSQL; ``cronwheel worker`` processes), creates the runs through the HTTP
API ahead of the instant, and reports dispatch lateness (dispatched_at - due_at), start
lateness (started_at - due_at), the dispatch rate, runs lost and runs run twice.

    python bench/spike.py --runs 10000 --backend sqlite
    python bench/spike.py --runs 20000 --backend postgresql --schedulers 3 --workers 4
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from harness import (
    HERE,
    Cluster,
    console,
    fresh_database,
    open_store,
    percentiles,
    profile,
    report,
    workdir,
)
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cronwheel.store import RunFilter, Store

BATCH = 500


async def create_runs(cluster: Cluster, key: str, *, runs: int, due: datetime) -> None:
    """Create the runs through the API, in batches."""
    headers = {"Authorization": f"Bearer {key}"}
    body = {
        "name": "spike",
        "schedule": {"at": due.isoformat()},
        "task": "noop",
        "pool": "bench",
        "retry": {"max_attempts": 1},
    }
    async with httpx.AsyncClient(base_url=cluster.url, headers=headers, timeout=120) as client:
        gate = asyncio.Semaphore(4)

        async def send(count: int) -> None:
            async with gate:
                r = await client.post("/v1/jobs/batch", json={"jobs": [body] * count})
                r.raise_for_status()

        sizes = [min(BATCH, runs - i) for i in range(0, runs, BATCH)]
        await asyncio.gather(*(send(n) for n in sizes))


async def wait_done(store: Store, runs: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        bar = progress.add_task("runs finished", total=runs)
        while True:
            counts = await store.runs_count_by_state()
            finished = sum(counts[s] for s in ("SUCCESS", "FAILED", "DEAD_LETTER", "CANCELLED"))
            progress.update(bar, completed=finished)
            if finished >= runs or time.monotonic() > deadline:
                return
            await asyncio.sleep(0.25)


async def collect(store: Store, tenant_id: uuid.UUID) -> tuple[list[Any], dict[uuid.UUID, int]]:
    runs: list[Any] = []
    cursor = None
    while True:
        page = await store.runs_list(tenant_id, filter=RunFilter(), cursor=cursor, limit=1000)
        runs += page.items
        if not page.next_cursor:
            break
        cursor = page.next_cursor
    dispatches: dict[uuid.UUID, int] = {}
    cursor = None
    while True:
        events = await store.events_list(tenant_id, cursor=cursor, limit=5000)
        for e in events.items:
            if e.to_state == "DISPATCHED" and e.run_id is not None:
                dispatches[e.run_id] = dispatches.get(e.run_id, 0) + 1
        if not events.next_cursor:
            break
        cursor = events.next_cursor
    return runs, dispatches


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--backend", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--schedulers", type=int, default=1)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=500, help="slots per worker")
    parser.add_argument(
        "--lead",
        type=float,
        default=None,
        help="seconds between creating the runs and their instant",
    )
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument(
        "--profile",
        action="append",
        default=[],
        metavar="PROCESS",
        help="record a py-spy profile of this process (api, scheduler-0, "
        "server, worker-0, …) during the spike; repeatable",
    )
    parser.add_argument("--profile-seconds", type=float, default=8.0)
    args = parser.parse_args()

    with workdir() as wd:
        async with fresh_database(args.backend, wd) as url:
            cluster = Cluster(database_url=url, workdir=wd, python_path=[HERE])
            try:
                await run_spike(cluster, args)
            finally:
                cluster.stop()


async def run_spike(cluster: Cluster, args: argparse.Namespace) -> None:
    console.print(
        f"[bold]spike[/]: {args.runs} runs, backend {args.backend}, "
        f"{args.schedulers} scheduler(s), {args.workers} worker(s)"
    )
    cluster.start_server(args.schedulers)
    await cluster.wait_ready()
    tenant_id, operator_key, worker_key = await cluster.tenant("bench")
    cluster.start_workers(
        args.workers, worker_key, pool="bench", module="noop_tasks", concurrency=args.concurrency
    )
    store = await open_store(cluster.database_url)
    try:
        lead = args.lead if args.lead is not None else max(5.0, args.runs / 500)
        due = (await store.db_now() + timedelta(seconds=lead)).replace(microsecond=0)
        t0 = time.monotonic()
        await create_runs(cluster, operator_key, runs=args.runs, due=due)
        created_in = time.monotonic() - t0
        if datetime.now(UTC) >= due:
            raise SystemExit(
                f"creating the runs took {created_in:.1f} s, past the instant; raise --lead"
            )
        console.print(f"created {args.runs} runs in {created_in:.1f} s; due at {due.isoformat()}")
        profilers = [
            profile(cluster, name, seconds=args.profile_seconds, start_at=due)
            for name in args.profile
        ]
        await wait_done(store, args.runs, args.timeout)
        for p in profilers:
            console.print(f"profile: {await p}")
        cluster.check_alive()
        runs, dispatches = await collect(store, uuid.UUID(tenant_id))
    finally:
        await store.close()
    summarise(args, runs, dispatches, due)


def summarise(
    args: argparse.Namespace, runs: list[Any], dispatches: dict[uuid.UUID, int], due: datetime
) -> None:
    dispatch_ms = [
        (r.dispatched_at - r.due_at).total_seconds() * 1000 for r in runs if r.dispatched_at
    ]
    start_ms = [(r.started_at - r.due_at).total_seconds() * 1000 for r in runs if r.started_at]
    last_dispatch = max((r.dispatched_at for r in runs if r.dispatched_at), default=due)
    span = max((last_dispatch - due).total_seconds(), 1e-3)
    lost = args.runs - sum(1 for r in runs if r.state.value == "SUCCESS")
    twice = sum(1 for r in runs if r.attempt > 1 or dispatches.get(r.id, 0) > 1)
    result = {
        "benchmark": "spike",
        "backend": args.backend,
        "runs": args.runs,
        "schedulers": args.schedulers,
        "workers": args.workers,
        "dispatch_lateness_ms": percentiles(dispatch_ms),
        "start_lateness_ms": percentiles(start_ms),
        "dispatches_per_s": round(len(dispatch_ms) / span),
        "runs_lost": lost,
        "runs_run_twice": twice,
    }
    d, s = result["dispatch_lateness_ms"], result["start_lateness_ms"]
    report(
        f"spike: {args.runs} runs due at one instant ({args.backend})",
        result,
        [
            ("dispatch lateness (ms)", str(d["p50"]), str(d["p99"]), str(d["max"])),
            ("start lateness (ms)", str(s["p50"]), str(s["p99"]), str(s["max"])),
            ("dispatches/s", str(result["dispatches_per_s"]), "", ""),
            ("runs lost", str(lost), "", ""),
            ("runs run twice", str(twice), "", ""),
        ],
        ("measure", "p50 / value", "p99", "max"),
    )


if __name__ == "__main__":
    asyncio.run(main())

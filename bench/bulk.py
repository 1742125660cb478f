"""Bulk: how soon a bulk operation stops what it selects, on a cluster under load.

Starts ``cronwheel api`` and S scheduler nodes on PostgreSQL and W no-op workers, then
makes J recurring jobs (every I seconds, their instants spread evenly, so runs come due
all the time) over T tenants — the first tenant has P of them, tagged ``target`` — and
lets them fire for a while. Then, each in turn:

* **pause**: ``POST /v1/bulk/pause`` of the first tenant's P tagged jobs;
* **cancel**: C one-off runs of the first tenant, due at R a second from a few seconds
  on (tagged ``doomed``), then ``POST /v1/bulk/cancel`` of them once they fire;
* **a neighbour's pause**, unless ``--no-neighbour``: a second after the cancel's 202,
  while it is under way, ``POST /v1/bulk/pause`` of every job of the second tenant —
  measured the same way: it must not wait for the first tenant's cancel to end.

For each it reports, on the database's clock: how long after the 202 (the operation's
``accepted_at``) the last selected run was dispatched, how many selected runs were
dispatched more than 5 s after it and after the operation ended (both must be 0), how
many started after it ended (0), and when the operation ended. Workers start runs
dispatched ahead at their instant: a run dispatched before the 202 and taken back by the
operation never starts.

    python bench/bulk.py --jobs 10000 --tenants 10 --selected 5000 --cancel-runs 100000
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from datetime import datetime, timedelta
from typing import Any

import httpx
from harness import (
    Cluster,
    Setup,
    bench_cluster,
    console,
    progress_bar,
    report,
    start_cluster,
    wait_shards_balanced,
)

from cronwheel.store import Store

FENCE_S = 5.0  # from the 202, no selected run is dispatched (the bound)
_BATCH = 1000


async def create_jobs(cluster: Cluster, key: str, jobs: list[dict[str, Any]], *, what: str) -> None:
    """``jobs`` through ``POST /v1/jobs/batch``, 1,000 a request, four at a time."""
    gate = asyncio.Semaphore(4)
    async with httpx.AsyncClient(base_url=cluster.url, timeout=120) as client:
        with progress_bar() as progress:
            bar = progress.add_task(what, total=len(jobs))

            async def send(chunk: list[dict[str, Any]]) -> None:
                async with gate:
                    r = await client.post(
                        "/v1/jobs/batch",
                        json={"jobs": chunk},
                        headers={"Authorization": f"Bearer {key}"},
                    )
                    r.raise_for_status()
                progress.advance(bar, len(chunk))

            await asyncio.gather(*(send(jobs[i : i + _BATCH]) for i in range(0, len(jobs), _BATCH)))


def recurring(name: str, start: datetime, interval: float, tags: list[str]) -> dict[str, Any]:
    return {
        "name": name,
        "schedule": {"interval": interval, "start": start.isoformat()},
        "task": "noop",
        "pool": "bench",
        "tags": tags,
        "retry": {"max_attempts": 1},
    }


async def operate(
    cluster: Cluster,
    key: str,
    action: str,
    selector: dict[str, Any],
    *,
    everything: bool = False,
) -> tuple[dict[str, Any], float]:
    """Send the bulk request and follow it to its end: the operation, and the seconds
    the 202 took at the client."""
    body: dict[str, Any] = {"reason": "bench"}
    body |= {"all": True} if everything else {"selector": selector}
    async with httpx.AsyncClient(base_url=cluster.url, timeout=60) as client:
        headers = {"Authorization": f"Bearer {key}"}
        t0 = time.perf_counter()
        r = await client.post(f"/v1/bulk/{action}", json=body, headers=headers)
        answered = time.perf_counter() - t0
        r.raise_for_status()
        op: dict[str, Any] = r.json()
        while op["state"] not in ("done", "failed"):
            await asyncio.sleep(0.05)
            op = (await client.get(f"/v1/operations/{op['id']}", headers=headers)).json()
    if op["state"] != "done":
        raise SystemExit(f"the operation failed: {op.get('error')}")
    return op, answered


async def measure(
    store: Store, tenant_id: uuid.UUID, tag: str | None, op: dict[str, Any], answered: float
) -> dict[str, Any]:
    """What the selected runs (those tagged ``tag``; None: every run of the tenant) did
    after the operation was accepted."""
    accepted = datetime.fromisoformat(op["accepted_at"])
    finished = datetime.fromisoformat(op["finished_at"])
    dispatched: list[datetime] = []
    started_after_end = 0
    cursor = None
    while True:
        page = await store.runs_list(tenant_id, cursor=cursor, limit=500)
        for run in page.items:
            if tag is not None and tag not in run.tags:
                continue
            if run.dispatched_at is not None and run.dispatched_at > accepted:
                dispatched.append(run.dispatched_at)
            if run.started_at is not None and run.started_at > finished:
                started_after_end += 1
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    last = max(dispatched, default=None)
    fence = accepted + timedelta(seconds=FENCE_S)
    return {
        "action": op["action"],
        "matched": op["matched"],
        "changed": op["changed"],
        "skipped": op["skipped"],
        "answer_202_ms": round(answered * 1000, 1),
        "done_after_ms": round((finished - accepted).total_seconds() * 1000, 1),
        "dispatched_after_202": len(dispatched),
        "last_dispatch_after_202_ms": (
            None if last is None else round((last - accepted).total_seconds() * 1000, 1)
        ),
        "dispatched_after_5s": sum(1 for d in dispatched if d > fence),
        "dispatched_after_done": sum(1 for d in dispatched if d > finished),
        "started_after_done": started_after_end,
        "asked_to_stop": op["details"].get("asked_to_stop", 0),
    }


async def run_bench(cluster: Cluster, args: argparse.Namespace) -> None:
    setup: Setup = await start_cluster(
        cluster,
        schedulers=args.schedulers,
        workers=args.workers,
        concurrency=args.concurrency,
        tenants=args.tenants,
    )
    try:
        held = await wait_shards_balanced(setup.store, args.schedulers)
        console.print(f"shards per node: {sorted(held.values())}")
        start = (await setup.store.db_now() + timedelta(seconds=5)).replace(microsecond=0)
        others = args.jobs - args.selected
        # Each tenant's jobs spread evenly over one interval: runs due all the time.
        gap = args.interval / args.selected
        target = [
            recurring(f"target-{i}", start + timedelta(seconds=i * gap), args.interval, ["target"])
            for i in range(args.selected)
        ]
        await create_jobs(cluster, setup.keys[0], target, what="target jobs")
        for t in range(1, args.tenants):
            mine = list(range(t - 1, others, args.tenants - 1))
            if not mine:
                continue
            gap = args.interval / len(mine)
            await create_jobs(
                cluster,
                setup.keys[t],
                [
                    recurring(f"other-{i}", start + timedelta(seconds=n * gap), args.interval, [])
                    for n, i in enumerate(mine)
                ],
                what=f"tenant {t} jobs",
            )
        console.print(f"firing for {args.warm} s")
        await asyncio.sleep(args.warm)
        pause, answered = await operate(cluster, setup.keys[0], "pause", {"tags_all": ["target"]})
        await asyncio.sleep(args.watch)
        results = [await measure(setup.store, setup.tenant_ids[0], "target", pause, answered)]

        if args.cancel_runs:
            due = (await setup.store.db_now() + timedelta(seconds=args.cancel_lead)).replace(
                microsecond=0
            )
            gap = 1 / args.cancel_rate
            doomed = [
                {
                    "name": f"doomed-{i}",
                    "schedule": {"at": (due + timedelta(seconds=i * gap)).isoformat()},
                    "task": "noop",
                    "pool": "bench",
                    "tags": ["doomed"],
                    "retry": {"max_attempts": 1},
                }
                for i in range(args.cancel_runs)
            ]
            await create_jobs(cluster, setup.keys[0], doomed, what="runs to cancel")
            # Cancelled while they are firing: a few seconds into the stream.
            wait = (due - await setup.store.db_now()).total_seconds() + args.cancel_after
            await asyncio.sleep(max(0.0, wait))
            cancelling = asyncio.create_task(
                operate(cluster, setup.keys[0], "cancel", {"tags_all": ["doomed"]})
            )
            neighbour = None
            if args.neighbour:
                # While the cancel is under way: another tenant's operation takes turns
                # with it rather than waiting for it to end.
                await asyncio.sleep(1.0)
                neighbour = await operate(cluster, setup.keys[1], "pause", {}, everything=True)
                if cancelling.done():
                    console.print("[yellow]the cancel ended before the neighbour's pause")
            cancel, answered = await cancelling
            await asyncio.sleep(args.watch)
            results.append(
                await measure(setup.store, setup.tenant_ids[0], "doomed", cancel, answered)
            )
            if neighbour is not None:
                results.append(
                    await measure(setup.store, setup.tenant_ids[1], None, *neighbour)
                    | {"action": "pause (neighbour)"}
                )
        cluster.check_alive()
    finally:
        await setup.store.close()
    rows = [
        (
            r["action"],
            f"{r['matched']:,}",
            f"{r['changed']:,}",
            str(r["answer_202_ms"]),
            str(r["last_dispatch_after_202_ms"]),
            str(r["dispatched_after_5s"]),
            str(r["dispatched_after_done"]),
            str(r["started_after_done"]),
            str(r["done_after_ms"]),
        )
        for r in results
    ]
    report(
        "bulk operations under load",
        {"args": vars(args), "results": results},
        rows,
        (
            "operation",
            "matched",
            "changed",
            "202 (ms)",
            "last dispatch (ms after 202)",
            "dispatched 5 s on",
            "dispatched after end",
            "started after end",
            "ended (ms after 202)",
        ),
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000, help="recurring jobs in all")
    parser.add_argument("--tenants", type=int, default=10)
    parser.add_argument("--selected", type=int, default=5_000, help="the first tenant's jobs")
    parser.add_argument("--interval", type=float, default=30.0, help="seconds between runs")
    parser.add_argument("--warm", type=float, default=20.0, help="seconds of firing first")
    parser.add_argument("--watch", type=float, default=10.0, help="seconds watched after")
    parser.add_argument("--cancel-runs", type=int, default=100_000)
    parser.add_argument("--cancel-rate", type=float, default=500.0, help="runs due a second")
    parser.add_argument("--cancel-lead", type=float, default=30.0)
    parser.add_argument("--cancel-after", type=float, default=3.0)
    parser.add_argument(
        "--neighbour",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="pause the second tenant's jobs while the cancel is under way",
    )
    parser.add_argument("--schedulers", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=100, help="slots per worker")
    args = parser.parse_args()
    if not 0 < args.selected <= args.jobs or args.tenants < 2:
        parser.error("need 0 < --selected <= --jobs and at least 2 tenants")
    async with bench_cluster("postgresql") as cluster:
        await run_bench(cluster, args)


if __name__ == "__main__":
    asyncio.run(main())

"""DAG store: the database's share of a fan-out's start delay, with no API and no workers.

One workflow, root -> N parallel nodes -> sink, on a fresh PostgreSQL database, driven
through the store in this process. Each round creates and fires a workflow run and
leases its root; then what ``bench/dag.py`` measures from the root's end is done
here, timed at this client:

- **complete**: the root's completion, whose transaction makes the N nodes ready (one
  UPDATE and their transitions, ``store/sql/dag.py``);
- **lease**: L leases of N / L side by side take them (plain leases of a part each: a
  cohort of long-polls woken by one notice splits a batch into parts of at least
  ``SHARE_MIN`` runs, so with the defaults, 1,000 nodes and two leases, this is what
  it does; four leases of 250 it never does);
- **total**: both. What ``bench/dag.py`` measures beyond it is HTTP, the API's and the
  workers' Python, and their share of the machine's cores.

Then the N nodes and the sink are completed, out of the measure. The first round warms
the caches and is not counted; the database is analysed after it (on a fresh database
autovacuum gathers statistics only after a minute or so, and a plan chosen without
them — a key check reading a tenant's every run — can make the rounds bimodal).

    python bench/dag_store.py --fanout 1000 --leases 2 --rounds 10
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from datetime import datetime, timedelta
from typing import Any

import asyncpg
from harness import console, fresh_database, open_store, percentiles, progress_bar, report, workdir

from cronwheel.domain.model import LeasedAttempt, Run, Worker
from cronwheel.domain.new_job import JobLimits
from cronwheel.domain.workflow import WorkflowSpec, new_workflow
from cronwheel.store import CompleteItem, Store

POOL = "bench"
NODE_ID = "bench"
DELAY_P99_TARGET = 100.0  # ms: bench/dag.py's target, of which this is one share
MAX_LEASES = 8  # side by side, within the store's pool of connections


def fanout_spec(width: int, at: datetime) -> WorkflowSpec:
    middle = [f"n{i:04d}" for i in range(width)]
    nodes: list[dict[str, Any]] = [
        {"name": "root"},
        *({"name": n, "after": ["root"]} for n in middle),
        {"name": "sink", "after": middle},
    ]
    return WorkflowSpec.model_validate(
        {
            "name": f"fanout-{uuid.uuid4().hex[:8]}",
            "schedule": {"at": at.isoformat()},
            "nodes": [
                {"task": "noop", "pool": POOL, "retry": {"max_attempts": 1}, **n} for n in nodes
            ],
        }
    )


async def one_round(
    store: Store, tenant_id: uuid.UUID, workers: list[Worker], width: int
) -> tuple[float, float]:
    """One workflow run fired and its root leased; then (complete, lease) in ms."""
    now = await store.db_now()
    at = now + timedelta(seconds=1)
    new = new_workflow(fanout_spec(width, at), now=now, limits=JobLimits())
    _job, run, _created = await store.workflows_create(tenant_id, new=new, now=now)
    assert run is not None
    await fire(store, run, at)
    await asyncio.sleep(max(0.0, (at - await store.db_now()).total_seconds()) + 0.01)
    [root] = await store.attempts_lease(worker=workers[0], max=10)
    t0 = time.perf_counter()
    await complete(store, [root])
    t1 = time.perf_counter()
    share = -(-width // len(workers))
    parts = await asyncio.gather(*(store.attempts_lease(worker=w, max=share) for w in workers))
    t2 = time.perf_counter()
    leased = [a for part in parts for a in part]
    if len(leased) != width:
        raise SystemExit(f"the leases took {len(leased)} nodes of {width}")
    await complete(store, leased)
    [sink] = await store.attempts_lease(worker=workers[0], max=10)
    await complete(store, [sink])
    return (t1 - t0) * 1000, (t2 - t1) * 1000


async def fire(store: Store, run: Run, at: datetime) -> None:
    await store.shard_leases_acquire(node_id=NODE_ID, shards=[run.shard], ttl=3600, now=at)
    await store.runs_fire(run_ids=[run.id], node_id=NODE_ID, now=at)


async def complete(store: Store, leased: list[LeasedAttempt]) -> None:
    done = await store.attempts_complete_many(
        items=[CompleteItem(a.attempt_id, a.fencing_token, None) for a in leased]
    )
    refused = [o for o in done if not o.ok]
    if refused:
        raise SystemExit(f"{len(refused)} completions refused: {refused[0]}")


async def analyse(url: str) -> None:
    conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://", 1))
    try:
        await conn.execute("ANALYZE")
    finally:
        await conn.close()


async def measure(width: int, leases: int, rounds: int) -> dict[str, Any]:
    with workdir() as wd:
        async with fresh_database("postgresql", wd) as url:
            store = await open_store(url)
            await store.migrate()
            try:
                tenant = await store.tenants_create(name="dag-store", limits={})
                workers = [
                    await store.workers_register(
                        tenant.id,
                        pool=POOL,
                        capabilities=(),
                        tags=(),
                        capacity=width,
                        tasks=None,
                    )
                    for _ in range(leases)
                ]
                times: list[tuple[float, float]] = []
                with progress_bar() as progress:
                    bar = progress.add_task("rounds", total=rounds + 1)
                    for r in range(rounds + 1):
                        if r == 1:
                            await analyse(url)
                        times.append(await one_round(store, tenant.id, workers, width))
                        progress.advance(bar)
            finally:
                await store.close()
    measured = times[1:]  # the first round warms up
    return {
        "benchmark": "dag_store",
        "backend": "postgresql",
        "fanout": width,
        "leases": leases,
        "rounds": rounds,
        "complete_ms": percentiles([c for c, _ in measured]),
        "lease_ms": percentiles([le for _, le in measured]),
        "total_ms": percentiles([c + le for c, le in measured]),
        "rounds_total_ms": [round(c + le, 1) for c, le in measured],
    }


def rows(result: dict[str, Any]) -> list[tuple[str, ...]]:
    def line(label: str, p: dict[str, Any]) -> tuple[str, ...]:
        return (label, f"{p['min']:.1f}", f"{p['p50']:.1f}", f"{p['max']:.1f}")

    return [
        line(f"complete the root: {result['fanout']} nodes made ready", result["complete_ms"]),
        line(
            f"leases of {-(-result['fanout'] // result['leases'])}, "
            f"{result['leases']} side by side, take them",
            result["lease_ms"],
        ),
        line("both", result["total_ms"]),
    ]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fanout", type=int, default=1000, help="parallel nodes")
    parser.add_argument("--leases", type=int, default=2, help="leases side by side")
    parser.add_argument("--rounds", type=int, default=10, help="measured rounds")
    args = parser.parse_args()
    if args.fanout < 1 or args.leases < 1 or args.rounds < 1:
        parser.error("--fanout, --leases and --rounds must be at least 1")
    if args.leases > MAX_LEASES:
        # Past the store's pool, leases would wait for connections or open new ones.
        parser.error(f"--leases: at most {MAX_LEASES}")
    result = await measure(args.fanout, args.leases, args.rounds)
    console.print(
        f"bench/dag.py's target for the whole delay is p99 ≤ {DELAY_P99_TARGET:g} ms; "
        "this is the database's share alone"
    )
    report(
        f"dag_store: the store's share of a {args.fanout}-node fan-out's start (ms)",
        result,
        rows(result),
        ("step", "min", "p50", "max"),
    )


if __name__ == "__main__":
    asyncio.run(main())

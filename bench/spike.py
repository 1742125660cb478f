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
import uuid
from datetime import datetime, timedelta

from harness import (
    Cluster,
    History,
    add_ahead_arguments,
    ahead_env,
    bench_cluster,
    collect,
    console,
    create_ahead,
    handler_lateness_ms,
    handler_starts,
    histogram,
    lateness_ms,
    percentiles,
    profile,
    report,
    sample_window,
    start_cluster,
    wait_done,
)

CPU_WINDOW = 2.0  # seconds from the instant over which each process's CPU is measured
CPU_BEFORE = 5.0  # and the seconds before it (the default dispatch lead)


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
    add_ahead_arguments(parser)
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
    parser.add_argument(
        "--profile-before",
        type=float,
        default=0.0,
        metavar="S",
        help="begin the profiles S seconds before the instant (reserving ahead)",
    )
    args = parser.parse_args()

    async with bench_cluster(args.backend, env=ahead_env(args)) as cluster:
        await run_spike(cluster, args)


async def run_spike(cluster: Cluster, args: argparse.Namespace) -> None:
    console.print(
        f"[bold]spike[/]: {args.runs} runs, backend {args.backend}, "
        f"{args.schedulers} scheduler(s), {args.workers} worker(s)"
    )
    setup = await start_cluster(
        cluster, schedulers=args.schedulers, workers=args.workers, concurrency=args.concurrency
    )
    try:
        lead = args.lead if args.lead is not None else max(5.0, args.runs / 500)
        due = await create_ahead(
            cluster, setup, lead=lead, dues=lambda at: [at] * args.runs, name="spike"
        )
        profilers = [
            profile(
                cluster,
                name,
                seconds=args.profile_seconds,
                start_at=due - timedelta(seconds=args.profile_before),
            )
            for name in args.profile
        ]
        before = asyncio.ensure_future(
            sample_window(cluster, due - timedelta(seconds=CPU_BEFORE), CPU_BEFORE)
        )
        cpu = asyncio.ensure_future(sample_window(cluster, due, CPU_WINDOW))
        await wait_done(setup.store, args.runs, args.timeout)
        usage = {"before": await before, "after": await cpu}
        for p in profilers:
            console.print(f"profile: {await p}")
        cluster.check_alive()
        history = await collect(setup.store, setup.tenant_ids)
        starts = handler_starts(cluster)
    finally:
        await setup.store.close()
    summarise(args, history, due, usage, starts)


def summarise(
    args: argparse.Namespace,
    history: History,
    due: datetime,
    usage: dict[str, dict[str, float]],
    starts: dict[uuid.UUID, list[float]],
) -> None:
    runs = history.runs
    dispatch_ms, start_ms = lateness_ms(runs)
    handler_ms = handler_lateness_ms(runs, starts)
    dispatched = [r.dispatched_at for r in runs if r.dispatched_at]
    # From the instant — or from the first dispatch, when runs went out ahead of it.
    first = min([due, *dispatched])
    span = max((max(dispatched, default=due) - first).total_seconds(), 1e-3)
    lost = history.lost(args.runs)
    twice = history.run_twice()
    result = {
        "benchmark": "spike",
        "backend": args.backend,
        "runs": args.runs,
        "schedulers": args.schedulers,
        "workers": args.workers,
        "dispatch_lead_s": args.dispatch_lead,
        "lease_ahead_s": args.lease_ahead,
        # Negative: dispatched ahead of the instant (not leasable before it).
        "dispatch_lateness_ms": percentiles(dispatch_ms),
        "start_lateness_ms": percentiles(start_ms),
        # At the handler's first statement in the worker (its clock: this machine's).
        "handler_start_lateness_ms": percentiles(handler_ms),
        "start_lateness_histogram_100ms": histogram(start_ms, 100),
        "dispatches_per_s": round(len(dispatch_ms) / span),
        "runs_lost": lost,
        "runs_run_twice": twice,
        "runs_executed_twice_by_handler": sum(1 for s in starts.values() if len(s) > 1),
        # Percent of one core per process over the CPU_BEFORE seconds before the
        # instant (dispatching and reserving ahead) and the CPU_WINDOW seconds from it;
        # "machine": every core, PostgreSQL included (100 per core).
        "cpu_percent_before_instant": usage["before"],
        "cpu_percent_after_instant": usage["after"],
    }
    d, s, h = (
        result["dispatch_lateness_ms"],
        result["start_lateness_ms"],
        result["handler_start_lateness_ms"],
    )
    report(
        f"spike: {args.runs} runs due at one instant ({args.backend})",
        result,
        [
            ("dispatch lateness (ms)", str(d["p50"]), str(d["p99"]), str(d["max"])),
            ("start lateness (ms)", str(s["p50"]), str(s["p99"]), str(s["max"])),
            ("start lateness at the handler (ms)", str(h["p50"]), str(h["p99"]), str(h["max"])),
            ("dispatches/s", str(result["dispatches_per_s"]), "", ""),
            ("runs lost", str(lost), "", ""),
            ("runs run or dispatched twice", str(twice), "", ""),
        ],
        ("measure", "p50 / value", "p99", "max"),
    )


if __name__ == "__main__":
    asyncio.run(main())

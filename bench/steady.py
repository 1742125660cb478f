"""Steady: R one-off runs a second due uniformly for S seconds, idle no-op workers waiting.

Starts real processes (``cronwheel api`` plus scheduler nodes on PostgreSQL, ``cronwheel
server`` on SQLite; ``cronwheel worker`` processes serving every tenant), creates the
runs through the HTTP API ahead of the window, spread over several tenants, with due
instants evenly spaced (1/R s apart) over a window that starts a little in the future.
Reports dispatch lateness (dispatched_at - due_at) and start lateness (started_at -
due_at), overall and per 10-second slice, runs lost, runs dispatched twice (more than one
SCHEDULED→DISPATCHED event) and the CPU each process used during the window.

    python bench/steady.py --rate 1000 --seconds 60 --schedulers 3 --workers 4 --tenants 10
"""

from __future__ import annotations

import argparse
import asyncio
import uuid
from datetime import datetime, timedelta
from typing import Any

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
    lateness_ms,
    percentiles,
    report,
    sample_window,
    start_cluster,
    wait_done,
    wait_shards_balanced,
)

# The targets, in milliseconds.
DISPATCH_P99_TARGET = 100.0
START_P99_TARGET = 250.0
SLICE = 10  # seconds


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=1000, help="runs due per second")
    parser.add_argument("--seconds", type=int, default=60, help="length of the window")
    parser.add_argument("--schedulers", type=int, default=3)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--tenants", type=int, default=10)
    parser.add_argument("--backend", choices=["sqlite", "postgresql"], default="postgresql")
    parser.add_argument("--concurrency", type=int, default=500, help="slots per worker")
    add_ahead_arguments(parser)
    parser.add_argument(
        "--lead",
        type=float,
        default=None,
        help="seconds between starting to create the runs and the window's start "
        "[default: 10 + runs / 800]",
    )
    args = parser.parse_args()
    for name in ("rate", "seconds", "schedulers", "workers", "tenants", "concurrency"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    async with bench_cluster(args.backend, env=ahead_env(args)) as cluster:
        await run_steady(cluster, args)


async def run_steady(cluster: Cluster, args: argparse.Namespace) -> None:
    total = args.rate * args.seconds
    console.print(
        f"[bold]steady[/]: {args.rate} runs/s for {args.seconds} s ({total} runs), "
        f"{args.tenants} tenant(s), backend {args.backend}, {args.schedulers} scheduler(s), "
        f"{args.workers} worker(s) of {args.concurrency} slots"
    )
    setup = await start_cluster(
        cluster,
        schedulers=args.schedulers,
        workers=args.workers,
        concurrency=args.concurrency,
        tenants=args.tenants,
    )
    try:
        if args.backend == "postgresql":
            held = await wait_shards_balanced(setup.store, args.schedulers)
            console.print(f"shards per node: {sorted(held.values())}")
        step = timedelta(seconds=1 / args.rate)
        lead = args.lead if args.lead is not None else 10 + total / 800
        start = await create_ahead(
            cluster,
            setup,
            lead=lead,
            dues=lambda at: [at + i * step for i in range(total)],
            name="steady",
        )
        cpu = asyncio.ensure_future(sample_window(cluster, start, args.seconds))
        finished = await wait_done(setup.store, total, timeout=lead + args.seconds + 300)
        cluster.check_alive()
        history = await collect(setup.store, setup.tenant_ids)
        starts = handler_starts(cluster)
        usage = await cpu
    finally:
        await setup.store.close()
    summarise(args, history, start, usage, finished, starts)


def slices(history: History, start: datetime, seconds: int) -> list[dict[str, Any]]:
    """Dispatch and start lateness per slice of the window, by due instant."""
    out = []
    for lo in range(0, seconds, SLICE):
        a, b = start + timedelta(seconds=lo), start + timedelta(seconds=lo + SLICE)
        dispatch_ms, start_ms = lateness_ms([r for r in history.runs if a <= r.due_at < b])
        out.append(
            {
                "from_s": lo,
                "runs": len(dispatch_ms),
                "dispatch_p99_ms": percentiles(dispatch_ms)["p99"],
                "start_p99_ms": percentiles(start_ms)["p99"],
            }
        )
    return out


def summarise(
    args: argparse.Namespace,
    history: History,
    start: datetime,
    usage: dict[str, float],
    finished: bool,
    starts: dict[uuid.UUID, list[float]],
) -> None:
    total = args.rate * args.seconds
    dispatch_ms, start_ms = lateness_ms(history.runs)
    d, s = percentiles(dispatch_ms), percentiles(start_ms)
    h = percentiles(handler_lateness_ms(history.runs, starts))
    dispatched = [r.dispatched_at for r in history.runs if r.dispatched_at]
    span = (max(dispatched) - min(dispatched)).total_seconds() if len(dispatched) > 1 else 0
    lost, twice = history.lost(total), history.dispatched_twice()
    result = {
        "benchmark": "steady",
        "backend": args.backend,
        "rate": args.rate,
        "seconds": args.seconds,
        "runs": total,
        "tenants": args.tenants,
        "schedulers": args.schedulers,
        "workers": args.workers,
        "concurrency": args.concurrency,
        "dispatch_lead_s": args.dispatch_lead,
        "lease_ahead_s": args.lease_ahead,
        "all_finished": finished,
        "dispatch_lateness_ms": d,
        "start_lateness_ms": s,
        # At the handler's first statement in the worker (its clock: this machine's).
        "handler_start_lateness_ms": h,
        "dispatches_per_s": round(len(dispatched) / span) if span else None,
        "runs_lost": lost,
        "runs_dispatched_twice": twice,
        "runs_run_twice": history.run_twice(),
        "runs_executed_twice_by_handler": sum(1 for t in starts.values() if len(t) > 1),
        "per_slice": slices(history, start, args.seconds),
        "cpu_percent": usage,
        "targets": {
            "dispatch_p99_ms": DISPATCH_P99_TARGET,
            "start_p99_ms": START_P99_TARGET,
            "dispatch_met": d["p99"] is not None and d["p99"] <= DISPATCH_P99_TARGET,
            "start_met": s["p99"] is not None and s["p99"] <= START_P99_TARGET,
        },
    }
    targets = result["targets"]
    rows = [
        (
            "dispatch lateness (ms)",
            str(d["p50"]),
            str(d["p99"]),
            str(d["max"]),
            f"≤ {DISPATCH_P99_TARGET:.0f} {'met' if targets['dispatch_met'] else 'MISSED'}",
        ),
        (
            "start lateness (ms)",
            str(s["p50"]),
            str(s["p99"]),
            str(s["max"]),
            f"≤ {START_P99_TARGET:.0f} {'met' if targets['start_met'] else 'MISSED'}",
        ),
        ("start lateness at the handler (ms)", str(h["p50"]), str(h["p99"]), str(h["max"]), ""),
        ("dispatches/s", str(result["dispatches_per_s"]), "", "", str(args.rate)),
        ("runs lost", str(lost), "", "", "0"),
        ("runs dispatched twice", str(twice), "", "", "0"),
    ]
    rows += [
        (
            f"dispatch, due {sl['from_s']}-{sl['from_s'] + SLICE} s",
            "",
            str(sl["dispatch_p99_ms"]),
            "",
            "",
        )
        for sl in result["per_slice"]
    ]
    rows += [(f"CPU % {name}", str(pct), "", "", "") for name, pct in sorted(usage.items())]
    report(
        f"steady: {args.rate} runs/s for {args.seconds} s ({args.backend})",
        result,
        rows,
        ("measure", "p50 / value", "p99", "max", "target (p99)"),
    )


if __name__ == "__main__":
    asyncio.run(main())

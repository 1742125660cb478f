"""Noisy neighbours: what one tenant's flood does to another tenant sharing its pool.

Real processes on PostgreSQL (``cronwheel api``, scheduler nodes, W ``cronwheel worker``
processes serving every tenant of pool ``bench`` with the admin key, each with the
worker's default 10 slots unless ``--concurrency`` says otherwise), handlers that take
``--handler-ms`` (50 ms) without holding the CPU. Every run is created through ``POST
/v1/jobs/batch`` before its instant. Each scenario gets a fresh database and processes:

- ``p0``: tenant A has ``--a-runs`` P2 runs due at T; tenant B ``--b-runs`` P0 runs due
  at T and as many at T + ``--b-gap`` s. Reports B's start lateness p50 / p99 / max at
  each instant, at the handler's first statement and by the database's ``started_at``
  (target: p99 ≤ 500 ms), A's completion rate against the pool's capacity (the workers'
  slots / handler time), runs lost and run twice, and the time from T to the last run.
- ``weights``: two tenants with weights ``--weights`` (PATCH /v1/tenants/{id} as the
  admin) flood the pool at the same priority, ``--weights-runs`` runs each due at T.
  Reports each tenant's share of the runs started in each 10 s window after the first,
  while both still had runs waiting, against weight / sum of weights ± 5 points.
- ``cap``: tenant C, ``max_concurrent_runs = --cap``, and tenant D flood the pool,
  ``--cap-runs`` runs each due at T. A checker reads the database every ``--poll-ms``
  and counts C's runs leased or running (RUNNING, or DISPATCHED and reserved); reports
  the largest count seen, the samples, and D's throughput.

Each scenario notes the machine's load average before it started its processes and
the machine's CPU while it ran (everything on the machine, PostgreSQL and other users
included), since figures from a shared machine depend on it.

    python bench/noisy_neighbour.py                          # all three, full size
    python bench/noisy_neighbour.py --scenario p0 --a-runs 100000 --b-runs 200
    python bench/noisy_neighbour.py --scenario weights --weights-runs 20000
    python bench/noisy_neighbour.py --scenario cap --cap 5 --cap-runs 10000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import httpx
from harness import (
    Cluster,
    History,
    Setup,
    add_ahead_arguments,
    ahead_env,
    bench_cluster,
    collect,
    console,
    create_runs,
    handler_lateness_ms,
    handler_starts,
    machine_busy,
    percentiles,
    print_table,
    start_cluster,
    wait_done,
)
from noisy_tables import P99_TARGET_MS, SHARE_TOLERANCE, Table, cap_table, p0_table, weights_table

from cronwheel.domain.model import Run

WINDOW_S = 10
SCENARIOS = ("p0", "weights", "cap")


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--scenario", action="append", choices=SCENARIOS, help="repeatable [default: all]"
    )
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument(
        "--concurrency", type=int, default=10, help="slots per worker (the worker's default)"
    )
    parser.add_argument("--handler-ms", type=float, default=50.0, help="each handler's time")
    parser.add_argument("--schedulers", type=int, default=1)
    parser.add_argument(
        "--lead",
        type=float,
        default=None,
        help="seconds from starting to create a scenario's runs to T [default: 15 + runs / 1000]",
    )
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=None,
        help="stop each scenario this many seconds after T and report what happened by "
        "then; runs not finished are counted as such, not as lost "
        "[default: wait for every run, at most 120 s + 8 * runs / the pool's capacity]",
    )
    parser.add_argument("--a-runs", type=int, default=100_000, help="p0: tenant A's P2 runs")
    parser.add_argument("--b-runs", type=int, default=200, help="p0: B's P0 runs per instant")
    parser.add_argument("--b-gap", type=float, default=5.0, help="p0: seconds between them")
    parser.add_argument(
        "--weights", type=int, nargs=2, default=[1, 3], metavar=("W1", "W2"), help="weights"
    )
    parser.add_argument("--weights-runs", type=int, default=20_000, help="weights: per tenant")
    parser.add_argument("--cap", type=int, default=5, help="cap: max_concurrent_runs of C")
    parser.add_argument("--cap-runs", type=int, default=10_000, help="cap: runs per tenant")
    parser.add_argument("--poll-ms", type=float, default=100.0, help="cap: checker period")
    add_ahead_arguments(parser)
    args = parser.parse_args()
    for name in ("workers", "concurrency", "schedulers", "a_runs", "b_runs", "weights_runs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.cap_runs < 1 or args.cap < 1 or min(args.weights) < 1 or args.handler_ms < 0:
        parser.error("sizes, weights and --cap must be at least 1, --handler-ms at least 0")
    return args


# -- shared steps -------------------------------------------------------------------------


@dataclass
class Scene:
    """One scenario's running cluster and what it measures on the way."""

    cluster: Cluster
    setup: Setup
    args: argparse.Namespace
    load_before: tuple[float, float, float]
    capacity_slots: int = 0
    busy0: tuple[float, float] = (0.0, 0.0)

    @property
    def capacity_per_s(self) -> float:
        """Runs a second the pool can finish: its slots / the handler's time."""
        handler_s: float = self.args.handler_ms / 1000
        return self.capacity_slots / max(handler_s, 1e-3)

    async def admin(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        headers = {"Authorization": f"Bearer {self.cluster.admin_key}"}
        async with httpx.AsyncClient(base_url=self.cluster.url, headers=headers) as client:
            r = await client.request(method, path, json=body)
            r.raise_for_status()
            return r.json()

    async def limit(self, tenant: int, limits: dict[str, Any]) -> dict[str, Any]:
        """PATCH a tenant's limits as the admin; returns the limits it answers."""
        out = await self.admin(
            "PATCH", f"/v1/tenants/{self.setup.tenant_ids[tenant]}", {"limits": limits}
        )
        return dict(out["limits"])

    async def wait_pool(self) -> None:
        """Wait until every worker has registered; note the pool's slots."""

        async def registered() -> int:
            items = (await self.admin("GET", "/v1/workers"))["items"]
            live = [w for w in items if w["live"] and w["pool"] == "bench"]
            return sum(w["capacity"] for w in live) if len(live) >= self.args.workers else 0

        self.capacity_slots = await self.cluster.wait_until(registered, 60, what="the workers")

    async def create(
        self, lead: float, plan: Sequence[tuple[int, int, Callable[[datetime], list[datetime]]]]
    ) -> datetime:
        """Create the runs of ``plan`` — (tenant, priority, their due instants given T) —
        T being ``lead`` s from now on the database clock (whole seconds); returns T."""
        at = (await self.setup.store.db_now() + timedelta(seconds=lead)).replace(microsecond=0)
        payload = {"seconds": self.args.handler_ms / 1000}
        t0 = time.monotonic()
        total = 0
        for tenant, priority, dues in plan:
            instants = dues(at)
            total += len(instants)
            await create_runs(
                self.cluster,
                [self.setup.keys[tenant]],
                instants,
                name=f"flood-{tenant}-p{priority}",
                task="sleep",
                payload=payload,
                priority=priority,
            )
        took = time.monotonic() - t0
        margin = (at - await self.setup.store.db_now()).total_seconds()
        if margin <= 0:
            raise SystemExit(f"creating the runs took {took:.1f} s, past T; raise --lead")
        console.print(
            f"created {total} runs in {took:.1f} s ({total / took:.0f}/s), "
            f"{margin:.1f} s before T = {at.isoformat()}"
        )
        self.busy0 = machine_busy()
        return at

    async def wait(self, at: datetime, runs: int) -> bool:
        """Wait for every run to finish, or until ``--max-seconds`` after T (by default
        a bound far above what the pool's capacity needs); True when all finished."""
        limit = self.args.max_seconds
        if limit is None:
            limit = 120 + 8 * runs / max(self.capacity_per_s, 1)
        left = (at - await self.setup.store.db_now()).total_seconds() + limit
        return await wait_done(self.setup.store, runs, max(left, 0.0))

    def machine(self) -> dict[str, Any]:
        """The load before the scenario and the machine's CPU since T (of all cores)."""
        busy1, total1 = machine_busy()
        cores = os.cpu_count() or 1
        pct = 100 * cores * (busy1 - self.busy0[0]) / max(1e-9, total1 - self.busy0[1])
        return {
            "load_average_before": [round(x, 2) for x in self.load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
            "cpu_percent_since_t": round(pct, 1),
            "cores": cores,
        }


async def scenario(
    args: argparse.Namespace, name: str, body: Callable[[Scene], Awaitable[dict[str, Any]]]
) -> dict[str, Any]:
    load = os.getloadavg()
    console.rule(
        f"[bold]{name}[/] (load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f})"
    )
    async with bench_cluster("postgresql", env=ahead_env(args)) as cluster:
        setup = await start_cluster(
            cluster,
            schedulers=args.schedulers,
            workers=args.workers,
            concurrency=args.concurrency,
            tenants=2,
        )
        try:
            scene = Scene(cluster=cluster, setup=setup, args=args, load_before=load)
            await scene.wait_pool()
            result = await body(scene)
            cluster.check_alive()
        except BaseException:
            # The cluster's folder goes with it: show what its API said first.
            console.print(
                f"[red]{name} failed[/]; the API's log ends:\n{cluster.log('api')[-4000:]}"
            )
            raise
        finally:
            await setup.store.close()
    return result


def lead_for(args: argparse.Namespace, runs: int) -> float:
    return args.lead if args.lead is not None else 15 + runs / 250


def outcome(history: History, expected: int) -> dict[str, int]:
    """Runs that succeeded, that had not finished when the scenario stopped, and that
    were lost: ended in another state, or never seen."""
    done = sum(1 for r in history.runs if r.state.value == "SUCCESS")
    unfinished = sum(1 for r in history.runs if r.finished_at is None)
    return {"runs_succeeded": done, "runs_unfinished": unfinished,
            "runs_lost": expected - done - unfinished}  # fmt: skip


def run_twice(history: History, starts: dict[uuid.UUID, list[float]]) -> dict[str, int]:
    """Runs with a second attempt or dispatch (the database), and runs whose handler ran
    more than once (the handlers' notes)."""
    return {
        "database": history.run_twice(),
        "handler": sum(1 for s in starts.values() if len(s) > 1),
    }


def seconds_after(
    runs: Sequence[Run], at: datetime, field: str, until: float | None = None
) -> list[float]:
    """Seconds from ``at`` to each run's ``field``, of those runs it is set on (and, with
    ``until``, at most that many seconds after ``at``: the processes go on while the
    runs are collected after a scenario stopped at ``--max-seconds``)."""
    out = [(getattr(r, field) - at).total_seconds() for r in runs if getattr(r, field)]
    return out if until is None else [x for x in out if x <= until]


# -- p0 -----------------------------------------------------------------------------------


async def p0(scene: Scene) -> dict[str, Any]:
    args = scene.args
    total = args.a_runs + 2 * args.b_runs
    gap = timedelta(seconds=args.b_gap)
    lead = lead_for(args, total)
    at = await scene.create(
        lead,
        [
            (1, 0, lambda t: [t] * args.b_runs + [t + gap] * args.b_runs),
            (0, 2, lambda t: [t] * args.a_runs),
        ],
    )
    finished = await scene.wait(at, total)
    machine = scene.machine()
    history = await collect(scene.setup.store, scene.setup.tenant_ids)
    starts = handler_starts(scene.cluster)
    a_id, b_id = scene.setup.tenant_ids
    a_runs = [r for r in history.runs if r.tenant_id == a_id]
    b_runs = [r for r in history.runs if r.tenant_id == b_id]
    instants = {}
    for label, due in (("T", at), (f"T+{args.b_gap:g}s", at + gap)):
        mine = [r for r in b_runs if r.due_at == due]
        by_db = [(r.started_at - r.due_at).total_seconds() * 1000 for r in mine if r.started_at]
        at_handler = handler_lateness_ms(mine, starts)
        sent = [
            (r.dispatched_at - r.due_at).total_seconds() * 1000 for r in mine if r.dispatched_at
        ]
        instants[label] = {
            "runs": len(mine),
            "not_started": len(mine) - len(by_db),
            "dispatch_lateness_ms": percentiles(sent),
            "start_lateness_handler_ms": percentiles(at_handler),
            "start_lateness_started_at_ms": percentiles(by_db),
            "p99_target_ms": P99_TARGET_MS,
            "met": bool(at_handler and by_db)
            and max(percentiles(at_handler)["p99"] or 0, percentiles(by_db)["p99"] or 0)
            <= P99_TARGET_MS,
        }
    a_sent = seconds_after(a_runs, at, "dispatched_at")
    a_done = seconds_after(a_runs, at, "finished_at", args.max_seconds)
    a_span = max(a_done, default=0.0)
    a_rate = len(a_done) / a_span if a_span > 0 else 0.0
    every_end = seconds_after(history.runs, at, "finished_at", args.max_seconds)
    return {
        "a_runs": args.a_runs,
        "b_runs_per_instant": args.b_runs,
        "all_finished": finished,
        "b": instants,
        "a_dispatched_s_after_t": [
            round(min(a_sent, default=0), 2),
            round(max(a_sent, default=0), 2),
        ],
        "a_finished": len(a_done),
        "a_completion_per_s": round(a_rate, 1),
        "pool_capacity_per_s": round(scene.capacity_per_s, 1),
        "pool_slots": scene.capacity_slots,
        "a_rate_of_capacity": round(a_rate / scene.capacity_per_s, 3),
        "a_last_finished_s_after_t": round(a_span, 2),
        "total_s_t_to_last_finished": round(max(every_end, default=0.0), 2),
        **outcome(history, total),
        "runs_run_twice": run_twice(history, starts),
        "handler_notes": len(starts),
        "machine": machine,
    }


# -- weights ------------------------------------------------------------------------------


async def weights(scene: Scene) -> dict[str, Any]:
    args = scene.args
    limits = [await scene.limit(i, {"weight": w}) for i, w in enumerate(args.weights)]
    total = 2 * args.weights_runs
    lead = lead_for(args, total)
    at = await scene.create(lead, [(i, 2, lambda t: [t] * args.weights_runs) for i in (0, 1)])
    finished = await scene.wait(at, total)
    machine = scene.machine()
    history = await collect(scene.setup.store, scene.setup.tenant_ids)
    starts = handler_starts(scene.cluster)
    ids = scene.setup.tenant_ids
    targets = [w / sum(args.weights) for w in args.weights]
    cut = args.max_seconds if args.max_seconds is not None else float("inf")
    # When each tenant's last run started: its backlog was empty from then on, so only
    # the windows before the first of these tell how the pool was shared. (Runs started
    # after --max-seconds, while the history was collected, are left out.)
    by_db = [
        seconds_after([r for r in history.runs if r.tenant_id == t], at, "started_at", cut)
        for t in ids
    ]
    by_handler = [
        [
            min(starts[r.id]) - at.timestamp()
            for r in history.runs
            if r.tenant_id == t and starts.get(r.id) and min(starts[r.id]) - at.timestamp() <= cut
        ]
        for t in ids
    ]
    # A tenant with runs not started yet was still waiting when the scenario stopped.
    last = max((x for mine in by_db for x in mine), default=0.0)
    stopped = last if cut == float("inf") else cut
    end = min(max(s) if len(s) == args.weights_runs else stopped for s in by_db)
    return {
        "weights": args.weights,
        "limits_answered": limits,
        "runs_per_tenant": args.weights_runs,
        "all_finished": finished,
        "target_shares": [round(t, 4) for t in targets],
        "tolerance": SHARE_TOLERANCE,
        "both_waiting_until_s_after_t": round(end, 2),
        "windows_started_at": shares(by_db, end, targets),
        "windows_handler": shares(by_handler, end, targets),
        **outcome(history, total),
        "runs_run_twice": run_twice(history, starts),
        "machine": machine,
    }


def shares(started: list[list[float]], end: float, targets: list[float]) -> list[dict[str, Any]]:
    """Each tenant's share of the runs started in each whole WINDOW_S window after the
    first that ends before ``end`` (seconds after T)."""
    out = []
    k = 1
    while (k + 1) * WINDOW_S <= end:
        lo, hi = k * WINDOW_S, (k + 1) * WINDOW_S
        counts = [sum(1 for s in mine if lo <= s < hi) for mine in started]
        n = sum(counts)
        got = [c / n if n else 0.0 for c in counts]
        out.append(
            {
                "from_s": lo,
                "to_s": hi,
                "started": counts,
                "shares": [round(g, 4) for g in got],
                "within": n > 0
                and all(abs(g - t) <= SHARE_TOLERANCE for g, t in zip(got, targets, strict=True)),
            }
        )
        k += 1
    return out


# -- cap ----------------------------------------------------------------------------------

HELD = """SELECT count(*) FROM runs WHERE tenant_id = $1
  AND (state = 'RUNNING' OR (state = 'DISPATCHED' AND reserved_token IS NOT NULL))"""


async def check_held(
    url: str, tenant_id: uuid.UUID, period: float, stop: asyncio.Event
) -> list[tuple[float, int]]:
    """(time.time(), runs of the tenant leased or running) every ``period`` s until
    ``stop``: read from the database, which every node's leases go through."""
    conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
    samples: list[tuple[float, int]] = []
    try:
        while not stop.is_set():
            t = time.time()
            samples.append((t, int(await conn.fetchval(HELD, tenant_id))))
            await asyncio.sleep(max(0.0, period - (time.time() - t)))
    finally:
        await conn.close()
    return samples


async def cap(scene: Scene) -> dict[str, Any]:
    args = scene.args
    limits = await scene.limit(0, {"max_concurrent_runs": args.cap})
    total = 2 * args.cap_runs
    lead = lead_for(args, total)
    at = await scene.create(lead, [(i, 2, lambda t: [t] * args.cap_runs) for i in (0, 1)])
    stop = asyncio.Event()
    checker = asyncio.ensure_future(
        check_held(scene.cluster.database_url, scene.setup.tenant_ids[0], args.poll_ms / 1000, stop)
    )
    finished = await scene.wait(at, total)
    stop.set()
    samples = await checker
    machine = scene.machine()
    history = await collect(scene.setup.store, scene.setup.tenant_ids)
    starts = handler_starts(scene.cluster)
    c_id, d_id = scene.setup.tenant_ids
    counts = [n for _, n in samples]
    rates = {}
    for label, tid in (("C", c_id), ("D", d_id)):
        mine = [r for r in history.runs if r.tenant_id == tid]
        done = seconds_after(mine, at, "finished_at", args.max_seconds)
        span = max(done, default=0.0)
        rates[label] = {
            "finished": len(done),
            "last_s_after_t": round(span, 2),
            "per_s": round(len(done) / span, 1) if span > 0 else None,
        }
    return {
        "cap": args.cap,
        "limits_answered": limits,
        "runs_per_tenant": args.cap_runs,
        "all_finished": finished,
        "samples": len(samples),
        "poll_ms": args.poll_ms,
        "first_sample_s_after_t": round(samples[0][0] - at.timestamp(), 2) if samples else None,
        "max_held": max(counts, default=0),
        "samples_over_cap": sum(1 for n in counts if n > args.cap),
        "held_histogram": {str(k): v for k, v in sorted(Counter(counts).items())},
        "held_series": [[round(t - at.timestamp(), 2), n] for t, n in samples],
        "within_cap": max(counts, default=0) <= args.cap,
        "throughput": rates,
        "pool_capacity_per_s": round(scene.capacity_per_s, 1),
        **outcome(history, total),
        "runs_run_twice": run_twice(history, starts),
        "machine": machine,
    }


# -- main ---------------------------------------------------------------------------------

BODIES: dict[str, Callable[[Scene], Awaitable[dict[str, Any]]]] = {
    "p0": p0,
    "weights": weights,
    "cap": cap,
}
TABLES: dict[str, Callable[[dict[str, Any]], Table]] = {
    "p0": p0_table,
    "weights": weights_table,
    "cap": cap_table,
}


async def main() -> None:
    # Stopped (SIGTERM, or SIGINT where a shell left it on), the scenario's processes are
    # stopped and its database dropped on the way out.
    task = asyncio.current_task()
    assert task is not None
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, task.cancel)
    args = arguments()
    chosen = [s for s in SCENARIOS if s in (args.scenario or SCENARIOS)]
    result: dict[str, Any] = {
        "benchmark": "noisy_neighbour",
        "backend": "postgresql",
        "workers": args.workers,
        "concurrency": args.concurrency,
        "handler_ms": args.handler_ms,
        "schedulers": args.schedulers,
        "dispatch_lead_s": args.dispatch_lead,
        "lease_ahead_s": args.lease_ahead,
        "scenarios": {},
    }
    for name in chosen:
        result["scenarios"][name] = await scenario(args, name, BODIES[name])
        if len(chosen) > 1:  # each as it ends; all of them again at the end
            print_table(*TABLES[name](result["scenarios"][name]))
    print(json.dumps(result, indent=2, default=str))
    for name in chosen:
        print_table(*TABLES[name](result["scenarios"][name]))


if __name__ == "__main__":
    asyncio.run(main())

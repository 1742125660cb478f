"""Cancel: how soon a running handler learns that its run was cancelled.

Starts real processes (``cronwheel api`` plus scheduler nodes on PostgreSQL, ``cronwheel
server`` on SQLite; ``cronwheel worker`` processes of the harness's bench handlers),
and in each round starts N handlers that wait until they are cancelled (``hold`` of
``noop_tasks.py``), then cancels them three ways: one ``POST /v1/runs/{id}/cancel`` each
(``--spacing`` apart), one ``POST /v1/jobs/{id}/cancel`` for a job whose N runs are
running, and one ``POST /v1/bulk/cancel`` naming the N runs (each of those two a random
moment up to ``--jitter`` after the handlers began: a worker that learns of cancels by
its heartbeats alone learns of one after what is left of its heartbeat period). The
lateness is measured where the user sees it: from the moment the cancel request was
sent to the moment the handler, in its worker process, is told (the instant its
``CancelledError`` arrives, noted by the handler). With ``--apis 2`` (PostgreSQL) the
cancels go through a second ``cronwheel api`` process while the workers talk to the
first.

It also counts the worker-protocol requests the API answered (``/metrics``) per second
while the workers are idle and while every slot holds a running handler.

    python bench/cancel.py
    python bench/cancel.py --backend postgresql --apis 2 --rounds 5
    python bench/cancel.py --backend sqlite
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
import uuid
from collections.abc import Sequence
from typing import Any

import httpx
from harness import (
    HANDLER_LOG_DIR,
    Cluster,
    Setup,
    bench_cluster,
    console,
    handler_starts,
    percentiles,
    print_table,
    report,
    start_cluster,
)

from cronwheel.testing import NOT_YET, free_port

TARGET_MS = 5000.0  # the bound for every cancel
AIM_P99_MS = 1000.0
PHASES = ("run", "job", "bulk")
# The worker protocol's routes, as the API's request counter names them.
PROTOCOL_ROUTES = (
    "/v1/workers/{worker_id}/lease",
    "/v1/workers/{worker_id}/start",
    "/v1/workers/{worker_id}/cancels",
    "/v1/attempts/batch",
)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["sqlite", "postgresql"], default="postgresql")
    parser.add_argument("--schedulers", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=10, help="slots per worker")
    parser.add_argument(
        "--runs",
        type=int,
        default=None,
        help="handlers per round [every slot: workers x concurrency]",
    )
    parser.add_argument("--rounds", type=int, default=5, help="rounds of each way to cancel")
    parser.add_argument(
        "--spacing",
        type=float,
        default=0.4,
        help="seconds between single cancels (spread over a heartbeat's interval)",
    )
    parser.add_argument(
        "--jitter",
        type=float,
        default=8.0,
        help="a job or bulk cancel goes a random moment up to this long after its handlers "
        "began (the workers' heartbeat period is 8.3 s by default)",
    )
    parser.add_argument(
        "--apis", type=int, choices=[1, 2], default=1, help="2: cancel through another API"
    )
    parser.add_argument(
        "--count-seconds",
        type=float,
        default=60.0,
        help="how long the protocol's requests are counted, idle and busy (a long-poll "
        "counts when answered: several of the workers' 20 s)",
    )
    parser.add_argument(
        "--timeout", type=float, default=30.0, help="per round: seconds to wait for handlers"
    )
    args = parser.parse_args()
    if args.runs is None:
        args.runs = args.workers * args.concurrency
    if not 1 <= args.runs <= args.workers * args.concurrency:
        parser.error("--runs must be between 1 and the slots (workers x concurrency)")
    if args.apis == 2 and args.backend != "postgresql":
        parser.error("--apis 2 needs PostgreSQL (SQLite is one process)")
    async with bench_cluster(args.backend) as cluster:
        result = await run_cancel(cluster, args)
    summarise(args, result)


async def run_cancel(cluster: Cluster, args: argparse.Namespace) -> dict[str, Any]:
    setup = await start_cluster(
        cluster, schedulers=args.schedulers, workers=args.workers, concurrency=args.concurrency
    )
    cancel_url = cluster.url
    if args.apis == 2:
        port = free_port()
        cluster.start("api-b", "api", "--port", str(port))
        cancel_url = f"http://127.0.0.1:{port}"
    operator = {"Authorization": f"Bearer {setup.keys[0]}"}
    admin = {"Authorization": f"Bearer {cluster.admin_key}"}
    async with (
        httpx.AsyncClient(base_url=cluster.url, headers=operator, timeout=60) as api,
        httpx.AsyncClient(base_url=cancel_url, headers=operator, timeout=60) as canceller,
        httpx.AsyncClient(base_url=cluster.url, headers=admin, timeout=60) as metrics,
    ):
        await cluster.wait_until(
            lambda: _ready(canceller), 60, what="the cancelling API", not_yet=NOT_YET
        )
        await _workers_registered(cluster, api, args.workers)
        console.print(f"counting the protocol's requests for {args.count_seconds:.0f} s, idle")
        idle = await count_requests(metrics, args.count_seconds)
        lateness: dict[str, list[float]] = {phase: [] for phase in PHASES}
        missed: dict[str, int] = dict.fromkeys(PHASES, 0)
        busy: dict[str, float] = {}
        bench = Bench(cluster, setup, api, canceller)
        jitter = random.Random(1)
        for round_no in range(args.rounds):
            for phase in PHASES:
                runs, job_id = await bench.hold(args.runs, one_job=phase == "job")
                if round_no == 0 and phase == "run":
                    console.print(
                        f"counting the protocol's requests for {args.count_seconds:.0f} s, "
                        f"{args.runs} handlers running"
                    )
                    busy = await count_requests(metrics, args.count_seconds)
                if phase != "run":
                    await asyncio.sleep(jitter.uniform(0, args.jitter))
                sent = await bench.cancel(phase, runs, job_id, spacing=args.spacing)
                seen = await bench.observed(runs, args.timeout)
                late = [(seen[r] - sent[r]) * 1000 for r in runs if r in seen]
                lateness[phase] += late
                missed[phase] += len(runs) - len(late)
                console.print(
                    f"round {round_no + 1}, {phase} cancel: {len(late)}/{len(runs)} told, "
                    f"max {max(late, default=float('nan')):.0f} ms"
                )
                await bench.finished(runs, args.timeout)
    everything = [v for values in lateness.values() for v in values]
    return {
        "lateness_ms": {phase: percentiles(values) for phase, values in lateness.items()},
        "all_ms": percentiles(everything),
        "told": {phase: len(values) for phase, values in lateness.items()},
        "not_told": missed,
        "requests_per_s": {"idle": idle, "busy": busy},
    }


async def _ready(client: httpx.AsyncClient) -> bool:
    return (await client.get("/readyz")).status_code == 200


async def _workers_registered(cluster: Cluster, api: httpx.AsyncClient, count: int) -> None:
    async def registered() -> bool:
        answer = (await api.get("/v1/workers", params={"pool": "bench"})).json()
        return sum(1 for w in answer["items"] if w["live"]) >= count

    await cluster.wait_until(registered, 60, what=f"{count} workers to register")


class Bench:
    """One round's steps: start handlers, cancel them, see them told and ended."""

    def __init__(
        self,
        cluster: Cluster,
        setup: Setup,
        api: httpx.AsyncClient,
        canceller: httpx.AsyncClient,
    ) -> None:
        self.cluster = cluster
        self.setup = setup
        self.api = api
        self.canceller = canceller

    async def hold(self, count: int, *, one_job: bool) -> tuple[list[uuid.UUID], str | None]:
        """``count`` running ``hold`` handlers: one job each, or runs of one job (its
        first plus triggers). Returns their run ids once every handler has begun."""
        job = {
            "name": "hold",
            "schedule": {"asap": True},
            "task": "hold",
            "pool": "bench",
            "retry": {"max_attempts": 1},
        }
        job_id = None
        if one_job:
            made = (await self.api.post("/v1/jobs", json=job)).raise_for_status().json()
            job_id = made["id"]
            runs = [uuid.UUID(made["first_run_id"])]
            for _ in range(count - 1):
                answer = await self.api.post(f"/v1/jobs/{job_id}/trigger")
                runs.append(uuid.UUID(answer.raise_for_status().json()["id"]))
        else:
            answer = await self.api.post("/v1/jobs/batch", json={"jobs": [job] * count})
            runs = [uuid.UUID(j["first_run_id"]) for j in answer.raise_for_status().json()["items"]]
        try:
            await self.cluster.wait_until(
                lambda: all(r in handler_starts(self.cluster) for r in runs),
                60,
                what=f"{count} handlers to begin",
            )
        except AssertionError:
            for name in self.cluster.procs:  # what the processes said, for the post-mortem
                console.print(f"[bold]{name}[/]:\n{self.cluster.log(name)[-4000:]}")
            console.print(f"runs by state: {await self.setup.store.runs_count_by_state()}")
            workers = (await self.api.get("/v1/workers")).json()["items"]
            console.print(f"workers: {[(w['running'], w['reserved']) for w in workers]}")
            raise
        return runs, job_id

    async def cancel(
        self, phase: str, runs: Sequence[uuid.UUID], job_id: str | None, *, spacing: float
    ) -> dict[uuid.UUID, float]:
        """Cancel ``runs`` the ``phase`` way; when each request was sent (time.time())."""
        sent: dict[uuid.UUID, float] = {}
        if phase == "run":
            for run_id in runs:
                sent[run_id] = time.time()
                answer = await self.canceller.post(f"/v1/runs/{run_id}/cancel")
                answer.raise_for_status()
                await asyncio.sleep(spacing)
        elif phase == "job":
            at = time.time()
            (await self.canceller.post(f"/v1/jobs/{job_id}/cancel")).raise_for_status()
            sent = dict.fromkeys(runs, at)
        else:
            at = time.time()
            body = {"selector": {"run_ids": [str(r) for r in runs]}, "reason": "bench"}
            (await self.canceller.post("/v1/bulk/cancel", json=body)).raise_for_status()
            sent = dict.fromkeys(runs, at)
        return sent

    async def observed(self, runs: Sequence[uuid.UUID], timeout: float) -> dict[uuid.UUID, float]:
        """When each of ``runs``' handlers was told of its cancel, as far as it was
        within ``timeout`` seconds."""
        wanted = set(runs)
        deadline = time.monotonic() + timeout
        while True:
            seen = {r: at for r, at in handler_cancels(self.cluster).items() if r in wanted}
            if len(seen) == len(wanted) or time.monotonic() > deadline:
                return seen
            await asyncio.sleep(0.1)

    async def finished(self, runs: Sequence[uuid.UUID], timeout: float) -> None:
        """Until every one of ``runs`` ended (CANCELLED) and its slot is free again."""
        tenant = self.setup.tenant_ids[0]
        deadline = time.monotonic() + timeout
        for run_id in runs:
            while (await self.setup.store.runs_get(tenant, run_id)).finished_at is None:
                if time.monotonic() > deadline:
                    console.print(f"[red]run {run_id} did not end in {timeout:.0f} s[/]")
                    return
                await asyncio.sleep(0.1)


def handler_cancels(cluster: Cluster) -> dict[uuid.UUID, float]:
    """When each run's ``hold`` handler was told of its cancel (time.time() in the
    worker), from the handlers' notes: the first time, for a run told twice."""
    told: dict[uuid.UUID, float] = {}
    for path in sorted((cluster.workdir / HANDLER_LOG_DIR).glob("cancels-*.txt")):
        for line in path.read_text().splitlines():
            fields = line.split("\t")
            if len(fields) == 4:  # a line still being written is skipped
                run_id, at = uuid.UUID(fields[0]), float(fields[2])
                told[run_id] = min(at, told.get(run_id, at))
    return told


async def count_requests(client: httpx.AsyncClient, seconds: float) -> dict[str, float]:
    """Worker-protocol requests the API answered per second over ``seconds``, by route
    (a long-poll counts when it is answered)."""
    before = await _protocol_counts(client)
    t0 = time.monotonic()
    await asyncio.sleep(seconds)
    after = await _protocol_counts(client)
    took = time.monotonic() - t0
    rates = {
        route.rsplit("/", 1)[1]: round((after.get(route, 0) - before.get(route, 0)) / took, 3)
        for route in PROTOCOL_ROUTES
    }
    rates["all"] = round(sum(rates.values()), 3)
    return rates


async def _protocol_counts(client: httpx.AsyncClient) -> dict[str, float]:
    text = (await client.get("/metrics")).raise_for_status().text
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("cronwheel_api_requests_total{"):
            continue
        labels, value = line.rsplit(" ", 1)
        for route in PROTOCOL_ROUTES:
            if f'route="{route}"' in labels:
                counts[route] = counts.get(route, 0) + float(value)
    return counts


def summarise(args: argparse.Namespace, result: dict[str, Any]) -> None:
    every = result["all_ms"]
    worst = every["max"]
    result = {
        "benchmark": "cancel",
        "backend": args.backend,
        "apis": args.apis,
        "schedulers": args.schedulers,
        "workers": args.workers,
        "concurrency": args.concurrency,
        "runs_per_round": args.runs,
        "spacing_s": args.spacing,
        "jitter_s": args.jitter,
        "rounds": args.rounds,
        **result,
        "targets": {
            "every_within_ms": TARGET_MS,
            "every_met": worst is not None
            and worst <= TARGET_MS
            and not sum(result["not_told"].values()),
            "p99_aim_ms": AIM_P99_MS,
            "p99_met": every["p99"] is not None and every["p99"] <= AIM_P99_MS,
        },
    }
    rows: list[tuple[str, ...]] = []
    for phase in PHASES:
        p = result["lateness_ms"][phase]
        rows.append(
            (
                f"{phase} cancel",
                str(result["told"][phase]),
                str(result["not_told"][phase]),
                *(str(p[k]) for k in ("p50", "p90", "p99", "max")),
            )
        )
    rows.append(
        (
            "all",
            str(sum(result["told"].values())),
            str(sum(result["not_told"].values())),
            *(str(every[k]) for k in ("p50", "p90", "p99", "max")),
        )
    )
    report(
        f"cancel → handler told: {args.rounds} rounds of {args.runs} handlers, "
        f"{args.workers} workers x {args.concurrency}, {args.backend}, {args.apis} API(s)",
        result,
        rows,
        ("cancel", "told", "not told", "p50 ms", "p90 ms", "p99 ms", "max ms"),
    )
    req = result["requests_per_s"]
    columns = ["all", *(route.rsplit("/", 1)[1] for route in PROTOCOL_ROUTES)]
    print_table(
        "worker-protocol requests the API answered per second",
        [(label, *(str(req[label].get(c)) for c in columns)) for label in ("idle", "busy")],
        ("workers", *columns),
    )


if __name__ == "__main__":
    asyncio.run(main())

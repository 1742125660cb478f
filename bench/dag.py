"""DAG: how soon a workflow's node starts once its upstream nodes have finished.

Three scenarios on PostgreSQL, each on a fresh database with real processes (``cronwheel
api``, S scheduler nodes, W ``cronwheel worker`` processes of C slots running the
no-op handler of ``noop_tasks.py``); every workflow is created through ``POST
/v1/workflows`` before the instant it fires at:

- **fanout**: one workflow, root -> N parallel nodes -> sink, fired by an ``at`` schedule;
- **chain**: one workflow of N nodes one after the other, fired the same way;
- **many**: M workflows of a K-node DAG each (a root, layers of up to six nodes each
  after two of the layer before, a sink), all with one cron schedule whose only
  occurrence of the day is the instant (``--many-schedule at``: an ``at`` instant).

For each: how long the workflow runs took (from the instant to the last one finished),
and each node's start delay — from its last upstream node finishing to its handler's
first statement in the worker. The upstream's finish is read two ways: its handler's
end as the worker saw it (the no-op handler's first statement is also its last, noted
with ``time.time()`` on this machine) and its run's ``finished_at`` in the database. A
root node's delay is its start lateness from the instant. Also: nodes not SUCCESS and
nodes whose handler ran more than once.

    python bench/dag.py --fanout 1000 --chain 200 --workflows 100 --nodes 20
    python bench/dag.py --scenario chain --chain 20
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from harness import (
    Cluster,
    Setup,
    bench_cluster,
    console,
    handler_starts,
    percentiles,
    progress_bar,
    report,
    start_cluster,
    wait_done,
)

SCENARIOS = ("fanout", "chain", "many")
DELAY_P99_TARGET = 100.0  # ms, the target for a node's start delay
POOL = "bench"
LAYER = 6  # widest layer of the many-workflows DAG
# Creating workflows is not what is measured: the per-key rate limit is out of the way.
ENV = {"CRONWHEEL_RATE_LIMIT": "0"}

Json = dict[str, Any]
Node = tuple[str, list[str]]  # a node's name and the nodes it comes after


# -- the shapes ----------------------------------------------------------------------------


def fanout_dag(width: int) -> list[Node]:
    middle = [f"n{i:04d}" for i in range(width)]
    return [("root", []), *[(n, ["root"]) for n in middle], ("sink", middle)]


def chain_dag(length: int) -> list[Node]:
    names = [f"c{i:04d}" for i in range(length)]
    return [(n, names[i - 1 : i]) for i, n in enumerate(names)]


def layered_dag(size: int) -> list[Node]:
    """A root, ``size - 2`` nodes in layers of up to ``LAYER``, each after two nodes of
    the layer before (one when that layer has one), and a sink after the last layer."""
    if size < 3:
        return chain_dag(size)
    nodes: list[Node] = [("root", [])]
    previous, made = ["root"], 0
    while made < size - 2:
        layer = [f"l{made + i:03d}" for i in range(min(LAYER, size - 2 - made))]
        for i, name in enumerate(layer):
            after = sorted({previous[i % len(previous)], previous[(i + 1) % len(previous)]})
            nodes.append((name, after))
        previous, made = layer, made + len(layer)
    nodes.append(("sink", previous))
    return nodes


def workflow_body(name: str, dag: list[Node], schedule: Json) -> Json:
    return {
        "name": name,
        "schedule": schedule,
        "nodes": [
            {
                "name": node,
                "task": "noop",
                "pool": POOL,
                "after": after,
                "retry": {"max_attempts": 1},
            }
            for node, after in dag
        ],
    }


# -- what happened -------------------------------------------------------------------------


@dataclass
class Measured:
    """Each workflow run (``GET /v1/workflow-runs/{id}``, with its nodes) and when each
    node run's handler began, by run id."""

    runs: list[Json]
    starts: dict[uuid.UUID, list[float]]

    def handler(self, run_id: str) -> float | None:
        seen = self.starts.get(uuid.UUID(run_id))
        return min(seen) if seen else None

    def started(self) -> Iterator[tuple[Json, float, float | None, float | None]]:
        """Each node whose handler ran: the node, when its handler began, and when its
        last upstream node finished — by the upstream handlers (None: one never ran)
        and by their runs' ``finished_at`` (None: one has none); both None for a root."""
        for run in self.runs:
            nodes = {n["node"]: n for n in run["nodes"]}
            for node in run["nodes"]:
                began = self.handler(node["run_id"])
                if began is None:
                    continue
                upstream = [nodes[u] for u in node["after"]]
                ends = [e for u in upstream if (e := self.handler(u["run_id"])) is not None]
                finished = [_instant(u["finished_at"]) for u in upstream if u["finished_at"]]
                by_handler = max(ends) if upstream and len(ends) == len(upstream) else None
                by_finish = (
                    max(finished).timestamp()
                    if upstream and len(finished) == len(upstream)
                    else None
                )
                yield node, began, by_handler, by_finish

    def delays_ms(self, names: set[str] | None = None) -> list[float]:
        """Start delays after the upstream handlers' end of the nodes named ``names``
        (every one with upstream nodes by default), in ms."""
        return [
            (began - ready) * 1000
            for node, began, ready, _ in self.started()
            if ready is not None and (names is None or node["node"] in names)
        ]

    def summary(self, nodes_each: int) -> Json:
        """Each workflow run measured from its own instant (its ``due_at``)."""
        by_finish = [(began - ready) * 1000 for _, began, _, ready in self.started() if ready]
        roots = [
            (began - _instant(run["due_at"]).timestamp()) * 1000
            for run in self.runs
            for node in run["nodes"]
            if not node["after"] and (began := self.handler(node["run_id"])) is not None
        ]
        node_runs = [n for run in self.runs for n in run["nodes"]]
        complete = [
            (_instant(r["finished_at"]) - _instant(r["due_at"])).total_seconds()
            for r in self.runs
            if r["finished_at"]
        ]
        return {
            "workflow_runs": len(self.runs),
            "workflow_runs_succeeded": sum(1 for r in self.runs if r["state"] == "SUCCESS"),
            "nodes": len(node_runs),
            "nodes_expected": nodes_each * len(self.runs),
            "nodes_not_success": sum(1 for n in node_runs if n["state"] != "SUCCESS"),
            "nodes_run_twice": sum(
                1 for n in node_runs if len(self.starts.get(uuid.UUID(n["run_id"]), ())) > 1
            ),
            "nodes_retried": sum(1 for n in node_runs if (n["attempt"] or 0) > 1),
            # From the instant the workflows fired to the last one finished (the longest
            # of several rounds).
            "all_complete_s": round(max(complete, default=0.0), 3),
            "complete_s": percentiles(complete),
            "start_delay_ms": percentiles(self.delays_ms()),
            "start_delay_from_finished_at_ms": percentiles(by_finish),
            "root_start_lateness_ms": percentiles(roots),
            # From a node's handler (its first statement, also its last) to its run's
            # finished_at: the worker's report of the result and the server's storing it.
            "finished_at_after_handler_ms": percentiles(self.recorded_ms()),
            # The start delay in two parts: to the lease (the server), then to the handler.
            "leased_after_finished_at_ms": percentiles(self.leased_ms()),
            "handler_after_leased_ms": percentiles(self.handler_after_lease_ms()),
            "nodes_started_per_s": self.start_rate(),
        }

    def leased_ms(self) -> list[float]:
        """Each node's run leased (its ``started_at``) after its last upstream run's
        ``finished_at``: the server's share of the start delay, in ms."""
        return [
            (_instant(node["started_at"]).timestamp() - ready) * 1000
            for node, _, _, ready in self.started()
            if ready is not None and node["started_at"]
        ]

    def handler_after_lease_ms(self) -> list[float]:
        """Each node's handler begun after its run was leased: the lease's answer on its
        way to the worker and the worker's share, in ms."""
        return [
            (began - _instant(node["started_at"]).timestamp()) * 1000
            for node, began, _, _ in self.started()
            if node["started_at"]
        ]

    def recorded_ms(self) -> list[float]:
        return [
            (_instant(n["finished_at"]).timestamp() - began) * 1000
            for run in self.runs
            for n in run["nodes"]
            if n["finished_at"] and (began := self.handler(n["run_id"])) is not None
        ]

    def start_rate(self, names: set[str] | None = None) -> int | None:
        """Handlers begun per second, from the first to the last of the nodes named
        ``names`` (every node by default) of the workflow runs of one instant; with
        several instants (rounds), the median of theirs."""
        by_instant: dict[str, list[Json]] = {}
        for run in self.runs:
            by_instant.setdefault(str(run["due_at"]), []).append(run)
        rates = []
        for runs in by_instant.values():
            began = sorted(
                at
                for node, at, _, _ in Measured(runs, self.starts).started()
                if names is None or node["node"] in names
            )
            span = began[-1] - began[0] if len(began) > 1 else 0.0
            if span:
                rates.append(len(began) / span)
        return round(statistics.median(rates)) if rates else None


def _instant(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


class Bench:
    """A cluster running, its tenant's operator client, and the workflows made."""

    def __init__(self, cluster: Cluster, setup: Setup, api: httpx.AsyncClient) -> None:
        self.cluster, self.setup, self.api = cluster, setup, api
        self.workflow_ids: list[str] = []

    async def instant(self, lead: float) -> datetime:
        """A whole second ``lead`` seconds from now on the database clock."""
        now = await self.setup.store.db_now()
        return (now + timedelta(seconds=lead)).replace(microsecond=0)

    async def create(self, bodies: list[Json], fires_at: datetime, concurrency: int = 4) -> float:
        """Create the workflows; exits when they were not all made before ``fires_at``.
        Returns the seconds it took."""
        gate = asyncio.Semaphore(concurrency)
        t0 = time.monotonic()
        with progress_bar() as progress:
            bar = progress.add_task("creating workflows", total=len(bodies))

            async def one(body: Json) -> None:
                async with gate:
                    r = await self.api.post("/v1/workflows", json=body)
                if r.status_code != 201:
                    raise SystemExit(f"POST /v1/workflows: {r.status_code} {r.text[:500]}")
                self.workflow_ids.append(r.json()["id"])
                progress.advance(bar)

            await asyncio.gather(*(one(b) for b in bodies))
        took = time.monotonic() - t0
        if datetime.now(UTC) >= fires_at:
            raise SystemExit(
                f"creating the workflows took {took:.1f} s, past the instant; raise --lead"
            )
        console.print(f"created {len(bodies)} workflow(s) in {took:.1f} s, firing at {fires_at}")
        return took

    async def measure(self, instant: datetime) -> Measured:
        """Each workflow's run of ``instant`` with its nodes, and the handlers' notes."""
        runs = []
        for workflow_id in self.workflow_ids:
            r = await self.api.get(f"/v1/workflows/{workflow_id}/runs", params={"limit": 10})
            r.raise_for_status()
            mine = [w for w in r.json()["items"] if _instant(w["due_at"]) == instant]
            for w in mine:
                got = await self.api.get(f"/v1/workflow-runs/{w['id']}")
                got.raise_for_status()
                runs.append(got.json())
        return Measured(runs=runs, starts=handler_starts(self.cluster))


Scenario = Callable[[Bench, argparse.Namespace], Awaitable[Json]]


async def one_workflow(
    bench: Bench, args: argparse.Namespace, name: str, dag: list[Node]
) -> tuple[Json, Measured]:
    """``--rounds`` workflows of ``dag``, one after the other, each created, fired at its
    own instant and waited for before the next: measured together."""
    lead = args.lead if args.lead is not None else 5 + len(dag) / 200
    created, done, runs = 0.0, True, []
    for round_ in range(args.rounds):
        if args.rounds > 1:
            console.print(f"round {round_ + 1} of {args.rounds}")
        instant = await bench.instant(lead)
        body = workflow_body(f"{name}-{round_}", dag, {"at": instant.isoformat()})
        created += await bench.create([body], instant)
        finished = (round_ + 1) * (len(dag) + 1)
        done = await wait_done(bench.setup.store, finished, args.timeout + lead) and done
        runs += (await bench.measure(instant)).runs
    measured = Measured(runs=runs, starts=handler_starts(bench.cluster))
    summary = {"done": done, "create_s": round(created / args.rounds, 3), "nodes_each": len(dag)}
    return {**summary, **measured.summary(len(dag))}, measured


def by_round(measured: Measured, names: set[str]) -> list[float | None]:
    """The p99 delay of the nodes named ``names`` in each workflow run, in order."""
    return [
        percentiles(Measured([run], measured.starts).delays_ms(names))["p99"]
        for run in sorted(measured.runs, key=lambda r: str(r["due_at"]))
    ]


async def fanout(bench: Bench, args: argparse.Namespace) -> Json:
    dag = fanout_dag(args.fanout)
    out, measured = await one_workflow(bench, args, "fanout", dag)
    middle = {n for n, _ in dag[1:-1]}
    out["fanout_start_delay_ms"] = percentiles(measured.delays_ms(middle))
    out["fanout_p99_by_round_ms"] = by_round(measured, middle)
    out["sink_start_delay_ms"] = percentiles(measured.delays_ms({"sink"}))
    # How fast the workers got through the parallel nodes: their capacity, not a delay.
    out["fanout_nodes_per_s"] = measured.start_rate(middle)
    return out


async def chain(bench: Bench, args: argparse.Namespace) -> Json:
    out, measured = await one_workflow(bench, args, "chain", chain_dag(args.chain))
    out["chain_p99_by_round_ms"] = by_round(measured, {n for n, _ in chain_dag(args.chain)})
    return out


async def many(bench: Bench, args: argparse.Namespace) -> Json:
    dag = layered_dag(args.nodes)
    lead = args.lead if args.lead is not None else 5 + args.workflows * args.nodes / 200
    instant = await bench.instant(lead)
    if args.many_schedule == "cron":
        # The next whole minute at least ``lead`` seconds away; a daily schedule at it
        # fires once during the benchmark.
        instant = (instant + timedelta(seconds=59)).replace(second=0)
        schedule: Json = {"cron": f"{instant.minute} {instant.hour} * * *", "timezone": "UTC"}
        wait = (instant - datetime.now(UTC)).total_seconds()
        console.print(f"the cron instant is {instant.isoformat()}, {wait:.0f} s away")
    else:
        schedule = {"at": instant.isoformat()}
    bodies = [workflow_body(f"many-{i:03d}", dag, schedule) for i in range(args.workflows)]
    created = await bench.create(bodies, instant)
    total = args.workflows * (len(dag) + 1)
    wait = max(0.0, (instant - datetime.now(UTC)).total_seconds())
    done = await wait_done(bench.setup.store, total, args.timeout + wait)
    measured = await bench.measure(instant)
    return {
        "done": done,
        "schedule": schedule,
        "create_s": round(created, 3),
        "nodes_each": len(dag),
        "edges_each": sum(len(after) for _, after in dag),
        **measured.summary(len(dag)),
    }


RUNNERS: dict[str, Scenario] = {"fanout": fanout, "chain": chain, "many": many}


async def run_scenario(name: str, args: argparse.Namespace) -> Json:
    console.print(
        f"[bold]dag {name}[/]: {args.schedulers} scheduler(s), "
        f"{args.workers} worker(s) x {args.concurrency} slots"
    )
    async with bench_cluster("postgresql", env=ENV) as cluster:
        setup = await start_cluster(
            cluster,
            schedulers=args.schedulers,
            workers=args.workers,
            concurrency=args.concurrency,
            worker_options=[] if args.prefetch is None else ["--prefetch", str(args.prefetch)],
        )
        headers = {"Authorization": f"Bearer {setup.keys[0]}"}
        try:
            async with httpx.AsyncClient(base_url=cluster.url, headers=headers, timeout=120) as api:
                result = await RUNNERS[name](Bench(cluster, setup, api), args)
            cluster.check_alive()
        finally:
            await setup.store.close()
    return result


def rows_of(name: str, r: Json) -> list[tuple[str, ...]]:
    def p(d: Json) -> tuple[str, str, str]:
        return str(d["p50"]), str(d["p99"]), str(d["max"])

    met = r["start_delay_ms"]["p99"] is not None and r["start_delay_ms"]["p99"] <= DELAY_P99_TARGET
    rows: list[tuple[str, ...]] = [
        (f"{name}: workflow runs done (s after the instant)", *p(r["complete_s"]), ""),
        (
            f"{name}: node start delay, after upstream handler (ms)",
            *p(r["start_delay_ms"]),
            f"≤ {DELAY_P99_TARGET:.0f} {'met' if met else 'MISSED'}",
        ),
        (
            f"{name}: node start delay, after upstream finished_at (ms)",
            *p(r["start_delay_from_finished_at_ms"]),
            "",
        ),
        (f"{name}: root start lateness (ms)", *p(r["root_start_lateness_ms"]), ""),
        (
            f"{name}: finished_at after the node's handler (ms)",
            *p(r["finished_at_after_handler_ms"]),
            "",
        ),
        (
            f"{name}: leased after upstream finished_at (ms)",
            *p(r["leased_after_finished_at_ms"]),
            "",
        ),
        (f"{name}: handler begun after its lease (ms)", *p(r["handler_after_leased_ms"]), ""),
        (f"{name}: node handlers begun/s", str(r["nodes_started_per_s"]), "", "", ""),
    ]
    if "fanout_start_delay_ms" in r:
        rows.append(
            (
                f"{name}: the {r['nodes_each'] - 2} parallel nodes' delay (ms)",
                *p(r["fanout_start_delay_ms"]),
                "",
            )
        )
        rows.append((f"{name}: the sink's delay (ms)", *p(r["sink_start_delay_ms"]), ""))
        rows.append((f"{name}: parallel nodes started/s", str(r["fanout_nodes_per_s"]), "", "", ""))
    for key in ("fanout_p99_by_round_ms", "chain_p99_by_round_ms"):
        if len(r.get(key) or ()) > 1:
            each = ", ".join(str(v) for v in r[key])
            rows.append((f"{name}: p99 of each round (ms)", each, "", "", ""))
    rows.append(
        (
            f"{name}: nodes not SUCCESS / run twice / retried",
            f"{r['nodes_not_success']} / {r['nodes_run_twice']} / {r['nodes_retried']}",
            "",
            "",
            "0",
        )
    )
    return rows


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--scenario", action="append", choices=SCENARIOS, help="repeatable; all by default"
    )
    parser.add_argument("--fanout", type=int, default=1000, help="parallel nodes of the fanout DAG")
    parser.add_argument("--chain", type=int, default=200, help="nodes of the chain")
    parser.add_argument("--workflows", type=int, default=100, help="workflows of the many scenario")
    parser.add_argument("--nodes", type=int, default=20, help="nodes of each of those workflows")
    parser.add_argument("--many-schedule", choices=["cron", "at"], default="cron")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="fanout and chain: workflows run one after the other, measured together",
    )
    parser.add_argument("--schedulers", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=10, help="slots per worker")
    parser.add_argument(
        "--prefetch",
        type=int,
        default=None,
        help="the workers' --prefetch (default: theirs, twice the concurrency)",
    )
    parser.add_argument(
        "--lead",
        type=float,
        default=None,
        help="seconds from creating the workflows to their instant",
    )
    parser.add_argument(
        "--timeout", type=float, default=300, help="seconds each scenario may take from its instant"
    )
    args = parser.parse_args()
    for name in (
        "fanout",
        "chain",
        "workflows",
        "nodes",
        "rounds",
        "schedulers",
        "workers",
        "concurrency",
    ):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.prefetch is not None and not 0 <= args.prefetch <= 10_000:
        parser.error("--prefetch must be from 0 to 10000")
    results = {name: await run_scenario(name, args) for name in args.scenario or SCENARIOS}
    result = {
        "benchmark": "dag",
        "backend": "postgresql",
        "schedulers": args.schedulers,
        "workers": args.workers,
        "concurrency": args.concurrency,
        "prefetch": args.prefetch,
        "rounds": args.rounds,
        "target_start_delay_p99_ms": DELAY_P99_TARGET,
        "scenarios": results,
    }
    rows = [row for name, r in results.items() for row in rows_of(name, r)]
    report(
        f"dag: {args.workers} workers x {args.concurrency} slots, {args.schedulers} scheduler(s)",
        result,
        rows,
        ("measure", "p50 / value", "p99", "max", "target (p99)"),
    )


if __name__ == "__main__":
    asyncio.run(main())

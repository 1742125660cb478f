"""Workflows run by real processes on PostgreSQL: ``cronwheel server`` (the API and a
scheduler node in one process) and ``cronwheel worker`` processes running
``workflow_tasks.py``'s handlers.

A diamond (a -> [b, c] -> d) completes with each node's payload holding its upstream
nodes' results. A chain survives the server being killed with ``kill -9`` — while a node
runs, and just after a node finished — and restarted: every node ends SUCCESS with one
successful attempt, none runs twice at once, none before its upstream node finished,
none is lost. A worker killed with ``kill -9`` mid-node: the node's attempt is declared
lost, the node is retried on another worker and the chain goes on."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from cronwheel.testing import NOT_YET, Cluster

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

HERE = Path(__file__).resolve().parent
Json = dict[str, Any]
POOL = "wf"
# A restarted server takes the shards over from the one killed once its leases lapse:
# a short lease keeps the tests short.
SERVER_ENV = {"CRONWHEEL_SHARD_LEASE_TTL": "2", "CRONWHEEL_RATE_LIMIT": "0", "COLUMNS": "250"}
# Attempts of a node that did not succeed and were followed by another.
RETRIED = {"LOST", "FAILED", "TIMED_OUT"}
# What workflow_tasks.py's handlers note each begin and end in (the workers import that
# module; this one must not: importing it registers its handlers in this process's
# global registry, where ``cronwheel worker --import json`` in a later test finds them).
EXECUTIONS = "executions.tsv"


@dataclass(frozen=True)
class Execution:
    """One execution of a ``wf.gate`` handler, from ``executions.tsv``."""

    node: str
    attempt: int
    run_id: str
    pid: int
    began: float
    ended: float | None  # None: its worker died first


def _executions(folder: Path) -> list[Execution]:
    begun: dict[tuple[str, int, int], list[str]] = {}
    ended: dict[tuple[str, int, int], float] = {}
    for line in (folder / EXECUTIONS).read_text().splitlines():
        what, node, attempt, run_id, pid, at = line.split("\t")
        key = (node, int(attempt), int(pid))
        if what == "begin":
            begun[key] = [run_id, at]
        else:
            ended[key] = float(at)
    return [
        Execution(node, attempt, run_id, pid, float(at), ended.get((node, attempt, pid)))
        for (node, attempt, pid), (run_id, at) in begun.items()
    ]


@dataclass
class Flows:
    """A running server, a tenant and its operator's HTTP client."""

    cluster: Cluster
    worker_key: str
    api: httpx.AsyncClient
    marks: Path

    def start_server(self) -> None:
        self.cluster.start("server", "server", "--port", str(self.cluster.port))

    async def restart_server(self) -> None:
        self.start_server()
        await self.cluster.wait_ready()

    def start_worker(self, name: str, concurrency: int = 2) -> None:
        self.cluster.start_worker(
            name,
            self.worker_key,
            pool=POOL,
            module="workflow_tasks",
            concurrency=concurrency,
            grace_period=1,
        )

    def node(self, name: str, after: Sequence[str] = (), **fields: Any) -> Json:
        payload = {"name": name, "dir": str(self.marks)}
        return {"name": name, "pool": POOL, "payload": payload, "after": list(after), **fields}

    async def create(self, name: str, nodes: list[Json]) -> Json:
        body = {"name": name, "schedule": {"asap": True}, "nodes": nodes}
        r = await self.api.post("/v1/workflows", json=body)
        assert r.status_code == 201, r.text
        made: Json = r.json()
        return made

    async def get(self, path: str) -> Json:
        r = await self.api.get(path)
        assert r.status_code == 200, r.text
        body: Json = r.json()
        return body

    async def first_run(self, workflow_id: str) -> Json:
        """The workflow's first run (it fires as soon as it is created)."""

        async def made() -> Json | None:
            items = (await self.get(f"/v1/workflows/{workflow_id}/runs"))["items"]
            return items[0] if items else None

        found: Json = await self.cluster.wait_until(made, 30, what="the workflow's run")
        return found

    async def finished(self, workflow_run_id: str, timeout: float = 120) -> Json:
        """The workflow run once it has ended, asking through restarts of the server."""
        seen: list[Json] = []

        async def done() -> Json | None:
            run = await self.get(f"/v1/workflow-runs/{workflow_run_id}")
            seen[:] = [run]
            return run if run["state"] in ("SUCCESS", "FAILED", "CANCELLED") else None

        def last() -> str:
            return f"the workflow run to end; last seen: {seen[-1] if seen else None}"

        ended: Json = await self.cluster.wait_until(done, timeout, what=last, not_yet=NOT_YET)
        return ended

    async def node_state(self, workflow_run_id: str, node: str, *states: str) -> Json:
        async def reached() -> Json | None:
            run = await self.get(f"/v1/workflow-runs/{workflow_run_id}")
            found = next(n for n in run["nodes"] if n["node"] == node)
            return found if found["state"] in states else None

        got: Json = await self.cluster.wait_until(
            reached, 60, what=f"node {node} {'/'.join(states)}", not_yet=NOT_YET
        )
        return got

    async def started(self, node: str) -> None:
        """Wait until an attempt of ``node`` has begun."""

        def begun() -> bool:
            return any(self.marks.glob(f"{node}.*.started"))

        await self.cluster.wait_until(begun, 90, what=f"{node} to begin")

    def release(self, *nodes: str) -> None:
        """Let the ``wf.gate`` handlers of ``nodes`` return (now or when they begin)."""
        for node in nodes:
            (self.marks / f"{node}.go").touch()

    async def node_runs(self, workflow_run: Json) -> dict[str, Json]:
        """Each node's run (``GET /v1/runs/{id}``: with its attempts and events)."""
        return {n["node"]: await self.get(f"/v1/runs/{n['run_id']}") for n in workflow_run["nodes"]}


@pytest.fixture
async def flows(pg_url: str, tmp_path: Path) -> AsyncIterator[Flows]:
    cluster = Cluster(
        database_url=pg_url, workdir=tmp_path, python_path=[HERE], extra_env=SERVER_ENV
    )
    marks = tmp_path / "marks"
    marks.mkdir()
    try:
        cluster.start("server", "server", "--port", str(cluster.port))
        await cluster.wait_ready()
        _, operator_key, worker_key = await cluster.tenant("workflows")
        headers = {"Authorization": f"Bearer {operator_key}"}
        async with httpx.AsyncClient(base_url=cluster.url, headers=headers, timeout=30) as api:
            yield Flows(cluster, worker_key, api, marks)
    finally:
        cluster.stop()


def _instant(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _counts(run: Json) -> dict[str, int]:
    return {state: n for state, n in run["counts"].items() if n}


def _transitions(run: Json) -> list[tuple[str | None, str | None]]:
    return [
        (e["from_state"], e["to_state"]) for e in run["events"] if e["kind"] == "run.transition"
    ]


def _check_attempts(name: str, run: Json) -> Json:
    """The node ran to one success: its last attempt SUCCEEDED, each one before it ended
    in a way that is retried; returns the successful attempt."""
    attempts = run["attempts"]
    states = [a["state"] for a in attempts]
    assert states and states[-1] == "SUCCEEDED", (name, states)
    assert set(states[:-1]) <= RETRIED, (name, states)
    assert [a["number"] for a in attempts] == list(range(1, len(attempts) + 1)), (name, states)
    assert run["attempt"] == len(attempts), (name, run["attempt"], states)
    assert _transitions(run).count(("RUNNING", "SUCCESS")) == 1, (name, _transitions(run))
    succeeded: Json = attempts[-1]
    return succeeded


def _check_order(
    executions: Iterable[Execution], runs: dict[str, Json], upstream: dict[str, list[str]]
) -> None:
    """No node ran twice at once, and none began before each of its upstream nodes'
    successful execution had ended."""
    by_node: dict[str, list[Execution]] = defaultdict(list)
    for e in executions:
        by_node[e.node].append(e)
    for node, mine in by_node.items():
        assert {e.run_id for e in mine} == {runs[node]["id"]}, (node, mine)
        for i, one in enumerate(mine):
            for other in mine[i + 1 :]:
                first, second = sorted((one, other), key=lambda e: e.began)
                assert first.ended is not None and first.ended <= second.began, (
                    f"{node} ran twice at once: {first} and {second}"
                )
    for node, befores in upstream.items():
        for before in befores:
            done = [
                e.ended
                for e in by_node[before]
                if e.attempt == runs[before]["attempt"] and e.ended is not None
            ]
            assert len(done) == 1, (before, by_node[before])
            for e in by_node[node]:
                assert e.began >= done[0], f"{node} began before {before} ended: {e}"


# -- a diamond ---------------------------------------------------------------------------


async def test_a_diamond_completes_with_its_upstream_results(flows: Flows) -> None:
    echo = {"task": "wf.echo"}
    workflow = await flows.create(
        "diamond",
        [
            flows.node("a", **echo),
            flows.node("b", ["a"], **echo),
            flows.node("c", ["a"], **echo),
            flows.node("d", ["b", "c"], **echo),
        ],
    )
    assert [(n["name"], n["after"]) for n in workflow["nodes"]] == [
        ("a", []),
        ("b", ["a"]),
        ("c", ["a"]),
        ("d", ["b", "c"]),
    ]
    flows.start_worker("wf-worker", concurrency=4)
    run = await flows.finished((await flows.first_run(workflow["id"]))["id"])

    assert (run["state"], run["workflow_id"], _counts(run)) == (
        "SUCCESS",
        workflow["id"],
        {"SUCCESS": 4},
    )
    assert [(n["node"], n["state"], n["attempt"]) for n in run["nodes"]] == [
        (name, "SUCCESS", 1) for name in "abcd"
    ]
    results = {n["node"]: n["result"] for n in run["nodes"]}
    assert results == {
        "a": {"node": "a", "attempt": 1, "upstream": []},
        "b": {"node": "b", "attempt": 1, "upstream": ["a"]},
        "c": {"node": "c", "attempt": 1, "upstream": ["a"]},
        "d": {"node": "d", "attempt": 1, "upstream": ["b", "c"]},
    }
    runs = await flows.node_runs(run)
    for name, node_run in runs.items():
        assert (node_run["workflow_run_id"], node_run["node"]) == (run["id"], name)
        assert node_run["payload"]["name"] == name  # its own payload, kept
    assert runs["a"]["payload"].get("upstream", {}) == {}
    assert runs["b"]["payload"]["upstream"] == {"a": results["a"]}
    assert runs["c"]["payload"]["upstream"] == {"a": results["a"]}
    assert runs["d"]["payload"]["upstream"] == {"b": results["b"], "c": results["c"]}
    # Each began once its upstream nodes had finished.
    finished = {name: _instant(node_run["finished_at"]) for name, node_run in runs.items()}
    started = {name: _instant(node_run["started_at"]) for name, node_run in runs.items()}
    assert started["b"] >= finished["a"] and started["c"] >= finished["a"]
    assert started["d"] >= max(finished["b"], finished["c"])


# -- kill -9 of the server ----------------------------------------------------------------


CHAIN = [f"n{i}" for i in range(1, 6)]


async def test_a_chain_survives_the_server_killed_between_nodes(flows: Flows) -> None:
    retry = {"max_attempts": 3, "initial_delay": 0.1, "jitter": "none"}
    nodes = [
        flows.node(name, CHAIN[i - 1 : i], task="wf.gate", retry=retry)
        for i, name in enumerate(CHAIN)
    ]
    workflow = await flows.create("chain", nodes)
    # Two slots: a node handed out twice could run twice at once, and would be seen.
    flows.start_worker("wf-worker", concurrency=2)
    workflow_run = await flows.first_run(workflow["id"])

    await flows.started("n1")
    flows.release("n1")
    await flows.started("n2")
    # Killed while n2 runs; n2 returns while the server is down (the worker keeps its
    # completion until the server answers again).
    flows.cluster.kill("server")
    flows.release("n2")
    await flows.restart_server()

    await flows.started("n3")
    flows.release("n3")
    # Killed as soon as n3's success is stored, before or while n4 is handed out.
    await flows.node_state(workflow_run["id"], "n3", "SUCCESS")
    flows.cluster.kill("server")
    await flows.restart_server()

    await flows.started("n4")
    flows.cluster.kill("server")  # and once more while n4 runs
    await flows.restart_server()
    flows.release("n4", "n5")

    run = await flows.finished(workflow_run["id"])
    assert (run["state"], _counts(run)) == ("SUCCESS", {"SUCCESS": len(CHAIN)})
    assert [(n["node"], n["state"]) for n in run["nodes"]] == [(n, "SUCCESS") for n in CHAIN]
    runs = await flows.node_runs(run)
    succeeded = {name: _check_attempts(name, node_run) for name, node_run in runs.items()}
    executions = _executions(flows.marks)
    # Each node's handler ran once, to its end, as its successful attempt: an attempt
    # before it can only be a lease the server granted as it was killed, never heard of
    # by the worker and declared lost (the server was down for a few seconds only, well
    # within a lease, so a running handler kept its attempt).
    assert sorted(e.node for e in executions) == CHAIN, executions
    assert all(e.ended is not None for e in executions), executions
    assert {e.node: e.attempt for e in executions} == {
        name: attempt["number"] for name, attempt in succeeded.items()
    }
    for name, node_run in runs.items():
        assert {a["state"] for a in node_run["attempts"][:-1]} <= {"LOST"}, (name, node_run)
    _check_order(executions, runs, {n: CHAIN[i - 1 : i] for i, n in enumerate(CHAIN) if i})
    for name in CHAIN[1:]:
        upstream = CHAIN[CHAIN.index(name) - 1]
        assert runs[name]["payload"]["upstream"] == {upstream: runs[upstream]["result"]}


# -- kill -9 of a worker ------------------------------------------------------------------


async def test_a_node_whose_worker_is_killed_is_retried_and_the_chain_goes_on(
    flows: Flows,
) -> None:
    retry = {"max_attempts": 3, "initial_delay": 0.1, "jitter": "none"}
    # A short heartbeat timeout: the killed worker's attempt is declared lost quickly.
    gate = {"task": "wf.gate", "retry": retry, "heartbeat_timeout": 3}
    names = ["x1", "x2", "x3"]
    workflow = await flows.create(
        "chain-worker",
        [flows.node(name, names[i - 1 : i], **gate) for i, name in enumerate(names)],
    )
    flows.release("x1", "x3")
    flows.start_worker("wf-a", concurrency=1)
    workflow_run = await flows.first_run(workflow["id"])
    await flows.started("x2")
    killed = flows.cluster.pid("wf-a")
    flows.start_worker("wf-b", concurrency=1)  # idle: x2 is held by wf-a
    flows.cluster.kill("wf-a")
    killed_at = time.time()  # the process is gone: kill() waits for it
    flows.release("x2")

    run = await flows.finished(workflow_run["id"])
    assert (run["state"], _counts(run)) == ("SUCCESS", {"SUCCESS": 3})
    runs = await flows.node_runs(run)
    for name, node_run in runs.items():
        _check_attempts(name, node_run)
    lost, second = runs["x2"]["attempts"]
    assert (lost["state"], second["state"]) == ("LOST", "SUCCEEDED")
    assert lost["worker_id"] != second["worker_id"]
    assert runs["x2"]["result"] == {"node": "x2", "attempt": 2, "upstream": ["x1"]}
    assert [len(runs[n]["attempts"]) for n in ("x1", "x3")] == [1, 1]
    assert runs["x3"]["payload"]["upstream"] == {"x2": runs["x2"]["result"]}

    executions = _executions(flows.marks)
    x2 = sorted((e for e in executions if e.node == "x2"), key=lambda e: e.attempt)
    assert [(e.attempt, e.pid, e.ended is None) for e in x2] == [
        (1, killed, True),
        (2, flows.cluster.pid("wf-b"), False),
    ]
    # The retry began after the first attempt's worker had died: never both at once.
    assert x2[1].began >= killed_at, (x2, killed_at)
    _check_order(
        [e for e in executions if e.ended is not None],
        runs,
        {"x2": ["x1"], "x3": ["x2"]},
    )

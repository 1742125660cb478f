"""``client.workflows`` against a real server (API and scheduler on a free port) on both
backends, its nodes worked by the real worker SDK; and the asyncio client over the app
in process."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager
from fastapi import FastAPI
from workflow_work import EtlTasks, work_until_over

from cronwheel import ApiError, AsyncClient, Client
from cronwheel.api import create_app
from cronwheel.client import Workflow
from cronwheel.runtime import BackgroundRuntime, Runtime
from cronwheel.settings import Settings
from cronwheel.store import Store
from cronwheel.testing import wait_until
from cronwheel.worker import TaskContext, Worker

ADMIN_KEY = "workflows-client-admin-key"
NODES = ("extract", "transform_a", "transform_b", "load")


def etl(name: str = "etl", **schedule: Any) -> Workflow:
    """The workflow of examples/pipeline.yaml, written with the builder."""
    wf = Workflow(name, schedule=schedule or {"delay": 3600}, tags=["etl"])
    extract = wf.node("extract", task="etl.extract", payload={"source": "s3"})
    parts = [wf.node(f"transform_{p}", task="etl.transform", payload={"part": p}) for p in "ab"]
    extract >> parts >> wf.node("load", task="etl.load")
    return wf


def _states(run: dict[str, Any]) -> dict[str, str]:
    return {n["node"]: n["state"] for n in run["nodes"]}


def test_a_workflow_runs_its_nodes_in_order_passing_results_down(
    live: tuple[str, Client, str],
) -> None:
    url, client, worker_key = live
    workflow = client.workflows.create(etl())
    assert workflow["name"] == "etl" and workflow["state"] == "active"
    assert [(n["name"], n["after"]) for n in workflow["nodes"]] == [
        ("extract", []),
        ("transform_a", ["extract"]),
        ("transform_b", ["extract"]),
        ("load", ["transform_a", "transform_b"]),
    ]
    assert client.workflows.get(workflow["id"]) == {**workflow, "first_run_id": None}

    run = client.workflows.trigger(workflow["id"], payload={"day": "2030-01-31"})
    assert run["workflow_id"] == workflow["id"]
    tasks = EtlTasks()
    done = work_until_over(tasks.worker(url, worker_key), lambda: client.workflows.run(run["id"]))

    assert done["state"] == "SUCCESS" and done["counts"] == {"SUCCESS": 4}
    assert _states(done) == dict.fromkeys(NODES, "SUCCESS")
    load = done["nodes"][3]
    assert load["result"] == {"loaded": ["transform_a", "transform_b"], "rows": 6}
    # Each node saw its own payload, the trigger's over it, and its upstream results.
    [extract_payload] = tasks.payloads["extract"]
    assert extract_payload["source"] == "s3" and extract_payload["day"] == "2030-01-31"
    assert sorted(p["part"] for p in tasks.payloads["transform"]) == ["a", "b"]
    assert tasks.payloads["transform"][0]["upstream"] == {"extract": {"rows": 3, "source": "s3"}}

    # The node runs are runs like any other.
    node_run = client.runs.get(load["run_id"])
    assert (node_run["workflow_run_id"], node_run["node"]) == (run["id"], "load")
    # Besides the run triggered, the first one, due in an hour.
    listed = {r["id"]: r for r in client.workflows.runs(workflow["id"]).items}
    assert set(listed) == {run["id"], workflow["first_run_id"]}
    assert listed[run["id"]]["state"] == "SUCCESS" and listed[run["id"]]["nodes"] is None
    assert listed[run["id"]]["counts"] == {"SUCCESS": 4}
    assert listed[workflow["first_run_id"]]["state"] == "SCHEDULED"
    assert client.workflows.runs(workflow["id"], state="FAILED").items == []


def test_a_failed_node_skips_downstream_until_retried(live: tuple[str, Client, str]) -> None:
    url, client, worker_key = live
    workflow = client.workflows.create(etl("flaky"))
    run = client.workflows.trigger(workflow["id"])
    tasks = EtlTasks("b")
    worker = tasks.worker(url, worker_key)

    failed = work_until_over(worker, lambda: client.workflows.run(run["id"]))
    assert failed["state"] == "FAILED"
    assert _states(failed) == {
        "extract": "SUCCESS",
        "transform_a": "SUCCESS",
        "transform_b": "FAILED",
        "load": "SKIPPED",
    }
    assert "upstream failed: transform_b" in failed["nodes"][3]["reason"]
    assert "part b is broken" in failed["nodes"][2]["last_error"]
    assert [r["id"] for r in client.workflows.runs(workflow["id"], state="FAILED").items] == [
        run["id"]
    ]

    with pytest.raises(ApiError) as refused:
        client.workflows.retry_node(run["id"], "transform_a")
    assert refused.value.status == 409

    tasks.failing.clear()
    again = client.workflows.retry_node(run["id"], "transform_b", reason="fixed part b")
    assert again["state"] == "RUNNING"
    assert _states(again)["load"] == "PENDING"
    assert _states(again)["transform_b"] in ("SCHEDULED", "DISPATCHED")

    done = work_until_over(worker, lambda: client.workflows.run(run["id"]))
    assert done["state"] == "SUCCESS" and set(_states(done).values()) == {"SUCCESS"}
    assert done["nodes"][3]["result"]["rows"] == 6
    assert len(tasks.payloads["extract"]) == 1  # what had succeeded did not run again


def test_a_workflow_run_is_cancelled_and_its_workflow_controlled(
    live: tuple[str, Client, str],
) -> None:
    _, client, _ = live
    wf = Workflow("nobody-serves-it", schedule={"cron": "0 3 * * *", "timezone": "UTC"})
    wf.node("first", task="not.served") >> wf.node("second", task="not.served")
    workflow = client.workflows.create(wf, idempotency_key="nobody-serves-it")
    assert workflow["next_due_at"] is not None
    # Retried with its key, the creation answers the workflow created first.
    assert client.workflows.create(wf, idempotency_key="nobody-serves-it") == workflow

    run = client.workflows.trigger(workflow["id"])
    # Fired: its first node is ready (no worker serves it), its second waits for it.
    wait_until(lambda: client.workflows.run(run["id"])["state"] == "RUNNING", 30, what="firing")
    assert _states(client.workflows.run(run["id"])) == {"first": "DISPATCHED", "second": "PENDING"}
    cancelled = client.workflows.cancel_run(run["id"], reason="not today")
    assert cancelled["state"] == "CANCELLED" and cancelled["finished_at"] is not None
    assert _states(cancelled) == {"first": "CANCELLED", "second": "CANCELLED"}
    assert cancelled["counts"] == {"CANCELLED": 2}

    assert client.workflows.pause(workflow["id"], reason="holiday")["state"] == "paused"
    assert client.workflows.resume(workflow["id"])["state"] == "active"
    assert client.workflows.cancel(workflow["id"])["state"] == "cancelled"
    assert [w["id"] for w in client.workflows.list().items] == [workflow["id"]]

    deleted = client.workflows.delete(workflow["id"], reason="gone")
    assert deleted["id"] == workflow["id"] and deleted["runs_deleted"] >= 2
    with pytest.raises(ApiError) as gone:
        client.workflows.get(workflow["id"])
    assert gone.value.status == 404
    assert client.workflows.list().items == []


def test_a_bad_workflow_is_refused_and_nothing_is_stored(live: tuple[str, Client, str]) -> None:
    _, client, _ = live
    cycle = {
        "name": "loop",
        "schedule": {"asap": True},
        "nodes": [
            {"name": "a", "task": "t", "after": ["c"]},
            {"name": "b", "task": "t", "after": ["a"]},
            {"name": "c", "task": "t", "after": ["b"]},
        ],
    }
    with pytest.raises(ApiError) as refused:
        client.workflows.create(cycle)
    assert refused.value.status == 422 and "cycle" in refused.value.message
    assert all(name in refused.value.message for name in ("a", "b", "c"))

    unknown = {**cycle, "nodes": [{"name": "a", "task": "t", "after": ["nowhere"]}]}
    with pytest.raises(ApiError) as refused:
        client.workflows.create(unknown)
    assert refused.value.status == 422 and "nowhere" in refused.value.message

    wf = Workflow("bad-node", schedule={"asap": True})
    wf.node("a", task="t", timeout=-1)
    with pytest.raises(ApiError) as refused:
        client.workflows.create(wf)
    assert refused.value.status == 422 and refused.value.field == "nodes.0.timeout"
    assert client.workflows.list().items == []
    assert client.jobs.list().items == []


# -- the asyncio client, over the app in process ---------------------------------------


def test_a_node_given_more_than_the_node_input_limit_fails(store_url: str, tmp_path: Path) -> None:
    # The server's limit, lowered to the payload limit: two upstream results of 40 kB
    # are over it together, so the node they are given to fails without running.
    limit = 64 * 1024
    settings = Settings(
        database_url=store_url,
        data_dir=tmp_path,
        port=0,
        admin_key=ADMIN_KEY,
        max_node_input_bytes=limit,
    )
    with (
        BackgroundRuntime(Runtime(settings)) as server,
        Client(server.url, api_key=ADMIN_KEY) as admin,
    ):
        tenant = admin.tenants.create(f"input-{uuid.uuid4().hex[:6]}")
        worker_key = admin.tenants.create_key(tenant["id"], role="worker")["api_key"]
        wf = Workflow("wide-results", schedule={"delay": 3600})
        [wf.node(n, task="big") for n in ("a", "b")] >> wf.node("join", task="small")
        ran: list[str] = []

        def big(ctx: TaskContext, payload: dict[str, Any]) -> dict[str, Any]:
            ran.append("big")
            return {"blob": "z" * 40_000}

        def small(ctx: TaskContext, payload: dict[str, Any]) -> None:
            ran.append("small")

        worker = Worker(server.url, api_key=worker_key, lease_wait=0.5)
        worker.task("big")(big)
        worker.task("small")(small)
        with Client(server.url, api_key=tenant["api_key"]) as client:
            run = client.workflows.trigger(client.workflows.create(wf)["id"])
            done = work_until_over(worker, lambda: client.workflows.run(run["id"]))
    assert done["state"] == "FAILED" and ran == ["big", "big"]
    join = done["nodes"][2]
    assert (join["node"], join["state"]) == ("join", "FAILED")
    assert join["reason"].startswith("input too large: ")
    assert f"the limit is {limit}" in join["reason"]


@pytest.fixture
async def app(store: Store, tmp_path: Path) -> AsyncIterator[FastAPI]:
    application = create_app(Settings(data_dir=tmp_path, admin_key=ADMIN_KEY), store)
    async with LifespanManager(application):
        yield application


@pytest.fixture
async def operator(app: FastAPI) -> AsyncIterator[AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with AsyncClient("http://cronwheel.test", api_key=ADMIN_KEY, transport=transport) as a:
        tenant = await a.tenants.create(f"wf-{uuid.uuid4().hex[:6]}")
    transport = httpx.ASGITransport(app=app)
    async with AsyncClient(
        "http://cronwheel.test", api_key=tenant["api_key"], transport=transport
    ) as client:
        yield client


async def test_the_async_client_does_the_same(operator: AsyncClient) -> None:
    workflow = await operator.workflows.create(etl("async").to_spec())
    assert await operator.workflows.get(workflow["id"]) == {**workflow, "first_run_id": None}
    page = await operator.workflows.list(limit=1)
    assert [w["id"] for w in page.items] == [workflow["id"]] and page.next_cursor is None

    run = await operator.workflows.trigger(workflow["id"], payload={"k": 1})
    assert run["state"] == "SCHEDULED" and run["payload"] == {"k": 1}
    detail = await operator.workflows.run(run["id"])
    assert [n["node"] for n in detail["nodes"]] == [
        "extract",
        "transform_a",
        "transform_b",
        "load",
    ]
    runs = (await operator.workflows.runs(workflow["id"], limit=5)).items
    assert {r["id"] for r in runs} == {run["id"], workflow["first_run_id"]}
    # Never fired (no scheduler here): the run is cancelled before any node was made.
    cancelled = await operator.workflows.cancel_run(run["id"])
    assert cancelled["state"] == "CANCELLED" and cancelled["id"] == run["id"]
    with pytest.raises(ApiError) as refused:
        await operator.workflows.retry_node(run["id"], "no-such-node")
    assert refused.value.status in (404, 409)

    assert (await operator.workflows.pause(workflow["id"]))["state"] == "paused"
    assert (await operator.workflows.resume(workflow["id"]))["state"] == "active"
    assert (await operator.workflows.cancel(workflow["id"]))["state"] == "cancelled"
    await operator.workflows.delete(workflow["id"])
    assert (await operator.workflows.list()).items == []

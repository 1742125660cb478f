"""Two ``cronwheel api`` processes on one PostgreSQL database, each with a data
directory of its own (two machines behind a balancer): whatever one is told, the other
knows — the admin key one of them made, the log lines a worker sent through one (read,
and followed with ``cronwheel runs logs --follow``, through the other), a key revoked
through one (although keys are cached for five minutes), a cancel asked of one (the
running handler of a worker connected to the other hears of it without a heartbeat)."""

from __future__ import annotations

import asyncio
import re
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from cronwheel.cli import app as cli_app
from cronwheel.store import create_store
from cronwheel.store.sql import SqlStore
from cronwheel.testing import NOT_YET, Cluster, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

SHOWN = re.compile(r"admin key \(shown once[^)]*\): (\S+)")
HERE = Path(__file__).resolve().parent


async def test_two_api_nodes_share_the_admin_key_logs_and_revocations(
    pg_url: str, tmp_path: Path
) -> None:
    cluster = Cluster(database_url=pg_url, workdir=tmp_path)
    ports = {"a": cluster.port, "b": free_port()}
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    for name, port in ports.items():  # at once, on an empty database: a race to make it
        (tmp_path / name).mkdir()
        cluster.start(
            name,
            "api",
            "--port",
            str(port),
            env={
                "CRONWHEEL_ADMIN_KEY": "",
                "CRONWHEEL_DATA_DIR": str(tmp_path / name),
                "CRONWHEEL_API_POOL_SIZE": "4",
                "CRONWHEEL_KEY_CACHE_TTL": "300",
                "PYTHONUNBUFFERED": "1",  # what it prints reaches its log at once
            },
        )
    store = create_store(pg_url)
    await store.open()
    try:
        async with httpx.AsyncClient(timeout=30) as http:

            async def ready() -> bool:
                answers = [await http.get(f"{url}/readyz") for url in urls.values()]
                return all(r.status_code == 200 for r in answers)

            await cluster.wait_until(ready, 60, what="both API nodes to be ready", not_yet=NOT_YET)
            await cluster.wait_until(
                lambda: all("admin key" in cluster.log(name) for name in ports),
                30,
                what="both nodes to tell of the admin key",
            )
            shown = {name: SHOWN.findall(cluster.log(name)) for name in ports}
            # Exactly one node made the key and showed it; the other found it.
            [maker] = [name for name, keys in shown.items() if keys]
            [key] = shown[maker]
            assert all(not (tmp_path / name / "admin.key").exists() for name in ports)
            assert isinstance(store, SqlStore)
            async with store.engine.connect() as conn:
                admins = await conn.execute(
                    sa.text("SELECT count(*) FROM api_keys WHERE role = 'admin'")
                )
                assert admins.scalar_one() == 1
            admin = {"Authorization": f"Bearer {key}"}
            for url in urls.values():  # the key works on both nodes
                assert (await http.get(f"{url}/v1/tenants", headers=admin)).status_code == 200

            # A tenant, its keys and a job through node A.
            a, b = urls["a"], urls["b"]
            made = (await http.post(f"{a}/v1/tenants", json={"name": "t"}, headers=admin)).json()
            operator = {"Authorization": f"Bearer {made['api_key']}"}
            keys = {}
            for role in ("worker", "viewer"):
                r = await http.post(
                    f"{a}/v1/tenants/{made['id']}/keys", json={"role": role}, headers=admin
                )
                keys[role] = {"Authorization": f"Bearer {r.json()['api_key']}"}
            job = {"name": "j", "schedule": {"asap": True}, "task": "t.run"}
            r = await http.post(f"{a}/v1/jobs", json=job, headers=operator)
            assert r.status_code == 201, r.text
            run_id = r.json()["first_run_id"]

            # Fired as a scheduler would; leased and logged through node A.
            await store.shard_leases_acquire(node_id="t", shards=range(256), ttl=60)
            due = await store.runs_due_scan(
                shards=range(256), until=await store.db_now() + timedelta(seconds=1)
            )
            assert len(await store.runs_fire(run_ids=[d.id for d in due], node_id="t")) == 1
            worker = (await http.post(f"{a}/v1/workers", json={}, headers=keys["worker"])).json()
            r = await http.post(
                f"{a}/v1/workers/{worker['worker_id']}/lease",
                json={"max": 1},
                headers=keys["worker"],
            )
            [attempt] = r.json()["attempts"]
            line = {"ts": "2031-03-04T12:00:00Z", "level": "INFO", "message": "through A"}
            r = await http.post(
                f"{a}/v1/attempts/{attempt['attempt_id']}/logs",
                json={"fencing_token": attempt["fencing_token"], "lines": [line]},
                headers=keys["worker"],
            )
            assert r.status_code == 200 and r.json()["accepted"] == 1, r.text
            # ... and read through node B.
            r = await http.get(f"{b}/v1/runs/{run_id}/logs", headers=operator)
            assert r.status_code == 200, r.text
            assert [x["message"] for x in r.json()["lines"]] == ["through A"]
            # Once the run is over, following its log through B ends with every line.
            r = await http.post(
                f"{a}/v1/attempts/{attempt['attempt_id']}/complete",
                json={"fencing_token": attempt["fencing_token"]},
                headers=keys["worker"],
            )
            assert r.status_code == 200, r.text
            followed = await asyncio.to_thread(
                CliRunner().invoke,
                cli_app,
                ["runs", "logs", run_id, "--follow"],
                env={"CRONWHEEL_URL": b, "CRONWHEEL_API_KEY": made["api_key"]},
            )
            assert followed.exit_code == 0, followed.output
            assert "through A" in followed.stdout

            # A key node B has cached is revoked through node A: B refuses it at once.
            assert (await http.get(f"{b}/v1/jobs", headers=keys["viewer"])).status_code == 200
            listed = (await http.get(f"{a}/v1/tenants/{made['id']}/keys", headers=admin)).json()
            [viewer] = [k for k in listed["items"] if k["role"] == "viewer"]
            r = await http.delete(f"{a}/v1/tenants/{made['id']}/keys/{viewer['id']}", headers=admin)
            assert r.status_code == 200, r.text

            async def refused_by_b() -> bool:
                r = await http.get(f"{b}/v1/jobs", headers=keys["viewer"])
                return r.status_code == 401

            await cluster.wait_until(refused_by_b, 3.0, what="node B to refuse the revoked key")
            assert (await http.get(f"{b}/v1/jobs", headers=operator)).status_code == 200
    finally:
        cluster.stop()
        await store.close()


async def test_a_cancel_through_one_node_reaches_a_worker_on_the_other(
    pg_url: str, tmp_path: Path
) -> None:
    # Heartbeats an hour apart: only the cancels long-poll, woken across processes by
    # LISTEN/NOTIFY, can tell the handler within the test.
    cluster = Cluster(
        database_url=pg_url,
        workdir=tmp_path,
        python_path=[HERE],
        extra_env={"CRONWHEEL_HEARTBEAT_INTERVAL": "3600", "CRONWHEEL_API_POOL_SIZE": "4"},
    )
    urls = {"a": cluster.url, "b": f"http://127.0.0.1:{free_port()}"}
    for name, url in urls.items():
        cluster.start(name, "api", "--port", url.rsplit(":", 1)[1])
    marks = tmp_path / "marks"
    marks.mkdir()
    store = create_store(pg_url)
    await store.open()
    try:
        async with httpx.AsyncClient(timeout=30) as http:

            async def ready() -> bool:
                answers = [await http.get(f"{url}/readyz") for url in urls.values()]
                return all(r.status_code == 200 for r in answers)

            await cluster.wait_until(ready, 60, what="both API nodes to be ready", not_yet=NOT_YET)
            _, operator_key, worker_key = await cluster.tenant("t")  # through node A
            operator = {"Authorization": f"Bearer {operator_key}"}
            job = {
                "name": "j",
                "schedule": {"asap": True},
                "task": "fault.hang",
                "heartbeat_timeout": 3600,
                "payload": {"dir": str(marks)},
            }
            r = await http.post(f"{urls['a']}/v1/jobs", json=job, headers=operator)
            assert r.status_code == 201, r.text
            run_id = r.json()["first_run_id"]
            await store.shard_leases_acquire(node_id="t", shards=range(256), ttl=60)
            due = await store.runs_due_scan(
                shards=range(256), until=await store.db_now() + timedelta(seconds=1)
            )
            assert len(await store.runs_fire(run_ids=[d.id for d in due], node_id="t")) == 1
            # The worker talks to node A only.
            cluster.start_worker("w", worker_key, pool="default", module="fault_tasks")
            await cluster.wait_until(
                lambda: (marks / f"{run_id}.1.started").exists(), 60, what="the handler to begin"
            )

            r = await http.post(f"{urls['b']}/v1/runs/{run_id}/cancel", headers=operator)
            assert r.status_code == 200 and r.json()["state"] == "RUNNING", r.text
            await cluster.wait_until(
                lambda: (marks / f"{run_id}.1.cancelled").exists(),
                60,
                what="the handler to hear of the cancel made through node B",
            )

            async def cancelled() -> bool:
                r = await http.get(f"{urls['b']}/v1/runs/{run_id}", headers=operator)
                return r.json()["state"] == "CANCELLED"

            await cluster.wait_until(cancelled, 30, what="the run to end CANCELLED")
    finally:
        cluster.stop()
        await store.close()

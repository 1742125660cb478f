"""Runs no live worker can take, through the API: ``wait_reason`` on the run,
``GET /v1/alerts`` (tenant-scoped, every tenant's for the admin key), the
``cronwheel_runs_unroutable`` gauge, the client and ``cronwheel alerts``; on both
backends."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cronwheel import Client
from cronwheel.cli import app as cli_app
from cronwheel.runtime import BackgroundRuntime, Runtime
from cronwheel.settings import Settings
from cronwheel.store import Store
from cronwheel.testing import wait_until

ALL_SHARDS = list(range(256))


def _reason(pool: str) -> str:
    return f"no live worker in pool {pool!r} has capabilities ['cuda']"


async def _check(store: Store) -> None:
    await store.runs_route_check(shards=ALL_SHARDS, min_wait=0.0, worker_ttl=30.0)


def _gauge(metrics_text: str, pool: str) -> float | None:
    match = re.search(
        rf'^cronwheel_runs_unroutable\{{pool="{re.escape(pool)}"\}} (\S+)$',
        metrics_text,
        re.MULTILINE,
    )
    return None if match is None else float(match.group(1))


# A pool the operator lists for metrics: it gets a label value of its own.
LISTED = "gpu-listed"


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"metrics_pools": ["default", LISTED]})


async def test_unroutable_run_shows_its_reason_alert_and_metric(api, store: Store) -> None:  # type: ignore[no-untyped-def]
    t, other = await api.tenant(), await api.tenant()
    pool = LISTED
    job = await api.job(t, pool=pool, requires=["cuda"])
    run_id = job["first_run_id"]
    await api.fire()
    api.app.state.api.runs_by_state.max_age = 0  # every scrape refreshes
    got = await api.client.get(f"/v1/runs/{run_id}", headers=t.headers)
    assert (got.json()["state"], got.json()["wait_reason"]) == ("DISPATCHED", None)

    await _check(store)
    got = await api.client.get(f"/v1/runs/{run_id}", headers=t.headers)
    assert got.json()["wait_reason"] == _reason(pool)
    assert [e["reason"] for e in got.json()["events"] if e["kind"] == "run.waiting"] == [
        _reason(pool)
    ]
    listed = await api.client.get("/v1/runs", headers=t.headers)
    assert listed.json()["items"][0]["wait_reason"] == _reason(pool)

    alerts = await api.client.get("/v1/alerts", headers=t.headers)
    assert alerts.status_code == 200, alerts.text
    [alert] = alerts.json()["items"]
    assert alert == {
        "kind": "unroutable_runs",
        "tenant_id": t.id,
        "pool": pool,
        "requires": ["cuda"],
        "route_tags": [],
        "runs": 1,
        "since": got.json()["dispatched_at"],
        "message": f"1 run waiting: {_reason(pool)}",
        "job_id": None,
        "run_ids": [],
    }
    assert _gauge((await api.client.get("/metrics", headers=api.admin)).text, pool) == 1.0

    # A worker that can take it appears: the next check clears the reason everywhere.
    worker_key = await api.key(t, "worker")
    r = await api.client.post(
        "/v1/workers", json={"pool": pool, "capabilities": ["cuda"]}, headers=worker_key
    )
    assert r.status_code == 200, r.text
    await _check(store)
    got = await api.client.get(f"/v1/runs/{run_id}", headers=t.headers)
    assert (got.json()["state"], got.json()["wait_reason"]) == ("DISPATCHED", None)
    assert (await api.client.get("/v1/alerts", headers=t.headers)).json()["items"] == []
    assert _gauge((await api.client.get("/metrics", headers=api.admin)).text, pool) == 0.0
    assert (await api.client.get("/v1/alerts", headers=other.headers)).json()["items"] == []


async def test_alerts_are_scoped_by_key(api, store: Store) -> None:  # type: ignore[no-untyped-def]
    one, two, quiet = await api.tenant(), await api.tenant(), await api.tenant()
    pool = f"gpu-{uuid.uuid4().hex[:6]}"
    await api.job(one, pool=pool, requires=["cuda"])
    await api.job(one, pool=pool, requires=["cuda"])
    await api.job(two, pool=pool, requires=["cuda"])
    await api.fire()
    await _check(store)

    async def alerts(headers: dict[str, str]) -> list[dict[str, Any]]:
        r = await api.client.get("/v1/alerts", headers=headers)
        assert r.status_code == 200, r.text
        return [a for a in r.json()["items"] if a["pool"] == pool]

    [mine] = await alerts(one.headers)
    assert (mine["tenant_id"], mine["runs"]) == (one.id, 2)
    assert mine["message"] == f"2 runs waiting: {_reason(pool)}"
    assert [a["tenant_id"] for a in await alerts(two.headers)] == [two.id]
    assert await alerts(quiet.headers) == []
    assert [a["tenant_id"] for a in await alerts(await api.key(one, "viewer"))] == [one.id]
    # The admin key sees every tenant's, or one tenant's when it names it.
    assert sorted(a["tenant_id"] for a in await alerts(api.admin)) == sorted([one.id, two.id])
    named = {**api.admin, "Cronwheel-Tenant": two.id}
    assert [a["tenant_id"] for a in await alerts(named)] == [two.id]

    unknown = await api.client.get(
        "/v1/alerts", headers={**api.admin, "Cronwheel-Tenant": str(uuid.uuid4())}
    )
    assert unknown.status_code == 404
    assert unknown.json()["error"]["field"] == "Cronwheel-Tenant"
    worker = await api.client.get("/v1/alerts", headers=await api.key(one, "worker"))
    assert worker.status_code == 403
    assert (await api.client.get("/v1/alerts")).status_code == 401


async def test_a_reason_left_on_a_cancelled_run_is_not_shown(api, store: Store) -> None:  # type: ignore[no-untyped-def]
    t = await api.tenant()
    pool = f"gpu-{uuid.uuid4().hex[:6]}"
    run_id = (await api.job(t, pool=pool, requires=["cuda"]))["first_run_id"]
    await api.fire()
    await _check(store)
    r = await api.client.post(f"/v1/runs/{run_id}/cancel", headers=t.headers)
    assert (r.json()["state"], r.json()["wait_reason"]) == ("CANCELLED", None)
    assert (await api.client.get("/v1/alerts", headers=t.headers)).json()["items"] == []


async def test_deregistering_marks_the_worker(api, store: Store) -> None:  # type: ignore[no-untyped-def]
    t = await api.tenant()
    key = await api.key(t, "worker")
    r = await api.client.post("/v1/workers", json={"pool": "p"}, headers=key)
    worker_id = uuid.UUID(r.json()["worker_id"])
    assert (await store.workers_get(worker_id)).deregistered_at is None
    gone = await api.client.delete(f"/v1/workers/{worker_id}", headers=key)
    assert gone.status_code == 200, gone.text
    assert (await store.workers_get(worker_id)).deregistered_at is not None


def test_the_scheduler_finds_them_and_the_client_and_cli_show_them(
    store_url: str, tmp_path: Path
) -> None:
    """A real server: its scheduler's routing check records the reason by itself."""
    admin_key = "alerts-admin-key"
    settings = Settings(
        database_url=store_url,
        data_dir=tmp_path,
        port=0,
        admin_key=admin_key,
        route_check_interval=0.2,
        route_wait=0.0,
    )
    with (
        BackgroundRuntime(Runtime(settings)) as running,
        Client(running.url, api_key=admin_key) as admin,
    ):
        tenant = admin.tenants.create(f"alerts-{uuid.uuid4().hex[:6]}")
        with Client(running.url, api_key=tenant["api_key"]) as client:
            job = client.jobs.create(
                name="train", schedule={"asap": True}, task="t", pool="gpu", requires=["cuda"]
            )
            items = wait_until(client.alerts.list, 30, what="an alert", not_yet=())
            assert [(a["pool"], a["runs"]) for a in items] == [("gpu", 1)]
            run = client.runs.get(job["first_run_id"])
            assert run["wait_reason"] == _reason("gpu")
        assert [a["tenant_id"] for a in admin.alerts.list()] == [tenant["id"]]
        assert admin.with_tenant(tenant["id"]).alerts.list() == items

        runner = CliRunner()
        env = {"CRONWHEEL_URL": running.url, "COLUMNS": "250"}
        shown = runner.invoke(cli_app, ["alerts"], env={**env, "CRONWHEEL_API_KEY": admin_key})
        assert shown.exit_code == 0, shown.output
        assert "unroutable_runs" in shown.stdout and "gpu" in shown.stdout
        assert _reason("gpu") in shown.stdout
        as_json = runner.invoke(
            cli_app, ["alerts", "--json"], env={**env, "CRONWHEEL_API_KEY": tenant["api_key"]}
        )
        assert as_json.exit_code == 0, as_json.output
        assert json.loads(as_json.stdout) == {"items": items}

        other = admin.tenants.create(f"quiet-{uuid.uuid4().hex[:6]}")
        quiet = runner.invoke(
            cli_app, ["alerts"], env={**env, "CRONWHEEL_API_KEY": other["api_key"]}
        )
        assert quiet.exit_code == 0, quiet.output
        assert "no active alerts" in quiet.stdout
        refused = runner.invoke(cli_app, ["alerts"], env={**env, "CRONWHEEL_API_KEY": "cw_nope"})
        assert refused.exit_code == 1
        assert "invalid API key" in refused.output
